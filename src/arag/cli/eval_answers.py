"""``arag eval answers``: answer quality on QASPER for several configurations in one run, over the same
questions: the naive RAG baseline, the agent without an LLM (extractive), and the agent with the LLM
(full; without the verifier; one retrieval pass). Metric definitions: ``arag.eval.answers``."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from arag.cli.common import build_progress, console, handle_errors, load_settings
from arag.errors import AragError, InputError
from arag.records import Answer, SearchFilter

if TYPE_CHECKING:
    from arag.eval.answers import ConfigReport
    from arag.eval.rule_effect import RuleEffect
    from arag.llm.base import LLM
    from arag.settings import Settings

CONFIGS = ("naive", "extractive", "full", "no-verifier", "one-pass")
NEEDS_LLM = frozenset({"naive", "full", "no-verifier", "one-pass"})
PROVIDERS = ("llama-cpp", "openai", "extractive")
Runner = Callable[[str, SearchFilter | None], Answer]


def register(app: typer.Typer) -> None:
    """Add ``answers`` to the ``arag eval`` group."""
    app.command("answers")(eval_answers)


def _make_llm(settings: Settings) -> LLM | None:
    """The LLM every LLM configuration shares, loaded once (None for the extractive provider).
    A module-level hook so tests can put a scripted LLM in its place."""
    from arag.llm.factory import get_llm

    return get_llm(settings)


class AcceptAllSupport:
    """A support scorer that accepts every claim: the agent with its claim checks off."""

    name = "accept-all"
    threshold = 0.0

    def score(self, claim: str, passage: str) -> float:
        return 1.0


def with_llm(settings: Settings, spec: str | None) -> Settings:
    """The settings with ``--llm PROVIDER[:MODEL]`` applied."""
    if not spec:
        return settings
    provider, _, model = spec.partition(":")
    if provider not in PROVIDERS:
        raise InputError(
            f"unknown LLM provider {provider!r}",
            where="--llm",
            fix=f"use {', '.join(PROVIDERS)}, optionally with :MODEL (llama-cpp:qwen2.5-coder-0.5b)",
        )
    update: dict[str, Any] = {"provider": provider}
    if model:
        update["model"] = model
    return settings.model_copy(update={"llm": settings.llm.model_copy(update=update)})


def run_machine(model: object | None, settings: Settings) -> dict[str, Any]:
    """What the latencies were measured on: the CPU, its cores, the local LLM's llama.cpp build and
    whether answers were scored for their first token (one more model call each)."""
    from arag.cpu import cpu_name
    from arag.llm.builds import choose_build

    local = model is not None and settings.llm.provider == "llama-cpp"
    return {
        "cpu": cpu_name() or "unknown",
        "cores": os.cpu_count(),
        # The same choice the LLM factory made for this model's processes.
        "llama_build": choose_build(settings.llm.build).name if local else None,
        "answer_confidence": settings.agent.answer_confidence,
    }


def print_machine(machine: dict[str, Any]) -> None:
    """The line that says what the latencies were measured on."""
    build = f"; llama.cpp build {machine['llama_build']}" if machine["llama_build"] else ""
    console.print(
        f"machine: {machine['cpu']}, {machine['cores']} cores{build}; first-token scoring "
        f"{machine['answer_confidence']}",
        highlight=False,
        soft_wrap=True,
    )


def parse_configs(text: str) -> list[str]:
    chosen = list(dict.fromkeys(c.strip() for c in text.split(",") if c.strip()))
    unknown = [c for c in chosen if c not in CONFIGS]
    if unknown or not chosen:
        raise InputError(
            f"unknown configuration {unknown[0] if unknown else ''!r}",
            where="--configs",
            fix=f"use a comma list of {', '.join(CONFIGS)}",
        )
    return chosen


def split_note(
    qpath: Path,
    held_out: bool,
    settings: Settings,
    reranker: str,
    reader: str | None,
    calibrated_on: str | None = None,
    abstention: str | None = None,
) -> dict[str, Any]:
    """Which split the figures are reported on, and what was fit on which split (``calibrated_on``:
    the questions the trained reranker's card says it was calibrated on; ``abstention``: what the
    abstention rule in use was fit on)."""
    reported = qpath.name + (" (the papers held out of training)" if held_out else "")
    fit_on = [
        "the LLM, embedder and rules: nothing fit on QASPER; the lexical support threshold: on QASPER train"
    ]
    emb = settings.embedding
    if emb.provider == "onnx-minilm" and emb.path is not None:
        fit_on[0] = "the LLM and rules: nothing fit on QASPER; the lexical support threshold: on QASPER train"
        fit_on.append(
            f"the embedder ({emb.path.name}): fine-tuned on QASPER train less one paper in ten "
            "(`arag train embedder`; its model card)"
        )
    if reranker.startswith("trained:"):
        fit_on.append(
            f"the reranker ({reranker}): trained on QASPER train, its bars and fusion weight calibrated on "
            f"{calibrated_on or 'QASPER validation'} (its model card)"
        )
    if reader is not None:
        fit_on.append(
            f"the answer reader ({reader}): trained on QASPER train less one paper in ten, its "
            "thresholds fit on those held-out train papers"
        )
    if abstention is not None:
        fit_on.append(f"the abstention rule: fit on {abstention}")
    note: dict[str, Any] = {"reported_on": reported, "fit_on": fit_on}

    # A reranker calibrated (or a rule fit) on the very questions reported on flatters them: say so.
    def same(fit: str | None) -> bool:
        if fit is None:
            return False
        split = fit.split(" (")[0]
        return split == qpath.name or (held_out and split.startswith(qpath.name + ":"))

    warnings = []
    if same(calibrated_on):
        warnings.append(
            f"the reranker was calibrated on these questions ({calibrated_on}): the figures are not "
            "held out; retrain it with `arag train reranker --force` (calibrated on held-out train papers)"
        )
    if same(abstention):
        warnings.append(
            f"the abstention rule was fit on these questions ({abstention}): the figures are not held "
            "out; set ARAG_ABSTENTION__PROVIDER=none to report without it"
        )
    if warnings:
        note["warning"] = "; ".join(warnings)
    return note


def print_split_note(splits: dict[str, Any]) -> None:
    """The split line under an eval's tables (and its warning, if any)."""
    console.print(
        f"reported on: {splits['reported_on']}; fit on: " + "; ".join(splits["fit_on"]),
        highlight=False,
        soft_wrap=True,
    )
    if "warning" in splits:
        console.print(f"[yellow]warning:[/] {splits['warning']}", highlight=False, soft_wrap=True)


