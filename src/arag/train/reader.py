"""The answer reader's network and its training (``arag train answers``).

Start: the packaged all-MiniLM-L6-v2 weights (as the reranker), cut to ``layers`` layers. Two heads:
a start/end logit per word-piece (the span), and a class head over the mean-pooled pair (what the
passage holds: none, span, yes, no, free). The loss is the class cross-entropy plus, for a passage
holding a gold span, the mean of the start and end cross-entropies over the passage's word-pieces.
Fixed seed, fixed data order, fixed thread count, pinned kernels (:mod:`arag.train.kernels`): the
same command gives the same weights."""

from __future__ import annotations

import random
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import BaseModel

from arag.errors import ModelError
from arag.models.reader import (
    CLASSES,
    as_arrays,
    cut_question,
    encode_reader_pairs,
    load_reader_tokenizer,
    passage_mask,
)
from arag.train.kernels import kernels_in_use
from arag.train.reader_data import ReaderExample
from arag.train.reranker import OPSET, base_model_path, make_optimizer, optimizer_step, require_torch

if TYPE_CHECKING:
    import torch
    from tokenizers import Encoding, Tokenizer


class ReaderConfig(BaseModel):
    """Training choices (the defaults are what the shipped command's model card records)."""

    layers: int = 4
    max_length: int = 256
    negatives: int = 2
    batch: int = 16
    epochs: float = 2.0
    lr: float = 1e-4
    head_lr: float = 1e-3
    warmup: float = 0.1
    seed: int = 0
    threads: int = 2
    quantize: Literal["auto", "int8", "fp32"] = "auto"
    # int8 is kept when it costs at most this much held-out span F1.
    max_int8_drop: float = 0.01


class ReaderStats(BaseModel):
    steps: int
    examples: int
    seconds: float
    pairs_per_s: float
    final_loss: float
    # avx2: the portable kernels (the same file on every Intel CPU with AVX2); native-*: this CPU's own.
    kernels: str = ""


def token_span(enc: Encoding, start: int, end: int) -> tuple[int, int] | None:
    """The first and last passage word-pieces overlapping characters [start, end); None when the
    span was cut off by truncation or covers no word-piece."""
    allowed = passage_mask(enc)
    idx = [int(i) for i in np.flatnonzero(allowed) if enc.offsets[i][1] > start and enc.offsets[i][0] < end]
    if not idx:
        return None
    last_kept = int(np.flatnonzero(allowed)[-1])
    if enc.offsets[last_kept][1] < end:  # the span runs past what the pair kept
        return None
    return idx[0], idx[-1]


