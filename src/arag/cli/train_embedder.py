"""``arag train embedder``: the bi-encoder fine-tuned on QASPER train's questions and evidence, measured
against the library's own embedder on the held-out train papers' questions (see
:mod:`arag.train.embedder_pipeline`). The product uses it only where ARAG_EMBEDDING__PATH names it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from arag.cli.common import build_progress, console, handle_errors, load_settings


def register(app: typer.Typer) -> None:
    """Add ``embedder`` to the ``arag train`` group."""
    app.command("embedder")(train_embedder_cmd)


@handle_errors
def train_embedder_cmd(
    questions: Annotated[
        Path | None, typer.Option(help="QASPER training questions (default: train).")
    ] = None,
    epochs: Annotated[float, typer.Option(help="Passes over the training questions.")] = 1.0,
    batch: Annotated[
        int, typer.Option(help="Questions per step (each one's chunks are the others' negatives).")
    ] = 32,
    lr: Annotated[float, typer.Option(help="Learning rate.")] = 2e-5,
    seed: Annotated[int, typer.Option(help="Seed for sampling and initialisation.")] = 0,
    threads: Annotated[int, typer.Option(help="CPU threads for training.")] = 2,
    train_limit: Annotated[int | None, typer.Option(help="Only the first N training questions.")] = None,
    val_limit: Annotated[int | None, typer.Option(help="Only the first N held-out questions.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Retrain even if a model is installed.")] = False,
) -> None:
    """Fine-tune the MiniLM bi-encoder on QASPER train less the held-out papers, re-quantise it to
    int8 like the default, compare it with the library's embedder on the held-out papers' questions
    and install it in <data dir>/models/embedder-trained. Searches use it only once
    ARAG_EMBEDDING__PATH names that folder and the library is rebuilt with it."""
    from arag.corpus.qasper_questions import default_questions_path
    from arag.models.onnx_files import CARD_FILE
    from arag.train.embedder import EmbedderTrainConfig
    from arag.train.embedder_pipeline import train_embedder

    settings = load_settings()
    target = settings.trained_embedder_dir
    if (target / CARD_FILE).is_file() and not force:
        console.print(f"a trained embedder is installed in {target}: --force retrains it")
        return
    cfg = EmbedderTrainConfig(epochs=epochs, batch=batch, lr=lr, seed=seed, threads=threads)
    card = train_embedder(
        settings,
        cfg,
        train_path=questions or default_questions_path("train"),
        train_limit=train_limit,
        val_limit=val_limit,
        progress=build_progress,
    )
    v = card.validation
    table = Table(
        "", "nDCG@10", "Recall@10", "ms per text",
        title=f"{card.data['validation_questions']} questions of {card.data['validation']}: "
        "each question's paper's chunks ranked by cosine",
    )  # fmt: skip
    base = v["library_embedder"]
    table.add_row(
        f"library's embedder ({base['model_id']})", f"{base['ndcg@10']:.3f}", f"{base['recall@10']:.3f}", ""
    )
    for name in ("fp32", "int8"):
        r = v[name]
        table.add_row(
            f"trained, {name}" + (" (installed)" if v["chosen"] == name else ""),
            f"{r['ndcg@10']:.3f}", f"{r['recall@10']:.3f}", f"{r['median_ms_per_text']:.1f}",
        )  # fmt: skip
    console.print(table)
    t = card.training
    console.print(
        f"{card.model_id}: {t['steps']} steps ({t['examples']} questions) in {t['seconds']:.0f} s, loss "
        f"{t['first_loss']:.3f} -> {t['final_loss']:.3f}; installed in {target}. To search with it: "
        f"ARAG_EMBEDDING__PATH={target} arag library build --rebuild",
        soft_wrap=True,
        highlight=False,
    )