def print_rule_effect(config: str, effect: RuleEffect) -> None:
    """What the abstention rule did to one configuration's answers, paired on the same answers."""
    d = effect.difference
    unknown = f"; {effect.unknown} withheld answers not in the trace (scored as declined)"
    console.print(
        f"{config}: the abstention rule declined {effect.declined} answers ({effect.declined_unanswerable} "
        f"to unanswerable questions, {effect.declined_answerable} to answerable ones); the same answers "
        f"without it: Answer-F1 {effect.answer_f1_without.mean:.3f} -> {effect.answer_f1_with.mean:.3f} "
        f"with it (paired {d.mean:+.3f}, 95% CI {d.lo:+.3f} to {d.hi:+.3f}); declined (unanswerable) "
        f"{effect.abstain_unanswerable_without:.2f} without it; answered (answerable) "
        f"{effect.answered_answerable_without:.2f} without it" + (unknown if effect.unknown else ""),
        highlight=False,
        soft_wrap=True,
    )


def reranker_calibration(reranker: object) -> str | None:
    """The questions a trained reranker was calibrated on, from its card (None for other rerankers)."""
    from arag.models.reranker import OnnxReranker

    if not isinstance(reranker, OnnxReranker):
        return None
    found = reranker.card.data.get("validation")
    return str(found) if found is not None else None