def build_reader_net(layers: int) -> torch.nn.Module:
    """MiniLM's embeddings and first ``layers`` layers with a span head and a class head."""
    import torch
    from transformers import AutoModel

    class ReaderNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()  # the unused pooler weights are expected
            bert = AutoModel.from_pretrained(str(base_model_path()), add_pooling_layer=False)
            if not 1 <= layers <= len(bert.encoder.layer):
                raise ValueError(f"layers must be 1..{len(bert.encoder.layer)}, got {layers}")
            bert.encoder.layer = bert.encoder.layer[:layers]
            bert.config.num_hidden_layers = layers
            self.bert = bert
            self.span = torch.nn.Linear(bert.config.hidden_size, 2)
            self.cls = torch.nn.Linear(bert.config.hidden_size, len(CLASSES))

        def forward(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            hidden = self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            se = self.span(hidden)
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            return se[..., 0], se[..., 1], self.cls(pooled)

    return ReaderNet()


def batch_tensors(
    tok: Tokenizer, batch: Sequence[ReaderExample]
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs, class labels, start/end targets (-1: no span), and the passage mask of a batch."""
    import torch

    encs = tok.encode_batch([(cut_question(tok, ex.question), ex.passage) for ex in batch])
    arrays = as_arrays(encs)
    starts, ends = [], []
    for enc, ex in zip(encs, batch, strict=True):
        ts = token_span(enc, *ex.span) if ex.span is not None else None
        starts.append(ts[0] if ts else -1)
        ends.append(ts[1] if ts else -1)
    allowed = np.stack([passage_mask(e) for e in encs])
    inputs = {k: torch.from_numpy(v) for k, v in arrays.items()}
    return (
        inputs,
        torch.tensor([ex.label for ex in batch], dtype=torch.long),
        torch.tensor(starts, dtype=torch.long),
        torch.tensor(ends, dtype=torch.long),
        torch.from_numpy(allowed),
    )


def reader_loss(
    start: torch.Tensor,
    end: torch.Tensor,
    cls: torch.Tensor,
    labels: torch.Tensor,
    t_start: torch.Tensor,
    t_end: torch.Tensor,
    allowed: torch.Tensor,
) -> torch.Tensor:
    """Class cross-entropy plus the span cross-entropies of the pairs that hold a gold span."""
    import torch
    import torch.nn.functional as F

    loss = F.cross_entropy(cls, labels)
    has = t_start >= 0
    if bool(has.any()):
        neg = torch.finfo(start.dtype).min
        s = start.masked_fill(~allowed, neg)[has]
        e = end.masked_fill(~allowed, neg)[has]
        loss = loss + 0.5 * (F.cross_entropy(s, t_start[has]) + F.cross_entropy(e, t_end[has]))
    return loss


def train_reader_net(
    examples: Sequence[ReaderExample],
    cfg: ReaderConfig,
    *,
    on_start: Callable[[int], None] | None = None,
    on_step: Callable[[int], None] | None = None,
) -> tuple[torch.nn.Module, ReaderStats]:
    """Fine-tune the reader (see the module doc); returns it in eval mode."""
    require_torch()
    import torch

    if not examples:
        raise ModelError(
            "no training examples for the answer reader",
            where="arag train answers",
            fix="check that the QASPER train questions and the corpus are in ../shared",
        )
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    net = build_reader_net(cfg.layers)
    tok = load_reader_tokenizer(cfg.max_length)
    epochs = max(1, int(np.ceil(cfg.epochs)))
    plan: list[ReaderExample] = []
    for e in range(epochs):
        order = list(examples)
        random.Random(f"{cfg.seed}:{e}").shuffle(order)
        plan += order
    plan = plan[: int(round(len(plan) * cfg.epochs / epochs))]
    steps = (len(plan) + cfg.batch - 1) // cfg.batch
    opt, sched = make_optimizer(net, ["span", "cls"], cfg.lr, cfg.head_lr, steps, cfg.warmup)
    if on_start:
        on_start(steps)
    net.train()
    t0 = time.perf_counter()
    losses: list[float] = []
    for step in range(steps):
        batch = plan[step * cfg.batch : (step + 1) * cfg.batch]
        inputs, labels, ts, te, allowed = batch_tensors(tok, batch)
        start, end, cls = net(**inputs)
        loss = reader_loss(start, end, cls, labels, ts, te, allowed)
        losses.append(optimizer_step(net, opt, sched, loss))
        if on_step:
            on_step(1)
    seconds = time.perf_counter() - t0
    net.eval()
    return net, ReaderStats(
        steps=steps,
        examples=len(plan),
        seconds=round(seconds, 1),
        pairs_per_s=round(len(plan) / seconds, 2) if seconds else 0.0,
        final_loss=round(float(np.mean(losses[-50:])), 4),
        kernels=kernels_in_use(),
    )


def export_reader(net: torch.nn.Module, path: Path) -> None:
    """Export to ONNX with dynamic batch and sequence axes (three outputs)."""
    import torch

    ids = torch.ones((2, 16), dtype=torch.long)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0  # a padded row, so the graph carries the masking path
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net,
            (ids, mask, types),
            str(path),
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["start_logits", "end_logits", "class_logits"],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "seq"},
                "attention_mask": {0: "batch", 1: "seq"},
                "token_type_ids": {0: "batch", 1: "seq"},
                "start_logits": {0: "batch", 1: "seq"},
                "end_logits": {0: "batch", 1: "seq"},
                "class_logits": {0: "batch"},
            },
            opset_version=OPSET,
            dynamo=False,
        )


def torch_outputs(
    net: torch.nn.Module, question: str, passages: Sequence[str], max_length: int
) -> list[np.ndarray]:
    """The PyTorch model's three outputs (the reference the ONNX export is checked against)."""
    import torch

    tok = load_reader_tokenizer(max_length)
    encs = encode_reader_pairs(tok, question, passages)
    with torch.no_grad():
        out = net(**{k: torch.from_numpy(v) for k, v in as_arrays(encs).items()})
    return [o.numpy() for o in out]
