"""``arag train abstention``: the calibrated abstention rule, fit on the agent's own answers to the
QASPER train papers held out of every training (see :mod:`arag.train.abstention_fit`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from arag.cli.common import console, handle_errors, load_settings


def register(app: typer.Typer) -> None:
    """Add ``abstention`` to the ``arag train`` group."""
    app.command("abstention")(train_abstention_cmd)


def _share(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}"


@handle_errors
def train_abstention_cmd(
    traces: Annotated[
        Path,
        typer.Option(
            help="Traces of `arag eval answers --questions <train file> --held-out --configs full "
            "--traces FILE`, answered with ARAG_ABSTENTION__PROVIDER=none."
        ),
    ],
    questions: Annotated[
        Path | None, typer.Option(help="The questions file of those traces (default: QASPER train).")
    ] = None,
) -> None:
    """Fit when to decline an answer (one logistic decision over its signals, the threshold that
    maximises the official Answer-F1, cross-validated) and store it; a rule that gains under one
    right answer's worth is stored off. Validation is never fit on."""
    from arag.corpus.qasper_questions import HELD_OUT_NAME, default_questions_path, held_out_paper
    from arag.eval.answers import load_answer_questions
    from arag.models.abstention import save_rule
    from arag.models.reranker import settings_scale
    from arag.train.abstention_fit import fit_rule, load_cases, traced_scale

    settings = load_settings()
    qpath = questions or default_questions_path("train")
    qs, _ = load_answer_questions(qpath)
    cases = load_cases(traces, qs)
    paper = {q.question_id: q.paper_id for q in qs}
    # Named as the split it is: the held-out train papers only when every traced question is of one.
    held = all(held_out_paper(paper[c.question_id]) for c in cases)
    split = f"{qpath.name}: {HELD_OUT_NAME}" if held else qpath.name
    installed = settings_scale(settings)
    scale = traced_scale(traces, qs)
    if scale is None:
        scale = installed
        console.print(
            "[yellow]note:[/] the traces do not name the reranker they were answered with (an older "
            f"arag wrote them): the rule is recorded as fit with the one in use, {scale}",
            highlight=False,
            soft_wrap=True,
        )
    elif scale != installed:
        console.print(
            f"[yellow]warning:[/] the traces were answered with {scale}, and the reranker in use is "
            f"{installed}: a rule that is on will be refused until that reranker is back",
            highlight=False,
            soft_wrap=True,
        )
    rule = fit_rule(cases, fit_on=f"{split} ({traces.name})", reranker=scale)
    save_rule(settings.abstention_path, rule)
    f = rule.fit
    table = Table(
        "", "Answer-F1", "declined (unanswerable)", "answered (answerable)",
        title=f"{f['questions']} questions ({f['unanswerable']} unanswerable) of {qpath.name}, "
        "cross-validated by question (5 folds; the rule's row: each fold's model and threshold chosen on "
        "the other folds)",
    )  # fmt: skip
    table.add_row(
        "as answered", f"{f['answer_f1_before']:.3f}", _share(f["before"]["declined_unanswerable"]),
        _share(f["before"]["answered_answerable"]),
    )  # fmt: skip
    table.add_row(
        "with the rule", f"{f['answer_f1_after_cv']:.3f}", _share(f["after_cv"]["declined_unanswerable"]),
        _share(f["after_cv"]["answered_answerable"]),
    )  # fmt: skip
    console.print(table)
    state = (
        f"on: declines at p >= {rule.threshold:.3f}"
        if rule.active
        else f"off: decided fold by fold, it gains {f['gain_answers']:.2f} right answers' worth "
        f"(at least {f['min_gain_answers']:.0f} needed; {f['gain_answers_best_threshold']:.2f} at the best "
        "threshold over every fold, which lets each question help choose its own decision)"
    )
    console.print(
        f"AUC of the decline probability for unanswerable questions (cross-validated): "
        f"{f['auc_unanswerable_cv']}; the rule is {state}; stored in {settings.abstention_path}, for "
        f"answers ranked by {scale}",
        soft_wrap=True,
        highlight=False,
    )