def _cell(m: Any, *, show_n: bool) -> str:
    half = max(m.mean - m.lo, m.hi - m.mean)
    return f"{m.mean:.3f} ±{half:.3f}" + (f" (n={m.n})" if show_n else "")


def print_reports(reports: list[ConfigReport]) -> None:
    """The quality, latency and failure tables, one column per configuration."""
    from arag.eval.answers import KINDS, METRICS, TAXONOMY

    names = [r.config for r in reports]
    quality = Table(
        title="answers: mean ± 95% CI half-width",
        caption="answer_f1 <kind>: by the question's kind; official <type>: the official script's "
        "Answer-F1 by each annotation's answer type",
    )
    quality.add_column("metric", no_wrap=True)
    for name in names:
        quality.add_column(name)
    subset = {"abstain_unanswerable", "answered_answerable", "citation_validity", "support_rate"}
    for name in METRICS:
        quality.add_row(name, *(_cell(r.metrics[name], show_n=name in subset) for r in reports))
    for kind in KINDS:
        if any(kind in r.answer_f1_by_kind for r in reports):
            quality.add_row(
                f"answer_f1 {kind}",
                *(
                    _cell(r.answer_f1_by_kind[kind], show_n=True) if kind in r.answer_f1_by_kind else "-"
                    for r in reports
                ),
            )
    # The official script's by-type figures count each annotation by its own answer type (a question's
    # annotators may disagree on it): the figures QASPER's papers and the README's tables report.
    by_type = [r.official.get("Answer F1 by type", {}) for r in reports]
    for kind in dict.fromkeys(k for t in by_type for k in t):
        quality.add_row(
            f"official {kind}",
            *(f"{t[kind]:.3f}" if kind in t else "-" for t in by_type),
        )
    console.print(quality)
    latency = Table("latency (ms)", *names, title="latency")
    latency.add_row("total p50", *(f"{r.total_p50_ms:.0f}" for r in reports))
    latency.add_row("total p95", *(f"{r.total_p95_ms:.0f}" for r in reports))
    if any(r.cached_runs for r in reports):
        # Replies from the disk cache of LLM calls take no time: such latencies are not real.
        latency.add_row("runs with cached LLM replies", *(str(r.cached_runs) for r in reports))
    nodes = list(dict.fromkeys(n for r in reports for n in r.latency_p50_ms))
    for node in nodes:
        latency.add_row(
            f"{node} p50",
            *(f"{r.latency_p50_ms[node]:.1f}" if node in r.latency_p50_ms else "-" for r in reports),
        )
    console.print(latency)
    failures = Table("failure (wrong answers)", *names, title="failure taxonomy (Answer-F1 < 0.5)")
    for t in TAXONOMY:
        failures.add_row(t, *(str(r.taxonomy[t]) for r in reports))
    failures.add_row("wrong / all", *(f"{r.wrong} / {r.questions}" for r in reports))
    if any(r.errors for r in reports):
        failures.add_row("errors", *(str(r.errors) for r in reports))
    console.print(failures)


