"""Answer evaluation on QASPER: what the agent (and the baselines) answer, scored per question.

- **Answer-F1**: the official QASPER score (``qasper_metrics``: SQuAD normalisation, token F1, max over
  the annotations) of the *short answer*. An abstention ("not in the library") is predicted as
  ``"Unanswerable"``, which scores 1.0 against an unanswerable annotation. **Answer-F1 (text)** scores
  the explanation instead (citation markers and the "not found" note stripped), a secondary figure.
- **Evidence-F1**: qasper_metrics' paragraph F1 (max over annotations, text evidence only) of the cited
  chunks. Chunks are not paragraphs, so each cited chunk is mapped first, by the containment rule of
  ``eval/retrieval.py`` (a chunk holds a gold paragraph when it contains one of its sentences of 20+
  characters, after whitespace and case normalisation): the predicted list is every gold paragraph some
  cited chunk holds (once each), plus the text of each cited chunk that holds none (a false positive).
- **Abstention on unanswerable** / **answered on answerable**: over the questions whose first
  annotation is / is not unanswerable (the question's *kind*, also the sampling stratum).
- **Citation validity**: 1 when every [n] marker of the answer names a chunk retrieved for it (one of
  the numbered chunks the model saw), over answers with at least one marker.
- **Claim support**: share of the answer's checkable claims (sentences with content words) supported by
  a passage they cite, by the lexical support scorer at the agent's threshold, whatever verifier the
  configuration ran (so configurations without a verifier are measured the same way); over answers
  with at least one claim.
- **Failure taxonomy** over wrong answers (Answer-F1 below ``WRONG_BELOW``), first match wins:
  verifier_removed (the verifier abstained although the synthesizer's short answer was right),
  retrieval_miss (no kept chunk holds a gold evidence paragraph), abstained_wrongly (evidence kept, yet
  abstained), answered_unanswerable (answered a question whose first annotation is unanswerable;
  with abstained_wrongly, the "gated or abstained wrongly" class), no_text_evidence (the gold evidence
  is only figures/tables: retrieval cannot be judged), generation_wrong (evidence kept, answered, wrong).

Means come with 95% bootstrap intervals over the questions (``retrieval.bootstrap_ci``).
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from arag.agent import prompts
from arag.agent.support import LexicalSupport
from arag.agent.terms import cited_numbers, key_terms, strip_citations
from arag.agent.verifier import split_claims
from arag.corpus.qasper_questions import EvalQuestion, read_question_items
from arag.errors import InputError
from arag.eval.qasper_metrics import (
    FLOAT_MARKER,
    UNANSWERABLE,
    Reference,
    evaluate,
    paragraph_f1_score,
    reference_from_annotation,
    references_for_question,
    score_references,
    token_f1_score,
)
from arag.eval.retrieval import bootstrap_ci, hits_per_rank
from arag.models.abstention import signals
from arag.records import Answer, Chunk, ScoredChunk, SearchFilter
from arag.retrieval.pipeline import SearchResult

Kind = Literal["yes_no", "extractive", "abstractive", "unanswerable"]
KINDS: tuple[Kind, ...] = ("yes_no", "extractive", "abstractive", "unanswerable")
_KIND_OF_TYPE: dict[str, Kind] = {
    "boolean": "yes_no",
    "extractive": "extractive",
    "abstractive": "abstractive",
    "none": "unanswerable",
}
# An answer is wrong below this Answer-F1 (a right one reaches it): yes/no and "Unanswerable" score
# 0 or 1, a span half-matched is counted right.
WRONG_BELOW = 0.5
METRICS = (
    "answer_f1",
    "answer_f1_text",
    "evidence_f1",
    "abstain_unanswerable",
    "answered_answerable",
    "citation_validity",
    "support_rate",
)
TAXONOMY = (
    "retrieval_miss",
    "abstained_wrongly",
    "answered_unanswerable",
    "generation_wrong",
    "verifier_removed",
    "no_text_evidence",
)
_MISSING_NOTE = "\n\nNot found in the library's passages:"
_DRAFT = re.compile(r"short answer ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")")


class AnswerQuestion(EvalQuestion):
    """A QASPER question with its annotations, its kind (from the first annotation) and its text
    evidence (union over annotations; may be empty)."""

    answers: list[dict[str, Any]]
    kind: Kind


def load_answer_questions(path: Path) -> tuple[list[AnswerQuestion], int]:
    """Every question of a QASPER file (either format) that has annotations, and how many had none."""
    out: list[AnswerQuestion] = []
    skipped = 0
    for item in read_question_items(path):
        answers = [a for a in item.get("answers", []) if isinstance(a, dict)]
        if not answers:
            skipped += 1
            continue
        first = reference_from_annotation(answers[0], where=str(item.get("question_id")))
        evidence = list(
            dict.fromkeys(
                e for a in answers for e in a.get("evidence", []) if e and not e.startswith(FLOAT_MARKER)
            )
        )
        out.append(
            AnswerQuestion(
                question_id=str(item["question_id"]),
                paper_id=str(item["paper_id"]),
                paper_title=str(item.get("paper_title", "")),
                question=str(item["question"]),
                evidence=evidence,
                answers=answers,
                kind=_KIND_OF_TYPE[first.type],
            )
        )
    ids = [q.question_id for q in out]
    if len(set(ids)) != len(ids):
        raise InputError("a question id appears twice", where=str(path), fix="deduplicate the questions file")
    return out, skipped


def strata(questions: Sequence[AnswerQuestion]) -> dict[str, int]:
    """Questions per kind, every kind listed."""
    return {k: sum(q.kind == k for q in questions) for k in KINDS}


def stratified_sample(questions: Sequence[AnswerQuestion], n: int, *, seed: int = 0) -> list[AnswerQuestion]:
    """``n`` questions, each kind in proportion to its share (largest remainders round), drawn with a
    fixed seed, in file order. All of them when ``n`` is not smaller."""
    if n >= len(questions):
        return list(questions)
    if n <= 0:
        return []
    groups = {k: [i for i, q in enumerate(questions) if q.kind == k] for k in KINDS}
    exact = {k: n * len(v) / len(questions) for k, v in groups.items()}
    quota = {k: int(x) for k, x in exact.items()}
    by_remainder = sorted(KINDS, key=lambda k: (-(exact[k] - quota[k]), KINDS.index(k)))
    for k in by_remainder[: n - sum(quota.values())]:
        quota[k] += 1
    rng = random.Random(seed)
    picked: list[int] = []
    for k in KINDS:
        picked.extend(rng.sample(groups[k], quota[k]))
    return [questions[i] for i in sorted(picked)]


# --- scoring one answer ---------------------------------------------------------------------------


def is_abstention(answer: Answer) -> bool:
    """The answer says the library does not hold it (the agent and the baseline normalise every
    "unanswerable" paraphrase to "not in the library" already)."""
    return answer.abstained or answer.short_answer.strip() == prompts.NOT_IN_LIBRARY


def prediction(answer: Answer) -> str:
    """What the official metric scores: the short answer; "Unanswerable" for an abstention."""
    return UNANSWERABLE if is_abstention(answer) else answer.short_answer


def short_prediction(short: str) -> str:
    """A bare short answer as the official metric scores it ("Unanswerable" for "not in the library")."""
    return UNANSWERABLE if short.strip() == prompts.NOT_IN_LIBRARY else short


def explanation(answer: Answer) -> str:
    """The answer's explanation with its [n] markers (the "not found" note cut off)."""
    return answer.text.split(_MISSING_NOTE, 1)[0].strip()


