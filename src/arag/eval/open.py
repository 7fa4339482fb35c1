"""Open questions across the library ("How do researchers detect fake news?"): does the paper ranking
find the papers on the topic, and does the literature answer cite them, compared in the same run with
BM25 over the papers' titles and abstracts.

The questions (``open_questions.json`` beside this module) carry gold papers: the library's papers on
the question's topic, found by topic phrases in titles and abstracts and checked by hand (see the
README, "Open questions"), and off-library questions (no gold) the agent must decline.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from arag.agent.support import LexicalSupport
from arag.errors import InputError
from arag.eval.answers import claim_support
from arag.eval.retrieval import bootstrap_ci
from arag.records import Answer
from arag.text import tokenize

K = 10


class OpenQuestion(BaseModel):
    """A question and its gold papers (arXiv ids); no gold: the library does not cover it."""

    question: str
    gold: list[str] = Field(default_factory=list)


def default_open_path() -> Path:
    """The packaged question set."""
    return Path(__file__).with_name("open_questions.json")


def load_open_questions(path: Path) -> list[OpenQuestion]:
    """The questions of a set file (``{"questions": [{"question", "gold"}]}``); InputError if unreadable."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        items = raw["questions"] if isinstance(raw, dict) else raw
        return [OpenQuestion.model_validate(x) for x in items]
    except (OSError, ValueError, KeyError, TypeError, ValidationError) as exc:
        raise InputError(
            f"cannot read the open questions: {exc}",
            where=str(path),
            fix='pass a JSON file like {"questions": [{"question": "...", "gold": ["1601.00901"]}]}',
        ) from exc


class TitleAbstractBM25:
    """Okapi BM25 (k1 1.2, b 0.75) over each paper's title and abstract: the baseline paper ranking."""

    def __init__(self, docs: Sequence[tuple[str, str]], k1: float = 1.2, b: float = 0.75) -> None:
        self.ids = [pid for pid, _ in docs]
        self.tf = [Counter(tokenize(text)) for _, text in docs]
        self.len = [sum(c.values()) for c in self.tf]
        self.avg = (sum(self.len) / len(self.len)) if self.len else 1.0
        df: Counter[str] = Counter()
        for c in self.tf:
            df.update(c.keys())
        n = len(docs)
        self.idf = {t: math.log(1 + (n - d + 0.5) / (d + 0.5)) for t, d in df.items()}
        self.k1, self.b = k1, b

    def search(self, query: str, k: int = K) -> list[str]:
        """The ``k`` best papers' ids."""
        terms = [t for t in dict.fromkeys(tokenize(query)) if t in self.idf]
        scores = []
        for i, tf in enumerate(self.tf):
            s = 0.0
            for t in terms:
                f = tf.get(t, 0)
                if f:
                    norm = self.k1 * (1 - self.b + self.b * self.len[i] / self.avg)
                    s += self.idf[t] * f * (self.k1 + 1) / (f + norm)
            if s > 0:
                scores.append((s, i))
        scores.sort(key=lambda x: (-x[0], self.ids[x[1]]))
        return [self.ids[i] for _, i in scores[:k]]


def precision_at(ranked: Sequence[str], gold: set[str], k: int = K) -> float:
    """Share of the first ``k`` places held by gold papers (an empty place counts as a miss)."""
    return len(set(ranked[:k]) & gold) / k


def recall_at(ranked: Sequence[str], gold: set[str], k: int = K) -> float:
    """Share of the gold papers among the first ``k``."""
    return len(set(ranked[:k]) & gold) / len(gold) if gold else 0.0


class OpenRow(BaseModel):
    """One question's figures."""

    question: str
    gold: list[str] = Field(description="the gold papers the library holds")
    search: list[str]
    bm25: list[str]
    p10: float | None = None
    r10: float | None = None
    rprec: float | None = Field(
        default=None, description="precision at as many papers as there are gold ones"
    )
    bm25_p10: float | None = None
    bm25_r10: float | None = None
    bm25_rprec: float | None = None
    # With --answers: what the agent did.
    abstained: bool | None = None
    form: str | None = None
    cited: list[str] = Field(default_factory=list)
    cited_precision: float | None = None
    cited_recall: float | None = None
    bm25_at_cited_precision: float | None = Field(
        default=None, description="the baseline's precision at as many papers as the answer cites"
    )
    claims: int | None = None
    supported: int | None = None
    seconds: float | None = None
    llm_cached_calls: int = 0
    error: str | None = None


class Figure(BaseModel):
    """A mean with its 95% bootstrap interval, over ``n`` questions."""

    mean: float | None
    lo: float | None = None
    hi: float | None = None
    n: int


def figure(values: Sequence[float]) -> Figure:
    if not values:
        return Figure(mean=None, n=0)
    lo, hi = bootstrap_ci(values)
    return Figure(mean=round(statistics.fmean(values), 4), lo=round(lo, 4), hi=round(hi, 4), n=len(values))


class OpenReport(BaseModel):
    """The figures of a run and its rows."""

    questions: int
    covered: int
    off_library: int
    skipped: list[str] = Field(
        default_factory=list, description="questions whose gold papers the library lacks"
    )
    figures: dict[str, Figure]
    rows: list[OpenRow]


def answer_passages(answer: Answer) -> dict[int, str]:
    """The numbered passages of an answer as the verifier reads them."""
    return {c.n: f"{c.section}: {c.text}" if c.section else c.text for c in answer.chunks if c.n is not None}


