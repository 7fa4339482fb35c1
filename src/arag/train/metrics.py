"""The trainers' metrics, pure functions: ranking metrics and the kept set's evidence F1 of a
reranker on labelled candidate lists, and AUC / precision / recall / F1 of the claim verifier on
labelled (hypothesis, premise) pairs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from arag.eval.retrieval import mrr_at, ndcg_at, recall_at
from arag.models.reranker import Bars
from arag.retrieval.rerank import select_kept
from arag.train.data import Candidates, SupportPair

# One score per candidate, per question (lists or numpy arrays).
ScoreLists = Sequence[Sequence[float] | np.ndarray]


def reranked_order(scores: Sequence[float] | np.ndarray) -> list[int]:
    """Candidate indices by score, best first; ties keep the fused order."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


def rank_metrics(cands: Sequence[Candidates], scores: ScoreLists) -> dict[str, float]:
    """Mean Recall@5/10, nDCG@10 and MRR@10 of each list reordered by ``scores``."""
    out: dict[str, list[float]] = {"recall@5": [], "recall@10": [], "ndcg@10": [], "mrr@10": []}
    for c, s in zip(cands, scores, strict=True):
        hits = [set(c.hits[i]) for i in reranked_order(s)]
        out["recall@5"].append(recall_at(hits, c.n_gold, 5))
        out["recall@10"].append(recall_at(hits, c.n_gold, 10))
        out["ndcg@10"].append(ndcg_at(hits, c.n_gold, 10))
        out["mrr@10"].append(mrr_at(hits, 10))
    return {k: float(np.mean(v)) if v else 0.0 for k, v in out.items()}


def kept_f1(
    cands: Sequence[Candidates],
    scores: ScoreLists,
    bars: Bars | None,
    *,
    keep: int = 8,
    supported_rank: int = 10,
) -> dict[str, float]:
    """Mean precision, recall and F1 of the kept chunks against the gold paragraphs (QASPER's
    Evidence-F1 on chunks: a kept chunk is right when it holds part of a gold paragraph; an empty
    kept set scores 0, since every question here has evidence), and the mean kept count."""
    p_all, r_all, f_all, n_all = [], [], [], []
    for c, s in zip(cands, scores, strict=True):
        idx = select_kept(list(s), list(range(1, len(s) + 1)), bars, keep=keep, supported_rank=supported_rank)
        n_all.append(len(idx))
        if not idx:
            p_all.append(0.0)
            r_all.append(0.0)
            f_all.append(0.0)
            continue
        good = sum(1 for i in idx if c.hits[i])
        found = set().union(*(set(c.hits[i]) for i in idx))
        p = good / len(idx)
        r = len(found) / c.n_gold if c.n_gold else 0.0
        p_all.append(p)
        r_all.append(r)
        f_all.append(2 * p * r / (p + r) if p + r else 0.0)
    return {
        "precision": float(np.mean(p_all)) if p_all else 0.0,
        "recall": float(np.mean(r_all)) if r_all else 0.0,
        "f1": float(np.mean(f_all)) if f_all else 0.0,
        "kept_mean": float(np.mean(n_all)) if n_all else 0.0,
    }


# --- the claim verifier ---------------------------------------------------------------------


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


def rounded(d: Mapping[str, float]) -> dict[str, float]:
    """Floats to 4 places (counts stay as they are), for model cards."""
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
        **rounded(at),
        "f1_two_fold": round(float(np.mean(crossed)), 4) if crossed else None,
        "accepted_unsupported": accepted,
    }