def text_prediction(answer: Answer) -> str:
    """The secondary prediction: the explanation without markers; "Unanswerable" for an abstention."""
    return UNANSWERABLE if is_abstention(answer) else " ".join(strip_citations(explanation(answer)).split())


def cited_ids(answer: Answer) -> list[str]:
    """The cited chunks' ids, once each, in citation order."""
    return list(dict.fromkeys(c.chunk_id for c in answer.citations))


def mapped_evidence(cited_texts: Sequence[str], gold: Sequence[str]) -> list[str]:
    """The cited chunks as QASPER paragraphs: the gold paragraphs they hold part of (once each, in order
    of first hit), then the text of each chunk that holds none."""
    hits = hits_per_rank(cited_texts, gold)
    found: list[int] = []
    misses: list[str] = []
    for text, h in zip(cited_texts, hits, strict=True):
        found.extend(i for i in sorted(h) if i not in found)
        if not h:
            misses.append(text)
    return [gold[i] for i in found] + misses


def evidence_f1(predicted: Sequence[str], references: Sequence[Reference]) -> float:
    """qasper_metrics' paragraph F1, max over the annotations."""
    return max(paragraph_f1_score(predicted, r.evidence) for r in references)


def marker_validity(answer: Answer) -> float | None:
    """1.0 when every [n] of the explanation names a retrieved chunk the model saw numbered n, 0.0 when
    one does not, None without markers."""
    numbers = cited_numbers(explanation(answer))
    if not numbers:
        return None
    numbered = {c.n for c in answer.chunks if c.n is not None}
    return float(all(n in numbered for n in numbers))


