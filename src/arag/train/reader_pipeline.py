"""The whole ``arag train answers`` run: examples from QASPER train (papers held out for fitting
excluded), train the reader, export fp32 and int8 ONNX, check the export against PyTorch, measure both
on the held-out papers' examples, keep int8 unless it costs span F1, install with a model card.

The specialists' thresholds are fit afterwards (``arag train answers --calibrate``, in
:mod:`arag.train.reader_calibrate`) from the agent's answers to held-out questions; until then the
card has none and the specialists leave every answer as it is."""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from arag.corpus.qasper import load_qasper
from arag.corpus.qasper_questions import held_out_paper, read_question_items
from arag.errors import ModelError
from arag.eval.qasper_metrics import token_f1_score
from arag.models.onnx_files import file_sha256
from arag.models.reader import CARD_FILE, CLASSES, MODEL_FILE, NO, NONE, YES, OnnxReader, ReaderCard
from arag.settings import Settings
from arag.train.reader import ReaderConfig, export_reader, torch_outputs, train_reader_net
from arag.train.reader_data import ReaderExample, build_examples
from arag.train.reranker import BASE_MODEL, export_variants, require_torch
from arag.train.trainer import ProgressFactory, install_model, quiet

WHERE = "arag train answers"


def split_items(items: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training questions, held-out questions) by paper (:func:`held_out_paper`)."""
    train = [i for i in items if not held_out_paper(i["paper_id"])]
    held = [i for i in items if held_out_paper(i["paper_id"])]
    return train, held


def reader_metrics(
    model: OnnxReader, examples: Sequence[ReaderExample], advance: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """On labelled pairs: class accuracy, answerable-vs-none accuracy, span token F1 on pairs with a
    gold span, yes/no accuracy on yes/no pairs, and median ms per pair (one pair a call)."""
    right = answerable_right = 0
    span_f1: list[float] = []
    yes_no_right: list[float] = []
    ms: list[float] = []
    for ex in examples:
        t0 = time.perf_counter()
        r = model.read(ex.question, [ex.passage])[0]
        ms.append(1000 * (time.perf_counter() - t0))
        if advance is not None:
            advance(1)
        pred = int(np.argmax(r.probs))
        right += pred == ex.label
        answerable_right += (pred == NONE) == (ex.label == NONE)
        if ex.span is not None:
            span_f1.append(token_f1_score(r.span, ex.passage[ex.span[0] : ex.span[1]]))
        if ex.label in (YES, NO):
            yes_no_right.append(float((r.probs[YES] >= r.probs[NO]) == (ex.label == YES)))
    n = max(1, len(examples))
    return {
        "pairs": len(examples),
        "class_accuracy": round(right / n, 4),
        "answerable_accuracy": round(answerable_right / n, 4),
        "span_f1": round(float(np.mean(span_f1)), 4) if span_f1 else None,
        "span_pairs": len(span_f1),
        "yes_no_accuracy": round(float(np.mean(yes_no_right)), 4) if yes_no_right else None,
        "yes_no_pairs": len(yes_no_right),
        "median_ms_per_pair": round(statistics.median(ms), 2) if ms else None,
    }


def class_counts(examples: Sequence[ReaderExample]) -> dict[str, int]:
    return {c: sum(ex.label == i for ex in examples) for i, c in enumerate(CLASSES)}


def train_answers(
    settings: Settings,
    cfg: ReaderConfig,
    *,
    questions_path: Path,
    corpus_path: Path,
    limit: int | None = None,
    progress: ProgressFactory = quiet,
) -> ReaderCard:
    """Train, export, check, choose and install the reader into ``settings.reader_dir``."""
    require_torch()
    t_start = time.perf_counter()
    items = read_question_items(questions_path)
    train_items, held_items = split_items(items)
    if limit is not None:
        train_items, held_items = train_items[:limit], held_items[: max(1, limit // 4)]
    wanted = sorted({i["paper_id"] for i in train_items + held_items})
    papers, _ = load_qasper(corpus_path, paper_ids=wanted)
    by_id = {p.id: p for p in papers}
    examples = build_examples(train_items, by_id, seed=cfg.seed, negatives=cfg.negatives)
    held = build_examples(held_items, by_id, seed=cfg.seed + 1, negatives=cfg.negatives)
    if not held:
        raise ModelError(
            "no held-out examples to measure the reader on",
            where=WHERE,
            fix="pass more questions (--limit) or the full QASPER train file",
        )
    with progress("training", "steps") as bar:
        net, stats = train_reader_net(examples, cfg, on_start=bar.start, on_step=bar.advance)

    out_dir = settings.reader_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=".reader-"))
    try:
        fp32, int8, draft = export_variants(
            lambda path: export_reader(net, path),
            ReaderCard,
            layers=cfg.layers,
            max_length=cfg.max_length,
            seed=cfg.seed,
            work=work,
        )
        models = {
            name: OnnxReader(work, threads=cfg.threads, card=draft, model_file=path)
            for name, path in (("fp32", fp32), ("int8", int8))
        }
        check_reader_export(net, models["fp32"], held[0], cfg.max_length, where=fp32)
        figures: dict[str, dict[str, Any]] = {}
        for name, model in models.items():
            with progress(f"held-out pairs ({name})", "pairs") as bar:
                bar.start(len(held))
                figures[name] = reader_metrics(model, held, bar.advance)
        drop = (figures["fp32"]["span_f1"] or 0.0) - (figures["int8"]["span_f1"] or 0.0)
        use_int8 = cfg.quantize == "int8" or (cfg.quantize == "auto" and drop <= cfg.max_int8_drop)
        chosen = "int8" if use_int8 else "fp32"
        shutil.copyfile(int8 if use_int8 else fp32, work / MODEL_FILE)
        fp32.unlink()
        int8.unlink()
        digest = file_sha256(work / MODEL_FILE)
        card = ReaderCard(
            model_id=f"minilm-l{cfg.layers}-qasper-reader-{digest[:8]}",
            base_model=BASE_MODEL,
            layers=cfg.layers,
            max_length=cfg.max_length,
            quantized=use_int8,
            onnx_sha256=digest,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            seed=cfg.seed,
            data={
                "questions": questions_path.name,
                "train_questions": len(train_items),
                "held_out_questions": len(held_items),
                "held_out": "QASPER train papers whose sha1(id) % 10 == 0 (thresholds are fit on them)",
                "train_pairs": class_counts(examples),
                "held_out_pairs": class_counts(held),
            },
            training={**cfg.model_dump(), **stats.model_dump(), "total_seconds": 0.0},
            held_out={"fp32": figures["fp32"], "int8": figures["int8"], "chosen": chosen},
        )
        card.training["total_seconds"] = round(time.perf_counter() - t_start, 1)
        install_model(work, out_dir, card)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return card


def check_reader_export(
    net: Any, model: OnnxReader, ex: ReaderExample, max_length: int, *, where: Path
) -> None:
    """The ONNX export's class logits must match PyTorch's on one held-out pair."""
    from arag.models.reader import as_arrays, encode_reader_pairs

    ref = torch_outputs(net, ex.question, [ex.passage], max_length)[2]
    encs = encode_reader_pairs(model._tok, ex.question, [ex.passage])
    got = model._session.run(None, as_arrays(encs))[2]
    if not np.allclose(ref, got, atol=1e-3):
        raise ModelError(
            f"the ONNX export disagrees with PyTorch (max diff {float(np.max(np.abs(ref - got))):.4f})",
            where=str(where),
            fix="report this; retrain with `arag train answers --force`",
        )


def installed(settings: Settings) -> bool:
    return (settings.reader_dir / CARD_FILE).is_file()
