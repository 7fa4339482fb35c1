"""Calibrating the trained models on their calibration questions (by default the held-out train
papers'; the metrics are :mod:`arag.train.metrics`): the
reranker's fusion weight and the bars that maximise the kept set's evidence F1, with the score
histogram recorded in its model card; the support model's Platt scaling and its combination with
the lexical overlap. Pure functions but for reading settings."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel

from arag.models.reranker import Bars
from arag.retrieval.rerank import combine
from arag.settings import Settings
from arag.train.data import Candidates, SupportPair
from arag.train.metrics import ScoreLists, auc, best_threshold, confusion, kept_f1, rank_metrics, rounded


def calibrate_bars(
    cands: Sequence[Candidates],
    scores: ScoreLists,
    *,
    keep: int = 8,
    supported_rank: int = 10,
    grid: int = 24,
) -> tuple[Bars, dict[str, float]]:
    """The (lower, upper >= lower) pair, from score quantiles, with the best mean kept-set F1."""
    flat = np.concatenate([np.asarray(s, dtype=np.float64) for s in scores if len(s)])
    qs = np.unique(np.round(np.quantile(flat, np.linspace(0.02, 0.98, grid)), 4))
    best: tuple[float, Bars, dict[str, float]] | None = None
    for lo in qs:
        for hi in qs[qs >= lo]:
            bars = Bars(lower=float(lo), upper=float(hi))
            m = kept_f1(cands, scores, bars, keep=keep, supported_rank=supported_rank)
            if best is None or m["f1"] > best[0] + 1e-12:
                best = (m["f1"], bars, m)
    assert best is not None
    return best[1], best[2]


def score_histogram(
    cands: Sequence[Candidates],
    scores: ScoreLists,
    *,
    bins: int = 20,
    supported_rank: int = 10,
) -> dict[str, object]:
    """Counts of evidence / other candidates per score bin, split by fused rank group."""
    flat = np.concatenate([np.asarray(s, dtype=np.float64) for s in scores if len(s)])
    edges = np.linspace(float(flat.min()), float(flat.max()), bins + 1)
    groups: dict[str, list[float]] = {
        "top_evidence": [],
        "top_other": [],
        "rest_evidence": [],
        "rest_other": [],
    }
    for c, s in zip(cands, scores, strict=True):
        for i, x in enumerate(s):
            where = "top" if i + 1 <= supported_rank else "rest"
            what = "evidence" if c.hits[i] else "other"
            groups[f"{where}_{what}"].append(float(x))
    return {
        "edges": [round(float(e), 4) for e in edges],
        **{k: np.histogram(v, bins=edges)[0].tolist() for k, v in groups.items()},
    }


WEIGHT_GRID = tuple(round(0.1 * i, 2) for i in range(0, 41))


def combined_scores(scores: ScoreLists, weight: float) -> list[list[float]]:
    """Each list's model scores plus ``weight * -ln(fused rank)`` (see ``retrieval.rerank.combine``)."""
    return [combine(s, list(range(1, len(s) + 1)), weight) for s in scores]


def fit_fusion_weight(
    cands: Sequence[Candidates], scores: ScoreLists, *, grid: Sequence[float] = WEIGHT_GRID
) -> tuple[float, dict[str, float]]:
    """The weight of the fused rank that maximises mean nDCG@10 over ``cands``, and a two-fold
    cross-fitted nDCG@10 (the weight fit on one half, scored on the other) that says how much of
    the gain survives on questions the weight was not fit on."""

    def best(idx: Sequence[int]) -> tuple[float, float]:
        sub = [cands[i] for i in idx]
        sub_scores = [scores[i] for i in idx]
        top = (-1.0, 0.0)
        for w in grid:
            nd = rank_metrics(sub, combined_scores(sub_scores, w))["ndcg@10"]
            if nd > top[0] + 1e-12:
                top = (nd, w)
        return top[1], top[0]

    n = len(cands)
    weight, ndcg = best(range(n))
    halves = [list(range(0, n, 2)), list(range(1, n, 2))]
    crossed: list[float] = []
    for fit, held in (halves, halves[::-1]):
        w, _ = best(fit)
        sub = [cands[i] for i in held]
        crossed.append(rank_metrics(sub, combined_scores([scores[i] for i in held], w))["ndcg@10"])
    return weight, {"ndcg@10": ndcg, "ndcg@10_two_fold": float(np.mean(crossed)) if crossed else 0.0}


class Calibration(BaseModel):
    """The fusion weight and bars fit on the calibration questions, with the figures they give."""

    fusion_weight: float
    bars: Bars
    validation: dict[str, Any]
    calibration: dict[str, Any]


def calibrate_reranker(
    val: Sequence[Candidates], scores: Sequence[np.ndarray], settings: Settings
) -> Calibration:
    """Fit the fusion weight (nDCG@10), then the bars on the final scores (kept-set evidence F1)."""
    rs = settings.rerank
    weight, fit = fit_fusion_weight(val, scores)
    final = combined_scores(scores, weight)
    bars, kept = calibrate_bars(val, final, keep=rs.keep, supported_rank=rs.supported_rank)
    return Calibration(
        fusion_weight=weight,
        bars=bars,
        validation={
            "final": rank_metrics(val, final),
            "final_ndcg@10_two_fold": round(fit["ndcg@10_two_fold"], 4),
            "kept_set": kept,
            "kept_set_without_bars": kept_f1(
                val, final, None, keep=rs.keep, supported_rank=rs.supported_rank
            ),
        },
        calibration={
            "method": "fusion weight: the grid value (0..4 by 0.1) of w in score - w * ln(fused rank) "
            "with the best mean nDCG@10 on the calibration questions (two-fold cross-fit figure beside "
            "it); "
            "bars: the (lower, upper) pair from quantiles of the final scores with the best mean "
            "kept-set evidence F1",
            "histogram": score_histogram(val, final, supported_rank=rs.supported_rank),
        },
    )


# --- the support model ---------------------------------------------------------------------


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
            **rounded(confusion(oof.tolist(), labels.tolist(), threshold)),
        },  # fmt: skip
        "fit_auc": round(auc(probs, labels.tolist()), 4),
        "auc_lexical": round(auc(list(lexical), labels.tolist()), 4),
        "auc_model": round(auc(list(logits), labels.tolist()), 4),
    }