def claim_support(
    text: str, passages: Mapping[int, str], scorer: LexicalSupport, *, quoted: Collection[str] = ()
) -> tuple[int, int]:
    """(checkable claims, supported claims) of an explanation: a claim is supported when a passage it
    cites scores at least the scorer's threshold (an uncited claim is unsupported). Claims are split as
    the verifier splits the LLM's text, but a paragraph in ``quoted`` (a literature answer's points,
    papers' own sentences) is split as the papers' prose is, one claim a quoted sentence."""
    claims = supported = 0
    paragraphs = text.split("\n\n") if quoted else [text]
    units = [c for para in paragraphs for c in split_claims(para, quoted=para in quoted)]
    for claim in units:
        body = strip_citations(claim)
        if not key_terms(body):
            continue
        claims += 1
        cited = [passages[n] for n in cited_numbers(claim) if n in passages]
        if any(scorer.score(body, p) >= scorer.threshold for p in cited):
            supported += 1
    return claims, supported


def draft_short_answer(answer: Answer) -> str | None:
    """The synthesizer's short answer before verification, from its event's decision; None without."""
    for e in answer.events:
        if e.node == "synthesizer":
            m = _DRAFT.search(e.decision)
            if m is not None:
                try:
                    value = ast.literal_eval(m.group(1))
                except (ValueError, SyntaxError):
                    return None
                return value if isinstance(value, str) else None
    return None


def verifier_abstained(answer: Answer) -> bool:
    """The verifier turned a draft into an abstention (fail closed), not the synthesizer."""
    return any(e.node == "verifier" and e.decision.startswith("abstain:") for e in answer.events)


def classify_failure(
    *,
    answer_f1: float,
    kind: Kind,
    abstained: bool,
    evidence_kept: bool | None,
    verifier_dropped_right: bool,
) -> str | None:
    """The failure class of a wrong answer (see the module doc); None for a right one.
    ``evidence_kept`` is None when the gold has no text evidence."""
    if answer_f1 >= WRONG_BELOW:
        return None
    if kind == "unanswerable":
        return "answered_unanswerable"
    if verifier_dropped_right:
        return "verifier_removed"
    if evidence_kept is False:
        return "retrieval_miss"
    if abstained:
        return "abstained_wrongly"
    if evidence_kept is None:
        return "no_text_evidence"
    return "generation_wrong"


def full_text(chunk: Chunk) -> str:
    """A chunk as the verifier reads it: its section heading and its text."""
    return f"{chunk.section}: {chunk.text}" if chunk.section else chunk.text


