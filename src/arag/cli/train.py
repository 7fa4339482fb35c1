"""``arag train``: train arag's own models from packaged weights (no hub downloads)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from arag.cli.common import build_progress, console, handle_errors, load_settings
from arag.cli.train_abstention import register as register_abstention
from arag.cli.train_answers import register as register_answers
from arag.cli.train_embedder import register as register_embedder
from arag.models.reranker import ModelCard

if TYPE_CHECKING:
    from arag.settings import Settings
    from arag.train.reranker import TrainConfig

train_app = typer.Typer(no_args_is_help=True)

# The options both trainers take alike (their defaults stay in each command).
TrainQuestions = Annotated[Path | None, typer.Option(help="QASPER training questions (default: train).")]
Layers = Annotated[int, typer.Option(help="MiniLM layers kept (1-6): fewer is faster.")]
Lr = Annotated[float, typer.Option(help="Learning rate of the MiniLM layers.")]
HeadLr = Annotated[float, typer.Option(help="Learning rate of the scoring head.")]
Seed = Annotated[int, typer.Option(help="Seed for sampling and initialisation.")]
TrainLimit = Annotated[int | None, typer.Option(help="Only the first N training questions.")]
ValLimit = Annotated[int | None, typer.Option(help="Only the first N calibration questions.")]
# Without --validation the models are chosen and calibrated on the train papers held out of training.
CALIBRATE_HELP = (
    "QASPER questions to choose and calibrate on (default: the questions of the train papers held out "
    "of training, one in ten; validation is then only reported on)."
)
Force = Annotated[bool, typer.Option("--force", help="Retrain even if a model is installed.")]


def _questions(path: Path | None, split: str) -> Path:
    """``path``, or else the packaged QASPER questions of ``split`` (train, validation)."""
    from arag.corpus.qasper_questions import default_questions_path

    return path or default_questions_path(split)


@train_app.command("reranker")
@handle_errors
def train_reranker_cmd(
    train: TrainQuestions = None,
    validation: Annotated[Path | None, typer.Option(help=CALIBRATE_HELP)] = None,
    layers: Layers = 6,
    max_length: Annotated[int, typer.Option(help="Word-pieces per (question, passage) pair.")] = 160,
    epochs: Annotated[float, typer.Option(help="Passes over the training questions.")] = 1.5,
    inference_max_length: Annotated[
        int, typer.Option(help="Word-pieces per pair at query time (shorter is faster; see bench reranker).")
    ] = 112,
    lr: Lr = 1e-4,
    head_lr: HeadLr = 3e-3,
    seed: Seed = 0,
    quantize: Annotated[
        str,
        typer.Option(
            help="auto (int8 if it holds calibration nDCG or fp32 is over 150 ms a list), int8 or fp32."
        ),
    ] = "auto",
    train_limit: TrainLimit = None,
    val_limit: ValLimit = None,
    force: Force = False,
    recalibrate: Annotated[
        bool,
        typer.Option(
            "--recalibrate", help="Refit the installed model's fusion weight and bars; no training."
        ),
    ] = False,
) -> None:
    """Fine-tune the cross-encoder reranker from the packaged MiniLM weights on QASPER train less the
    held-out papers, export it to ONNX, calibrate its fusion weight and bars on the held-out papers'
    questions and install it with a model card."""
    from arag.train.reranker_pipeline import train_reranker

    settings = load_settings()
    target = settings.reranker_dir
    if recalibrate:
        from arag.train.reranker_pipeline import recalibrate as refit

        card = refit(settings, validation, train_path=train, progress=build_progress)
        _report(card, f"recalibrated {target}")
        return
    trained = _train(
        train_reranker,
        settings,
        target,
        "reranker",
        force=force,
        paths=(train, validation),
        limits=(train_limit, val_limit),
        quantize=quantize,
        layers=layers,
        max_length=max_length,
        inference_max_length=inference_max_length,
        epochs=epochs,
        lr=lr,
        head_lr=head_lr,
        seed=seed,
    )
    if trained is None:
        return
    t = trained.training
    _report(
        trained,
        f"installed {trained.validation['chosen']} in {target}; trained {t['steps']} steps "
        f"({t['pairs']} pairs) in {t['seconds']:.0f} s; "
        f"whole run {trained.calibration['total_seconds']:.0f} s",
    )


def _train(
    trainer: Callable[..., ModelCard],
    settings: Settings,
    target: Path,
    what: str,
    *,
    force: bool,
    paths: tuple[Path | None, Path | None],
    limits: tuple[int | None, int | None],
    quantize: str,
    **fields: Any,
) -> ModelCard | None:
    """Both ``arag train`` runs: None when a model is installed in ``target`` and not ``force``d, else
    the card ``trainer`` installs, trained on ``paths`` (train, calibration; default QASPER train and
    its held-out papers) with the first ``limits`` questions of each."""
    from arag.models.onnx_files import CARD_FILE

    if (target / CARD_FILE).is_file() and not force:
        console.print(f"a trained {what} is installed in {target}: --force retrains it")
        return None
    return trainer(
        settings,
        _train_config(quantize, **fields),
        train_path=_questions(paths[0], "train"),
        val_path=paths[1],
        train_limit=limits[0],
        val_limit=limits[1],
        progress=build_progress,
    )


def _train_config(quantize: str, **fields: Any) -> TrainConfig:
    """The training choices of both ``arag train`` commands, ``--quantize`` checked first."""
    from arag.errors import InputError
    from arag.train.reranker import TrainConfig

    if quantize not in ("auto", "int8", "fp32"):
        raise InputError(f"unknown --quantize {quantize!r}", where="--quantize", fix="use auto, int8 or fp32")
    return TrainConfig(quantize=quantize, **fields)  # type: ignore[arg-type]


def _report(card: ModelCard, headline: str) -> None:
    v = card.validation
    title = f"{card.model_id}: calibrated on {card.data.get('validation', 'QASPER validation')}"
    table = Table("", "Recall@10", "nDCG@10", "MRR@10", title=title)
    for name in ("fused_order", "fp32", "int8", "final"):
        if name in v:
            m = v[name]
            table.add_row(name, f"{m['recall@10']:.3f}", f"{m['ndcg@10']:.3f}", f"{m['mrr@10']:.3f}")
    console.print(table)
    bars = f"bars lower {card.bars.lower:.3f} / upper {card.bars.upper:.3f}" if card.bars else "no bars"
    ms = v.get("median_ms_per_list", {}).get(v.get("chosen", ""), float("nan"))
    console.print(
        f"{headline}; {ms:.1f} ms per candidate list; fusion weight {card.fusion_weight:.1f} "
        f"(final nDCG@10 two-fold {v.get('final_ndcg@10_two_fold', float('nan')):.3f}); {bars}",
        soft_wrap=True,
    )
    kept = json.dumps(v.get("kept_set", {}))
    console.print("kept set on the calibration questions: " + kept, soft_wrap=True)


@train_app.command("support")
@handle_errors
def train_support_cmd(
    train: TrainQuestions = None,
    validation: Annotated[Path | None, typer.Option(help=CALIBRATE_HELP)] = None,
    layers: Layers = 2,
    max_length: Annotated[int, typer.Option(help="Word-pieces per (claim, passage) pair.")] = 192,
    epochs: Annotated[float, typer.Option(help="Passes over the training answers.")] = 1.0,
    lr: Lr = 1e-4,
    head_lr: HeadLr = 3e-3,
    seed: Seed = 0,
    threads: Annotated[int, typer.Option(help="CPU threads for training and scoring.")] = 2,
    quantize: Annotated[
        str, typer.Option(help="auto (int8 if it holds calibration AUC), int8 or fp32.")
    ] = "auto",
    train_limit: TrainLimit = None,
    val_limit: ValLimit = None,
    force: Force = False,
    recalibrate: Annotated[
        bool,
        typer.Option(
            "--recalibrate", help="Refit the installed model's combined (model + lexical) calibration only."
        ),
    ] = False,
    lexical: Annotated[
        bool,
        typer.Option(
            "--lexical",
            help="Only measure the lexical scorer on the calibration pairs (no model, no training) and "
            "print its best-F1 threshold, the value of ARAG_AGENT__SUPPORT_THRESHOLD.",
        ),
    ] = False,
) -> None:
    """Fine-tune the claim verifier's cross-encoder (does a passage support a claim?) from the packaged
    MiniLM weights on QASPER train less the held-out papers, measure it on the held-out papers'
    pairs (alone, and combined with the lexical overlap) and install it with a model card."""
    from arag.train.support_pipeline import recalibrate_support, train_support

    settings = load_settings()
    target = settings.support_dir
    if lexical:
        from arag.train.support_pipeline import lexical_calibration

        _report_lexical(
            lexical_calibration(
                settings,
                validation,
                train_path=train,
                val_limit=val_limit,
                seed=seed,
                progress=build_progress,
            )
        )
        return
    if recalibrate:
        card = recalibrate_support(
            settings, validation, train_path=train, val_limit=val_limit, progress=build_progress
        )
        _report_combined(card)
        return
    trained = _train(
        train_support,
        settings,
        target,
        "support model",
        force=force,
        paths=(train, validation),
        limits=(train_limit, val_limit),
        quantize=quantize,
        layers=layers,
        max_length=max_length,
        epochs=epochs,
        lr=lr,
        head_lr=head_lr,
        seed=seed,
        threads=threads,
    )
    if trained is not None:
        _report_support(trained, target)
        _report_combined(trained)


def _report_lexical(fig: dict[str, Any]) -> None:
    best, now = fig["best"], fig["at_setting"]
    pairs = f"{fig['pairs']['supported']} supported / {fig['pairs']['unsupported']} unsupported pairs"
    table = Table("lexical", "AUC", "Precision", "Recall", "F1", "F1 two-fold", "Threshold")
    table.title = f"{fig['fit_on']}: {fig['questions']} questions, {pairs}"
    table.add_row(
        "best F1", f"{best['auc']:.3f}", f"{best['precision']:.3f}", f"{best['recall']:.3f}",
        f"{best['f1']:.3f}", "" if best["f1_two_fold"] is None else f"{best['f1_two_fold']:.3f}",
        f"{best['threshold']:.3f}",
    )  # fmt: skip
    table.add_row(
        "setting", "", f"{now['precision']:.3f}", f"{now['recall']:.3f}", f"{now['f1']:.3f}", "",
        f"{now['threshold']:.3f}",
    )  # fmt: skip
    console.print(table)


def _report_combined(card: ModelCard) -> None:
    c = card.calibration.get("combined")
    if not c:
        return
    t = c["two_fold"]
    console.print(
        f"combined with the lexical overlap: two-fold AUC {t['auc']:.3f} (lexical {c['auc_lexical']:.3f}, "
        f"model {c['auc_model']:.3f}); at threshold {c['threshold']:.3f}: precision {t['precision']:.3f}, "
        f"recall {t['recall']:.3f}, F1 {t['f1']:.3f}",
        soft_wrap=True,
    )


def _report_support(card: ModelCard, target: Path) -> None:
    v, t, c = card.validation, card.training, card.calibration
    pairs = f"{v['pairs']['supported']} supported / {v['pairs']['unsupported']} unsupported pairs"
    table = Table(
        "", "AUC", "Precision", "Recall", "F1", "F1 two-fold", "Threshold",
        title=f"{card.model_id}: {card.data.get('validation', 'QASPER validation')}, {pairs}",
    )  # fmt: skip
    # answer_only: the chosen model with the answer alone as the claim (closer to what the verifier
    # checks); lexical: the baseline scorer at its best threshold and at its setting.
    for name in ("fp32", "int8", "answer_only", "lexical", "lexical_at_default"):
        m = v[name]
        two = m.get("f1_two_fold")
        table.add_row(
            name + (" (installed)" if name == v["chosen"] else ""),
            f"{m['auc']:.3f}" if "auc" in m else "",
            f"{m['precision']:.3f}",
            f"{m['recall']:.3f}",
            f"{m['f1']:.3f}",
            "" if two is None else f"{two:.3f}",
            f"{m['threshold']:.3f}",
        )
    console.print(table)
    console.print(
        f"installed {v['chosen']} in {target}; trained {t['steps']} steps ({t['pairs']} pairs) in "
        f"{t['seconds']:.0f} s; whole run {c['total_seconds']:.0f} s; support threshold "
        f"{c['threshold']:.3f} (logit {c['logit_threshold']:.3f}); {v['ms_per_pair'][v['chosen']]:.1f} ms "
        "per pair; unsupported pairs accepted: " + json.dumps(v[v["chosen"]]["accepted_unsupported"]),
        soft_wrap=True,
    )


register_answers(train_app)
register_abstention(train_app)
register_embedder(train_app)