def score_row(
    q: OpenQuestion,
    gold: set[str],
    search: list[str],
    bm25: list[str],
    answer: Answer | None,
    seconds: float | None,
    scorer: LexicalSupport,
) -> OpenRow:
    """One question's row (a pure function of the rankings and the answer)."""
    row = OpenRow(question=q.question, gold=sorted(gold), search=search[:K], bm25=bm25[:K])
    if gold:
        row.p10, row.r10 = precision_at(search, gold), recall_at(search, gold)
        row.bm25_p10, row.bm25_r10 = precision_at(bm25, gold), recall_at(bm25, gold)
        k = min(len(gold), K)
        row.rprec, row.bm25_rprec = precision_at(search, gold, k), precision_at(bm25, gold, k)
    if answer is not None:
        row.abstained, row.form, row.seconds = answer.abstained, answer.form, seconds
        row.llm_cached_calls = answer.llm_cached_calls
        row.cited = list(dict.fromkeys(c.paper_id for c in answer.citations))
        if not answer.abstained:
            # A literature answer's groups quote papers' sentences: one claim each, as verified.
            quoted = {g.text for g in answer.groups}
            row.claims, row.supported = claim_support(
                answer.text, answer_passages(answer), scorer, quoted=quoted
            )
        if gold and row.cited:
            hit = len(set(row.cited) & gold)
            row.cited_precision = hit / len(row.cited)
            row.cited_recall = hit / len(gold)
            row.bm25_at_cited_precision = len(set(bm25[: len(row.cited)]) & gold) / len(row.cited)
    return row


def summarize(rows: Sequence[OpenRow], *, min_gold: int = 3) -> dict[str, Figure]:
    """The run's figures: paper precision@10 and recall@10 of the search and of the baseline, and,
    with answers, answered / cited / support on covered questions and the decline rate off-library."""
    covered = [r for r in rows if r.gold]
    off = [r for r in rows if not r.gold]
    figs: dict[str, Figure] = {
        "search_p10": figure([r.p10 for r in covered if r.p10 is not None]),
        "search_r10": figure([r.r10 for r in covered if r.r10 is not None]),
        "bm25_p10": figure([r.bm25_p10 for r in covered if r.bm25_p10 is not None]),
        "bm25_r10": figure([r.bm25_r10 for r in covered if r.bm25_r10 is not None]),
        "search_rprec": figure([r.rprec for r in covered if r.rprec is not None]),
        "bm25_rprec": figure([r.bm25_rprec for r in covered if r.bm25_rprec is not None]),
    }
    answered = [r for r in covered if r.abstained is not None]
    if answered or any(r.abstained is not None for r in off):
        wide = [r for r in answered if len(r.gold) >= min_gold]
        given = [r for r in wide if not r.abstained]
        figs["answered_covered"] = figure([0.0 if r.abstained else 1.0 for r in answered])
        figs[f"answered_topic{min_gold}"] = figure([0.0 if r.abstained else 1.0 for r in wide])
        figs[f"cites{min_gold}_of_answers"] = figure([float(len(r.cited) >= min_gold) for r in given])
        figs["distinct_papers_cited"] = figure([float(len(r.cited)) for r in given])
        figs["support_rate"] = figure(
            [
                r.supported / r.claims
                for r in answered
                if not r.abstained and r.claims and r.supported is not None
            ]
        )
        figs["cited_precision"] = figure([r.cited_precision for r in given if r.cited_precision is not None])
        figs["cited_recall"] = figure([r.cited_recall for r in given if r.cited_recall is not None])
        figs["bm25_at_cited_precision"] = figure(
            [r.bm25_at_cited_precision for r in given if r.bm25_at_cited_precision is not None]
        )
        figs["declined_off_library"] = figure(
            [1.0 if r.abstained else 0.0 for r in off if r.abstained is not None]
        )
        secs = [r.seconds for r in rows if r.seconds is not None and not r.llm_cached_calls]
        figs["seconds_p50"] = Figure(mean=round(statistics.median(secs), 2) if secs else None, n=len(secs))
    return figs


def evaluate_open(
    questions: Sequence[OpenQuestion],
    library_ids: set[str],
    rank_papers: Callable[[str], list[str]],
    baseline: TitleAbstractBM25,
    *,
    ask: Callable[[str], tuple[Answer, float]] | None = None,
    scorer: LexicalSupport | None = None,
    progress: Callable[[int], None] | None = None,
) -> OpenReport:
    """Score every question: the paper ranking against gold papers the library holds (a covered
    question whose gold papers are all missing is skipped), the baseline in the same loop, and with
    ``ask`` the agent's answer."""
    scorer = scorer or LexicalSupport(0.44)
    rows: list[OpenRow] = []
    skipped: list[str] = []
    for q in questions:
        gold = set(q.gold) & library_ids
        if q.gold and not gold:
            skipped.append(q.question)
            if progress:
                progress(1)
            continue
        search = rank_papers(q.question)
        bm25 = baseline.search(q.question, K)
        answer, seconds = ask(q.question) if ask is not None else (None, None)
        rows.append(score_row(q, gold, search, bm25, answer, seconds, scorer))
        if progress:
            progress(1)
    return OpenReport(
        questions=len(questions),
        covered=sum(1 for r in rows if r.gold),
        off_library=sum(1 for r in rows if not r.gold),
        skipped=skipped,
        figures=summarize(rows),
        rows=rows,
    )