class KeptChunk(BaseModel):
    chunk_id: str
    paper_id: str
    n: int | None
    score: float
    pass_index: int
    query: str
    gold: bool = Field(description="holds part of a gold evidence paragraph")


class TraceRow(BaseModel):
    """One question answered by one configuration: the trace, the answer and its scores."""

    config: str
    question_id: str
    paper_id: str
    question: str
    kind: Kind
    route: str
    answer_type: str | None
    mode: str
    sub_queries: list[str]
    passes: int
    kept: list[KeptChunk]
    decisions: list[dict[str, Any]]
    timings: dict[str, float]
    total_ms: float
    llm_cached_calls: int = 0
    short_answer: str
    text: str
    prediction: str
    abstained: bool
    answer_f1: float
    answer_f1_text: float
    evidence_f1: float
    predicted_evidence: list[str]
    citation_validity: float | None
    invalid_markers_removed: int
    claims: int
    supported_claims: int
    support_rate: float | None
    verifier_claims: dict[str, float] = Field(default_factory=dict)
    draft_short_answer: str | None = None
    draft_f1: float | None = None
    failure: str | None = None
    error: str | None = None
    # The abstention rule's inputs (arag.models.abstention.signals), for `arag train abstention`.
    signals: dict[str, float] = Field(default_factory=dict)
    # The scale of the rerank scores among them (arag.models.reranker.score_scale): a rule fit on
    # these answers holds for that reranker only.
    reranker: str | None = None


