"""``arag eval``: quality figures on QASPER (validation by default; there is no test split here)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from arag.cli.common import build_progress, console, handle_errors, load_settings
from arag.cli.eval_answers import print_split_note, reranker_calibration, split_note
from arag.cli.eval_answers import register as register_answers
from arag.errors import InputError
from arag.records import Answer, ScoredChunk, SearchFilter
from arag.settings import Settings

if TYPE_CHECKING:
    from arag.llm.base import LLM

eval_app = typer.Typer(no_args_is_help=True)

# The ablation, in one run over the same questions. The rerank rows rerank hybrid+resolve's list.
METHODS = ("dense", "bm25", "hybrid", "hybrid+resolve", "+rerank", "+rerank+mmr")
# Query strategies (hybrid+resolve with the strategy, then rerank): only when asked for in --methods,
# since each needs an LLM and a generation per question (slow on a CPU).
STRATEGY_METHODS = {"+multi-query": "multi-query", "+hyde": "hyde"}


def _make_llm(settings: Settings) -> LLM | None:
    """The configured LLM for the strategy rows (a seam tests replace with a scripted one)."""
    from arag.llm.factory import get_llm

    return get_llm(settings)


@eval_app.command("retrieval")
@handle_errors
def eval_retrieval(
    questions: Annotated[
        Path | None, typer.Option(help="QASPER questions JSON (default: validation).")
    ] = None,
    scope: Annotated[str, typer.Option(help="library, paper, or both.")] = "both",
    limit: Annotated[int | None, typer.Option(help="Only the first N questions.")] = None,
    methods: Annotated[
        str,
        typer.Option(
            help=f"Comma-separated subset of: {', '.join(METHODS)}; also "
            f"{', '.join(STRATEGY_METHODS)} (need an LLM; not run unless named)."
        ),
    ] = ",".join(METHODS),
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the reports as JSON.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write the ablation bar chart (PNG) here.")] = None,
) -> None:
    """Evidence Recall@5/10/20, nDCG@10, MRR@10 and paper hit@5 with 95% bootstrap CIs, for the ablation
    in one run: dense only, BM25 only, hybrid RRF, + paper resolution, + rerank, + rerank + MMR; and, when
    named, + multi-query or + HyDE (hybrid+resolve with that query strategy, then rerank; need an LLM)."""
    from arag.corpus.qasper_questions import (
        count_skipped,
        default_questions_path,
        load_questions,
        questions_in_library,
    )
    from arag.eval.retrieval import Scope, check_limit, evaluate_retrieval
    from arag.index.sparse import BM25Encoder
    from arag.library.manage import list_papers, open_retrieval

    if scope not in ("library", "paper", "both"):
        raise InputError(f"unknown scope {scope!r}", where="--scope", fix="use library, paper or both")
    check_limit(limit)
    scopes: list[Scope] = ["library", "paper"] if scope == "both" else [scope]  # type: ignore[list-item]
    chosen = [m.strip() for m in methods.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in METHODS and m not in STRATEGY_METHODS]
    if unknown or not chosen:
        raise InputError(
            f"unknown method {unknown[0] if unknown else ''!r}",
            where="--methods",
            fix=f"use {', '.join((*METHODS, *STRATEGY_METHODS))}",
        )
    settings = load_settings()
    strategies = [m for m in chosen if m in STRATEGY_METHODS]
    llm: LLM | None = None
    # Before opening the library: the strategies cannot run without an LLM.
    if strategies and settings.llm.provider != "extractive":
        llm = _make_llm(settings)
    if strategies and llm is None:
        raise InputError(
            f"{', '.join(strategies)} need an LLM, and the LLM provider is extractive (none)",
            where="--methods",
            fix="set ARAG_LLM__PROVIDER to llama-cpp or openai, or leave those methods out",
        )
    qpath = questions or default_questions_path()
    library = {r.id for r in list_papers(settings)}
    qs, absent = questions_in_library(load_questions(qpath), library, where=str(qpath))
    if absent:
        console.print(
            f"[yellow]warning:[/] {absent} of {absent + len(qs)} questions are about papers not in the "
            "library; they are left out (they could only score 0)",
            highlight=False,
            soft_wrap=True,
        )
    qs = qs[:limit] if limit is not None else qs
    skipped = count_skipped(qpath) if limit is None else 0
    retrieval = open_retrieval(settings)
    store, embedder = retrieval.store, retrieval.embedder
    retriever, resolving = retrieval.plain, retrieval.hybrid
    bm25 = BM25Encoder()
    depth = max(20, settings.retrieval.fused_k)
    reranking = {}
    splits = split_note(qpath, False, settings, "none", None)
    if any(m.startswith("+rerank") or m in STRATEGY_METHODS for m in chosen):
        from arag.models.reranker import get_reranker

        model = get_reranker(settings)  # loaded once, shared by every reranked row
        splits = split_note(qpath, False, settings, model.name, None, reranker_calibration(model))
        plain = settings.retrieval.model_copy(update={"strategy": "plain"})  # whatever the config says
        for m in ("+rerank", "+rerank+mmr"):
            rs = settings.rerank.model_copy(update={"mmr": m.endswith("mmr")})
            reranking[m] = retrieval.reranking(
                settings.model_copy(update={"rerank": rs, "retrieval": plain}), model
            )
        for m in strategies:
            rt = settings.retrieval.model_copy(update={"strategy": STRATEGY_METHODS[m]})
            reranking[m] = retrieval.reranking(settings.model_copy(update={"retrieval": rt}), model, llm)

    def search_fn(method: str) -> Callable[[str, SearchFilter | None], list[ScoredChunk]]:
        def run(query: str, flt: SearchFilter | None) -> list[ScoredChunk]:
            if method == "hybrid+resolve":
                return resolving.search(query, flt).fused
            if method == "hybrid":
                return retriever.search(query, flt).fused
            if method in reranking:
                return list(reranking[method].search(query, flt).ranked)
            if method == "dense":
                return store.dense_search(embedder.embed_query(query), depth, flt)
            return store.sparse_search(bm25.encode_query(query), depth, flt)

        return run

    reports = []
    try:
        for sc in scopes:
            for method in chosen:
                with build_progress(f"{sc} / {method}", unit="questions") as bar:
                    bar.start(len(qs))
                    rep = evaluate_retrieval(
                        search_fn(method), qs, scope=sc, skipped=skipped, progress=bar.advance
                    )
                reports.append((method, rep))
    finally:
        retrieval.close()
    shown = ("recall@5", "recall@10", "recall@20", "ndcg@10", "mrr@10", "paper@5")
    console.print(
        f"{len(qs)} questions with text evidence ({skipped} without, skipped); mean ± 95% CI half-width"
    )
    for sc in scopes:
        mine = [(m, r) for m, r in reports if r.scope == sc]
        table = Table(
            "metric", *(m for m, _ in mine), title=f"{sc}-wide" if sc == "library" else "paper-scoped"
        )
        for name in shown:
            cells = []
            for _, rep in mine:
                mt = rep.metrics[name]
                cells.append(f"{mt.mean:.3f} ±{max(mt.mean - mt.lo, mt.hi - mt.mean):.3f}")
            table.add_row(name, *cells)
        table.add_row("median ms", *(f"{r.median_ms:.1f}" for _, r in mine))
        console.print(table)
    print_split_note(splits)
    if json_out:
        import json

        json_out.write_text(
            json.dumps(
                [
                    {
                        "method": m,
                        "not_in_library": absent,
                        "splits": splits,
                        **r.model_dump(exclude={"results"}),
                    }
                    for m, r in reports
                ],
                indent=2,
            )
        )
    if plot:
        from arag.eval.plot import plot_ablation

        console.print(f"chart: {plot_ablation(reports, plot)}")


@eval_app.command("anchors")
@handle_errors
def eval_anchors(
    top: Annotated[int, typer.Option(help="The paper must be among the top N chunks' papers.")] = 5,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the figures and misses as JSON.")
    ] = None,
) -> None:
    """Anchor recall: each paper's own title, as a query (no title resolution), finds that paper."""
    import json

    from arag.library.manage import open_retrieval

    settings = load_settings()
    misses: list[str] = []
    with open_retrieval(settings) as retrieval:
        rows = retrieval.papers
        retriever = retrieval.plain  # no resolver: retrieval alone
        with build_progress("anchors", unit="titles") as bar:
            bar.start(len(rows))
            for r in rows:
                hits = retriever.search(r.title).fused[:top]
                if r.id not in {h.chunk.paper_id for h in hits}:
                    misses.append(r.id)
                bar.advance(1)
    rate = 1 - len(misses) / len(rows) if rows else 0.0
    console.print(
        f"anchor recall@{top}: {rate:.4f} ({len(rows) - len(misses)}/{len(rows)} titles find their paper)"
    )
    if misses:
        console.print("misses: " + ", ".join(misses), soft_wrap=True)
    if json_out:
        json_out.write_text(
            json.dumps({"top": top, "papers": len(rows), "recall": rate, "misses": misses}, indent=2)
        )