@handle_errors
def eval_answers(
    questions: Annotated[
        Path | None, typer.Option(help="QASPER questions JSON, either format (default: validation).")
    ] = None,
    limit: Annotated[
        int | None, typer.Option(help="A stratified sample of N questions (by answer kind, fixed seed).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the stratified sample.")] = 0,
    configs: Annotated[
        str, typer.Option(help=f"Comma-separated subset of: {', '.join(CONFIGS)}.")
    ] = ",".join(CONFIGS),
    llm: Annotated[
        str | None,
        typer.Option("--llm", help="PROVIDER[:MODEL]: llama-cpp, openai or extractive (default: settings)."),
    ] = None,
    scope: Annotated[
        str, typer.Option(help="library (title in front of the question) or paper.")
    ] = "library",
    held_out: Annotated[
        bool,
        typer.Option(
            "--held-out",
            help="Only questions of the QASPER train papers held out of training (the reranker's and the "
            "answer reader's; with --questions <train file>: the set their thresholds are fit on).",
        ),
    ] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the summary as JSON.")] = None,
    traces: Annotated[
        Path | None, typer.Option(help="Write one JSON line per question and configuration here.")
    ] = None,
    plot: Annotated[Path | None, typer.Option(help="Write the grouped bar chart (PNG) here.")] = None,
) -> None:
    """Answer-F1 (official QASPER), Evidence-F1, abstention on unanswerable and answering on answerable
    questions, citation validity, claim support and latency, with 95% bootstrap CIs and a failure
    taxonomy, for: naive RAG (dense top 5 -> LLM), extractive, full agent, without verifier, one pass."""
    from arag.agent import build_agent
    from arag.corpus.qasper_questions import (
        default_questions_path,
        held_out_paper,
        library_query,
        questions_in_library,
    )
    from arag.eval.answers import (
        RecordingBackend,
        load_answer_questions,
        score_answer,
        strata,
        stratified_sample,
        summarize,
    )
    from arag.eval.naive import NaiveRAG
    from arag.eval.retrieval import check_limit
    from arag.eval.rule_effect import rule_effect
    from arag.library.manage import list_papers, open_retrieval
    from arag.models.abstention import get_abstention
    from arag.models.reader import get_reader
    from arag.models.reranker import get_reranker, reranker_scale

    if scope not in ("library", "paper"):
        raise InputError(f"unknown scope {scope!r}", where="--scope", fix="use library or paper")
    check_limit(limit)
    chosen = parse_configs(configs)
    settings = with_llm(load_settings(), llm)
    if traces is not None and settings.agent.answer_confidence == "auto":
        # Traces are what an abstention rule is fit on: they carry every signal, the LLM's own too.
        agent_settings = settings.agent.model_copy(update={"answer_confidence": "on"})
        settings = settings.model_copy(update={"agent": agent_settings})
    qpath = questions or default_questions_path()
    annotated, no_annotations = load_answer_questions(qpath)
    if held_out:
        annotated = [q for q in annotated if held_out_paper(q.paper_id)]
    library = {r.id for r in list_papers(settings)}
    everything, absent = questions_in_library(annotated, library, where=str(qpath))
    if absent:
        console.print(
            f"[yellow]warning:[/] {absent} of {len(annotated)} questions are about papers not in the "
            "library; they are left out (they could only score 0)",
            highlight=False,
            soft_wrap=True,
        )
    qs = stratified_sample(everything, limit, seed=seed) if limit is not None else everything
    if not qs:
        raise InputError("the questions file has no annotated question", where=str(qpath), fix="pass another")
    per_kind = strata(qs)
    sample = f"stratified sample (seed {seed}) of {len(everything)}" if len(qs) < len(everything) else "all"
    console.print(
        f"{len(qs)} questions ({sample}): " + ", ".join(f"{k} {n}" for k, n in per_kind.items()),
        highlight=False,
        soft_wrap=True,
    )
    model = _make_llm(settings) if any(c in NEEDS_LLM for c in chosen) else None
    skipped: dict[str, str] = {}
    for c in chosen:
        if c in NEEDS_LLM and model is None:
            skipped[c] = (
                f"needs an LLM, and the LLM provider is {settings.llm.provider} "
                "(pass --llm llama-cpp or --llm openai)"
            )
            console.print(f"[yellow]skipped {c}:[/] {skipped[c]}", highlight=False, soft_wrap=True)
    runnable = [c for c in chosen if c not in skipped]
    if not runnable:
        raise InputError(
            "no chosen configuration can run without an LLM",
            where="--configs / --llm",
            fix="add extractive to --configs, or pass --llm llama-cpp",
        )
    retrieval = open_retrieval(settings, llm=model)
    reports: list[ConfigReport] = []
    effects: dict[str, RuleEffect] = {}
    if traces:
        traces.parent.mkdir(parents=True, exist_ok=True)
    out = traces.open("w", encoding="utf-8") if traces else None
    try:
        reranker = get_reranker(settings)  # loaded once, shared by every configuration
        scale = reranker_scale(reranker)
        reader = get_reader(settings)
        readers = reader.name if reader is not None else None
        rule = get_abstention(settings)
        # A rule that is off declines nothing: the answers are as without one.
        rule = rule if rule is not None and rule.active else None
        rule_fit = str(rule.fit.get("fit_on", "?")) if rule is not None else None
        backend = RecordingBackend(retrieval.reranking(reranker=reranker))
        runners: dict[str, Runner] = {}
        described: dict[str, dict[str, Any]] = {}
        llm_name = model.name if model is not None else None
        for c in runnable:
            if c == "naive":
                assert model is not None  # LLM configurations without one were skipped
                naive = NaiveRAG(
                    retrieval.store,
                    retrieval.embedder,
                    model,
                    max_answer_tokens=settings.llm.max_answer_tokens,
                    book=backend.chunks,
                )
                runners[c] = naive.run
                described[c] = {"llm": llm_name, "retrieval": f"dense top {naive.k}", "verifier": "none"}
                continue
            s = settings
            if c == "one-pass":
                s = settings.model_copy(
                    update={"agent": settings.agent.model_copy(update={"max_retries": 0})}
                )
            agent = build_agent(
                s,
                backend,
                None if c == "extractive" else model,
                support=AcceptAllSupport() if c == "no-verifier" else None,
                reader=reader,
                abstention=rule,
            )
            runners[c] = agent.run
            described[c] = {
                "reader": readers,
                "abstention": None if rule is None else f"on (threshold {rule.threshold:.3f})",
                "llm": None if c == "extractive" else llm_name,
                "reranker": reranker.name,
                "max_retries": s.agent.max_retries,
                "verifier": "off (claims accepted)" if c == "no-verifier" else agent.deps.support.name,
                "llm_checks": agent.deps.llm_checks,
            }
        for c in runnable:
            rows = []
            with build_progress(c, unit="questions") as bar:
                bar.start(len(qs))
                for q in qs:
                    if scope == "paper":
                        query, flt = q.question, SearchFilter(paper_ids=[q.paper_id])
                    else:
                        query, flt = library_query(q), None
                    error = None
                    try:
                        answer = runners[c](query, flt)
                    except AragError as exc:
                        error = str(exc)
                        answer = Answer(
                            question=query, short_answer="", text="", route="research", mode="llm"
                        )
                    row = score_answer(
                        c,
                        q,
                        answer,
                        backend.chunks,
                        support_threshold=settings.agent.support_threshold,
                        error=error,
                    )
                    row.reranker = None if c == "naive" else scale  # naive RAG reranks nothing
                    rows.append(row)
                    if out is not None:
                        out.write(row.model_dump_json() + "\n")
                        out.flush()
                    bar.advance(1)
            reports.append(summarize(c, rows, qs, settings=described[c]))
            effect = rule_effect(rows, qs) if rule is not None else None
            if effect is not None:
                effects[c] = effect
    finally:
        retrieval.close()
        if out is not None:
            out.close()
    print_reports(reports)
    for c, effect in effects.items():
        print_rule_effect(c, effect)
    splits = split_note(
        qpath, held_out, settings, reranker.name, readers, reranker_calibration(reranker), rule_fit
    )
    print_split_note(splits)
    machine = run_machine(model, settings)
    print_machine(machine)
    if json_out:
        summary = {
            "questions_file": str(qpath),
            "splits": splits,
            "questions": len(qs),
            "questions_in_file": len(annotated),
            "without_annotations": no_annotations,
            "not_in_library": absent,
            "sampled": len(qs) < len(everything),
            "seed": seed,
            "strata": per_kind,
            "scope": scope,
            "llm": model.name if model is not None else None,
            "llm_provider": settings.llm.provider,
            "machine": machine,
            "skipped": skipped,
            "configs": [r.model_dump() for r in reports],
            # Each configuration's answers scored again with what the abstention rule withheld.
            "abstention_rule_effect": {c: e.model_dump() for c, e in effects.items()},
        }
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(summary, indent=2))
    if plot:
        from arag.eval.answers import plot_answers

        console.print(f"chart: {plot_answers(reports, plot)}")
