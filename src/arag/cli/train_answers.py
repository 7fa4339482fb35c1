"""``arag train answers``: the answer reader (span, yes/no, answerable) and, with ``--calibrate``,
the answer specialists' thresholds fit on the agent's answers to held-out QASPER train questions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from arag.cli.common import build_progress, console, handle_errors, load_settings


def register(app: typer.Typer) -> None:
    """Add ``answers`` to the ``arag train`` group."""
    app.command("answers")(train_answers_cmd)


def _train_file(questions: Path | None) -> Path:
    from arag.corpus.qasper_questions import default_questions_path

    return questions or default_questions_path("train")


@handle_errors
def train_answers_cmd(
    questions: Annotated[
        Path | None, typer.Option(help="QASPER training questions (default: train).")
    ] = None,
    layers: Annotated[int, typer.Option(help="MiniLM layers kept (1-6): fewer is faster.")] = 4,
    max_length: Annotated[int, typer.Option(help="Word-pieces per (question, passage) pair.")] = 256,
    epochs: Annotated[float, typer.Option(help="Passes over the training pairs.")] = 2.0,
    batch: Annotated[int, typer.Option(help="Pairs per step.")] = 16,
    lr: Annotated[float, typer.Option(help="Learning rate of the MiniLM layers.")] = 1e-4,
    seed: Annotated[int, typer.Option(help="Seed for sampling and initialisation.")] = 0,
    threads: Annotated[int, typer.Option(help="CPU threads for training and reading.")] = 2,
    quantize: Annotated[
        str, typer.Option(help="auto (int8 if it holds held-out span F1), int8 or fp32.")
    ] = "auto",
    limit: Annotated[int | None, typer.Option(help="Only the first N training questions.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Retrain even if a reader is installed.")] = False,
    calibrate: Annotated[
        Path | None,
        typer.Option(
            help="Fit the specialists' thresholds on these `arag eval answers --held-out --traces` "
            "traces (answers to held-out train questions, reader off) instead of training."
        ),
    ] = None,
) -> None:
    """Train the answer reader from the packaged MiniLM weights on QASPER train (one paper in ten held
    out), or fit its specialists' thresholds on held-out answers (--calibrate). Validation is never
    fit on."""
    from arag.errors import InputError
    from arag.models.reader import CARD_FILE
    from arag.train.reader import ReaderConfig
    from arag.train.reader_pipeline import train_answers

    settings = load_settings()
    target = settings.reader_dir
    if calibrate is not None:
        _calibrate(calibrate, _train_file(questions))
        return
    if (target / CARD_FILE).is_file() and not force:
        console.print(f"an answer reader is installed in {target}: --force retrains it")
        return
    if quantize not in ("auto", "int8", "fp32"):
        raise InputError(f"unknown --quantize {quantize!r}", where="--quantize", fix="use auto, int8 or fp32")
    cfg = ReaderConfig(
        layers=layers,
        max_length=max_length,
        epochs=epochs,
        batch=batch,
        lr=lr,
        seed=seed,
        threads=threads,
        quantize=quantize,  # type: ignore[arg-type]
    )
    card = train_answers(
        settings,
        cfg,
        questions_path=_train_file(questions),
        corpus_path=settings.corpus.qasper_path,
        limit=limit,
        progress=build_progress,
    )
    table = Table(
        "", "class acc", "answerable acc", "span F1", "yes/no acc", "ms/pair",
        title=f"{card.model_id}: held-out QASPER train papers ({card.held_out['fp32']['pairs']} pairs)",
    )  # fmt: skip
    for name in ("fp32", "int8"):
        m = card.held_out[name]
        table.add_row(
            name + (" (installed)" if name == card.held_out["chosen"] else ""),
            f"{m['class_accuracy']:.3f}",
            f"{m['answerable_accuracy']:.3f}",
            "" if m["span_f1"] is None else f"{m['span_f1']:.3f}",
            "" if m["yes_no_accuracy"] is None else f"{m['yes_no_accuracy']:.3f}",
            f"{m['median_ms_per_pair']:.1f}",
        )
    console.print(table)
    t = card.training
    console.print(
        f"installed in {target}; {t['steps']} steps ({t['examples']} pairs) in {t['seconds']:.0f} s, "
        f"whole run {t['total_seconds']:.0f} s. Next: fit its thresholds with `arag eval answers "
        "--questions <train file> --held-out --configs full --traces FILE` (reader off), then "
        "`arag train answers --calibrate FILE`.",
        soft_wrap=True,
    )


def _calibrate(traces: Path, questions_path: Path) -> None:
    from arag.eval.answers import load_answer_questions
    from arag.library.manage import open_retrieval
    from arag.models.reader import OnnxReader, replace_reader_card
    from arag.train.reader_calibrate import fit_thresholds, load_cases, thresholds_dict

    settings = load_settings()
    reader = OnnxReader(settings.reader_dir, threads=settings.reader.threads)
    questions, _ = load_answer_questions(questions_path)
    retrieval = open_retrieval(settings)
    try:
        with build_progress("reading the traced passages", unit="questions") as bar:
            bar.start(1)
            cases = load_cases(traces, questions, retrieval.store, reader)
            bar.advance(1)
    finally:
        retrieval.close()
    th, figures = fit_thresholds(cases)
    card = reader.card.model_copy(
        update={
            "thresholds": thresholds_dict(th),
            "held_out": {**reader.card.held_out, "fit": {**figures, "traces": traces.name}},
        }
    )
    replace_reader_card(settings.reader_dir, card)
    before, after = figures["answer_f1_before"], figures["answer_f1_after"]
    console.print(
        f"fit on {figures['questions']} held-out train questions: Answer-F1 {before:.3f} -> {after:.3f}; "
        f"actions {json.dumps(figures['actions'])}; thresholds {json.dumps(thresholds_dict(th))}",
        soft_wrap=True,
    )