OPEN_ROWS = (
    ("search_p10", "paper precision@10, search"),
    ("bm25_p10", "paper precision@10, BM25 title+abstract"),
    ("search_r10", "paper recall@10, search"),
    ("bm25_r10", "paper recall@10, BM25 title+abstract"),
    ("search_rprec", "paper R-precision (at min(gold, 10)), search"),
    ("bm25_rprec", "paper R-precision (at min(gold, 10)), BM25"),
    ("answered_covered", "answered (covered questions)"),
    ("answered_topic3", "answered (topic has >= 3 papers)"),
    ("cites3_of_answers", "answers citing >= 3 papers"),
    ("distinct_papers_cited", "distinct papers cited per answer"),
    ("support_rate", "claim support rate"),
    ("cited_precision", "cited papers: precision"),
    ("bm25_at_cited_precision", "BM25 at as many papers: precision"),
    ("cited_recall", "cited papers: recall"),
    ("declined_off_library", "declined (off-library)"),
    ("seconds_p50", "answer p50 seconds (uncached)"),
)


@eval_app.command("open")
@handle_errors
def eval_open(
    questions: Annotated[
        Path | None, typer.Option(help="Open questions JSON (default: the packaged set).")
    ] = None,
    answers: Annotated[
        bool, typer.Option("--answers/--no-answers", help="Also answer each question with the agent.")
    ] = False,
    limit: Annotated[int | None, typer.Option(help="Only the first N questions.")] = None,
    llm: Annotated[
        str | None, typer.Option("--llm", help="The LLM for --answers: llama-cpp, openai or extractive.")
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the figures and rows as JSON.")
    ] = None,
) -> None:
    """Open questions (naming no paper): paper precision@10 and recall@10 of the paper ranking against
    BM25 over titles and abstracts, in the same run; with --answers, how often the agent answers
    covered questions, how many papers it cites, their precision and recall, claim support, the
    decline rate on off-library questions and the answer latency."""
    import json
    import time

    from arag.agent import build_agent
    from arag.agent.support import LexicalSupport
    from arag.eval.open import TitleAbstractBM25, default_open_path, evaluate_open, load_open_questions
    from arag.library.manage import list_papers, open_retrieval

    if limit is not None and limit < 1:
        raise InputError(f"--limit must be at least 1, got {limit}", where="--limit", fix="pass N >= 1")
    overrides = {"llm": {"provider": llm}} if llm else {}
    if llm is not None and llm not in ("llama-cpp", "openai", "extractive"):
        raise InputError(
            f"unknown LLM provider {llm!r}", where="--llm", fix="use llama-cpp, openai or extractive"
        )
    settings = load_settings(**overrides)
    qs = load_open_questions(questions or default_open_path())[:limit]
    rows = list_papers(settings)
    baseline = TitleAbstractBM25([(r.id, f"{r.title} {r.abstract_text}") for r in rows])
    model = None
    if answers and settings.llm.provider != "extractive":
        model = _make_llm(settings)
    with open_retrieval(settings, llm=model) as retrieval:
        retriever = retrieval.retriever
        agent = build_agent(settings, retriever, model) if answers else None

        def rank(q: str) -> list[str]:
            return [p.paper_id for p in retriever.search(q).papers]

        def ask(q: str) -> tuple[Answer, float]:
            assert agent is not None
            t0 = time.perf_counter()
            a = agent.run(q)
            return a, time.perf_counter() - t0

        with build_progress("open questions", unit="questions") as bar:
            bar.start(len(qs))
            report = evaluate_open(
                qs,
                {r.id for r in rows},
                rank,
                baseline,
                ask=ask if answers else None,
                scorer=LexicalSupport(settings.agent.support_threshold),
                progress=bar.advance,
            )
    console.print(
        f"{report.covered} covered questions, {report.off_library} off-library"
        + (f", {len(report.skipped)} skipped (gold papers not in the library)" if report.skipped else "")
        + "; mean [95% CI]",
        highlight=False,
    )
    table = Table("figure", "value", "n")
    for key, label in OPEN_ROWS:
        f = report.figures.get(key)
        if f is None or f.mean is None:
            continue
        ci = f" [{f.lo:.3f}, {f.hi:.3f}]" if f.lo is not None and key != "seconds_p50" else ""
        table.add_row(label, f"{f.mean:.3f}{ci}", str(f.n))
    sp, bp = report.figures["search_p10"].mean, report.figures["bm25_p10"].mean
    console.print(table)
    if sp is not None and bp:
        console.print(f"precision@10: search / BM25 = {sp / bp:.2f}x", highlight=False)
    if json_out:
        json_out.write_text(json.dumps(report.model_dump(), indent=2))


register_answers(eval_app)