def traced_answers(
    traces: Path, questions: Sequence[AnswerQuestion], *, config: str = "full"
) -> list[tuple[int, TraceRow, AnswerQuestion]]:
    """The one-paper answers of ``config`` in an ``arag eval answers --traces`` file that answer a
    question of ``questions`` (without an error), with their line numbers; an InputError when none
    does. The caller checks that the file exists (its error names its own command)."""
    by_id = {q.question_id: q for q in questions}
    out: list[tuple[int, TraceRow, AnswerQuestion]] = []
    for i, line in enumerate(traces.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = TraceRow.model_validate_json(line)
        q = by_id.get(row.question_id)
        if row.config == config and q is not None and row.route == "research" and not row.error:
            out.append((i, row, q))
    if not out:
        raise InputError(
            f"the traces hold no one-paper answer of configuration {config!r} to a question of the file",
            where=str(traces),
            fix="pass the traces and the questions file of the same `arag eval answers` run",
        )
    return out


def score_answer(
    config: str,
    q: AnswerQuestion,
    answer: Answer,
    chunks: Mapping[str, Chunk],
    *,
    support_threshold: float = 0.5,
    error: str | None = None,
) -> TraceRow:
    """Score one answer; ``chunks`` holds (at least) every retrieved chunk, by id."""
    refs = references_for_question(q.answers, text_evidence_only=True, where=q.question_id)
    pred = prediction(answer)
    ans = score_references(pred, [], refs).answer_f1
    ans_text = max(token_f1_score(text_prediction(answer), r.answer) for r in refs)
    cited = [chunks[c] for c in cited_ids(answer) if c in chunks]
    predicted = mapped_evidence([c.text for c in cited], q.evidence)
    kept_texts = [chunks[c.chunk_id].text if c.chunk_id in chunks else "" for c in answer.chunks]
    kept_hits = hits_per_rank(kept_texts, q.evidence) if q.evidence else [set() for _ in kept_texts]
    evidence_kept = any(kept_hits) if q.evidence else None
    passages = {c.n: full_text(chunks[c.chunk_id]) for c in answer.citations if c.chunk_id in chunks}
    abstained = is_abstention(answer)
    claims, supported = (
        (0, 0)
        if abstained
        else claim_support(explanation(answer), passages, LexicalSupport(support_threshold))
    )
    draft = draft_short_answer(answer)
    draft_f1 = score_references(short_prediction(draft), [], refs).answer_f1 if draft is not None else None
    dropped_right = verifier_abstained(answer) and draft_f1 is not None and draft_f1 >= WRONG_BELOW
    verifier = next((e.counts for e in answer.events if e.node == "verifier"), {})
    return TraceRow(
        config=config,
        question_id=q.question_id,
        paper_id=q.paper_id,
        question=q.question,
        kind=q.kind,
        route=answer.route,
        answer_type=answer.answer_type,
        mode=answer.mode,
        sub_queries=answer.sub_queries,
        passes=sum(e.node in ("retriever", "retrieve") for e in answer.events),
        kept=[
            KeptChunk(
                chunk_id=c.chunk_id,
                paper_id=c.paper_id,
                n=c.n,
                score=c.score,
                pass_index=c.pass_index,
                query=c.query,
                gold=bool(h),
            )
            for c, h in zip(answer.chunks, kept_hits, strict=True)
        ],
        decisions=[{"node": e.node, "decision": e.decision, "ms": e.ms} for e in answer.events],
        signals={k: round(v, 4) for k, v in signals(answer, answer.events).items()},
        timings=answer.timings,
        total_ms=answer.total_ms,
        llm_cached_calls=answer.llm_cached_calls,
        short_answer=answer.short_answer,
        text=answer.text,
        prediction=pred,
        abstained=abstained,
        answer_f1=ans,
        answer_f1_text=ans_text,
        evidence_f1=evidence_f1(predicted, refs),
        predicted_evidence=predicted,
        citation_validity=marker_validity(answer),
        invalid_markers_removed=answer.removed_citations,
        claims=claims,
        supported_claims=supported,
        support_rate=supported / claims if claims else None,
        verifier_claims=dict(verifier),
        draft_short_answer=draft,
        draft_f1=draft_f1,
        failure=classify_failure(
            answer_f1=ans,
            kind=q.kind,
            abstained=abstained,
            evidence_kept=evidence_kept,
            verifier_dropped_right=dropped_right,
        ),
        error=error,
    )


# --- a retriever that remembers what it returned ---------------------------------------------------


class RecordingBackend:
    """Wraps the agent's retriever and keeps every chunk it returned, by id (the answers name chunks
    by id; scoring needs their text)."""

    def __init__(self, inner: Any, book: dict[str, Chunk] | None = None) -> None:
        self.inner = inner
        self.chunks: dict[str, Chunk] = book if book is not None else {}

    def search_many(
        self, queries: Sequence[str], flt: SearchFilter | None = None, *, concurrent: bool = True
    ) -> list[SearchResult]:
        results: list[SearchResult] = self.inner.search_many(queries, flt, concurrent=concurrent)
        for r in results:
            for c in r.ranked:
                self.chunks[c.chunk.id] = c.chunk
        return results

    def abstract_matches(self, query: str, flt: SearchFilter | None = None) -> list[ScoredChunk]:
        return list(self.inner.abstract_matches(query, flt))

    def paper_count(self) -> int:
        return int(self.inner.paper_count())


# --- summaries ------------------------------------------------------------------------------------


class AnswerMetric(BaseModel):
    """A mean over ``n`` questions and its 95% bootstrap interval."""

    mean: float
    lo: float
    hi: float
    n: int


def metric(values: Sequence[float]) -> AnswerMetric:
    lo, hi = bootstrap_ci(values)
    return AnswerMetric(mean=float(np.mean(values)) if values else 0.0, lo=lo, hi=hi, n=len(values))


class ConfigReport(BaseModel):
    """One configuration's figures over the questions."""

    config: str
    questions: int
    metrics: dict[str, AnswerMetric]
    answer_f1_by_kind: dict[str, AnswerMetric]
    official: dict[str, Any] = Field(description="qasper_metrics.evaluate's report, official keys")
    latency_p50_ms: dict[str, float] = Field(description="per node, over the questions it ran for")
    total_p50_ms: float
    total_p95_ms: float
    cached_runs: int = Field(
        default=0, description="questions with LLM replies from the disk cache: times not real"
    )
    taxonomy: dict[str, int]
    wrong: int
    errors: int
    settings: dict[str, Any] = Field(default_factory=dict)


def _pct(values: Sequence[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 2) if values else 0.0


def summarize(
    config: str,
    rows: Sequence[TraceRow],
    questions: Sequence[AnswerQuestion],
    *,
    settings: dict[str, Any] | None = None,
) -> ConfigReport:
    """Means with CIs, latency percentiles and the failure counts of one configuration's rows."""
    by_id = {q.question_id: q for q in questions}
    values: dict[str, list[float]] = {
        "answer_f1": [r.answer_f1 for r in rows],
        "answer_f1_text": [r.answer_f1_text for r in rows],
        "evidence_f1": [r.evidence_f1 for r in rows],
        "abstain_unanswerable": [float(r.abstained) for r in rows if r.kind == "unanswerable"],
        "answered_answerable": [float(not r.abstained) for r in rows if r.kind != "unanswerable"],
        "citation_validity": [r.citation_validity for r in rows if r.citation_validity is not None],
        "support_rate": [r.support_rate for r in rows if r.support_rate is not None],
    }
    report = evaluate(
        {r.question_id: (r.prediction, r.predicted_evidence) for r in rows},
        [by_id[r.question_id].model_dump() for r in rows],
        text_evidence_only=True,
    )
    nodes: dict[str, list[float]] = {}
    for r in rows:
        for node, ms in r.timings.items():
            nodes.setdefault(node, []).append(ms)
    totals = [r.total_ms for r in rows]
    return ConfigReport(
        config=config,
        questions=len(rows),
        metrics={k: metric(v) for k, v in values.items()},
        answer_f1_by_kind={
            k: metric([r.answer_f1 for r in rows if r.kind == k])
            for k in KINDS
            if any(r.kind == k for r in rows)
        },
        official=report.official_dict(),
        latency_p50_ms={node: _pct(v, 50) for node, v in nodes.items()},
        total_p50_ms=_pct(totals, 50),
        total_p95_ms=_pct(totals, 95),
        cached_runs=sum(r.llm_cached_calls > 0 for r in rows),
        taxonomy={t: sum(r.failure == t for r in rows) for t in TAXONOMY},
        wrong=sum(r.failure is not None for r in rows),
        errors=sum(r.error is not None for r in rows),
        settings=settings or {},
    )


PLOTTED = ("answer_f1", "abstain_unanswerable", "answered_answerable", "support_rate")


def plot_answers(
    reports: Sequence[ConfigReport], path: Path, *, metrics: Sequence[str] = PLOTTED, title: str = ""
) -> Path:
    """Grouped bars (metric groups, one bar per configuration) with 95% CI whiskers."""
    import matplotlib

    matplotlib.use("Agg")  # no display here, and none needed for a file
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 4.6))
    width = 0.8 / max(1, len(reports))
    x = np.arange(len(metrics))
    for j, rep in enumerate(reports):
        means = [rep.metrics[k].mean for k in metrics]
        err = [
            [max(0.0, rep.metrics[k].mean - rep.metrics[k].lo) for k in metrics],
            [max(0.0, rep.metrics[k].hi - rep.metrics[k].mean) for k in metrics],
        ]
        ax.bar(x + (j - (len(reports) - 1) / 2) * width, means, width, yerr=err, capsize=2, label=rep.config)
    labels = []
    for k in metrics:
        ns = sorted({rep.metrics[k].n for rep in reports}) or [0]
        count = f"n={ns[0]}" if len(ns) == 1 else f"n={ns[0]}-{ns[-1]}"
        labels.append(f"{k.replace('_', ' ')}\n({count})")
    ax.set_xticks(x, labels)
    ax.set_ylim(0, 1.05)
    ax.grid(axis="y", alpha=0.3)
    # Below the axes: bars at 1.0 would hide under a legend inside them.
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=max(1, min(5, len(reports))))
    n = reports[0].questions if reports else 0
    ax.set_title(title or f"QASPER answers ({n} questions): mean with 95% bootstrap CI")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
