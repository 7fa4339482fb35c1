"""Fitting the calibrated abstention (``arag train abstention --traces TRACES``).

TRACES is what ``arag eval answers --held-out --traces`` wrote for questions of the QASPER train
papers held out of every training, with no abstention rule in use: per question, the agent's answer,
its official Answer-F1 and its signals (:func:`arag.models.abstention.signals`). For each answer the
agent gave, declining would score the Answer-F1 of "Unanswerable" instead. A weighted logistic
regression learns when declining scores better (weight: by how much), and the decline threshold is
the one with the best mean Answer-F1 over the fit questions, chosen on cross-validated probabilities.
The rule is turned on only when a nested estimate gains (each fold decided by a model and a threshold
chosen on the other folds alone), so that a question never helps choose its own decision. Pure
functions but for :func:`load_cases`."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from arag.errors import InputError
from arag.eval.answers import AnswerQuestion, traced_answers
from arag.eval.qasper_metrics import UNANSWERABLE, references_for_question, score_references
from arag.models.abstention import FEATURES, AbstentionRule

# The rule is turned on only when it adds this many right answers' worth of Answer-F1 over the fit
# questions (cross-validated): a smaller gain is a lucky question or two (as for the specialists).
MIN_GAIN_ANSWERS = 1.0
FOLDS = 5
# L2 penalty on the standardised weights: with a few hundred questions and a few dozen unanswerable,
# an unpenalised fit separates on noise.
L2 = 1.0


@dataclass(frozen=True)
class Case:
    """One fit question: its kind, the agent's answer's Answer-F1, what declining would score, and
    the answer's signals (None: the agent abstained already, so there is nothing to decline)."""

    question_id: str
    kind: str
    answer_f1: float
    decline_f1: float
    x: tuple[float, ...] | None

    @property
    def unanswerable(self) -> bool:
        return self.kind == "unanswerable"


def fold_of(question_id: str, folds: int = FOLDS) -> int:
    """A question's cross-validation fold (by a hash of its id: fixed, independent of order)."""
    return int(hashlib.sha1(question_id.encode()).hexdigest(), 16) % folds


def fit_logistic(x: np.ndarray, y: np.ndarray, w: np.ndarray, l2: float = L2) -> tuple[np.ndarray, float]:
    """Weighted, L2-penalised logistic regression by Newton's method (the bias is not penalised):
    the weights and the bias for ``x`` already standardised."""
    n, d = x.shape
    xb = np.hstack([x, np.ones((n, 1))])
    beta = np.zeros(d + 1)
    penalty = np.full(d + 1, l2)
    penalty[-1] = 0.0
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-np.clip(xb @ beta, -50, 50)))
        grad = xb.T @ (w * (p - y)) + penalty * beta
        hess = (xb * (w * p * (1 - p))[:, None]).T @ xb + np.diag(penalty) + 1e-9 * np.eye(d + 1)
        step = np.linalg.solve(hess, grad)
        beta -= step
        if float(np.max(np.abs(step))) < 1e-8:
            break
    return beta[:-1], float(beta[-1])


def standardise(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    return mean, np.where(scale > 1e-9, scale, 1.0)


def _fit(cases: Sequence[Case]) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    x = np.asarray([c.x for c in cases], dtype=np.float64)
    gain = np.asarray([c.decline_f1 - c.answer_f1 for c in cases])
    mean, scale = standardise(x)
    keep = np.abs(gain) > 1e-9  # a case declining leaves unchanged teaches nothing
    if not keep.any():
        return mean, scale, np.zeros(x.shape[1]), -50.0
    weights, bias = fit_logistic((x[keep] - mean) / scale, (gain[keep] > 0).astype(float), np.abs(gain[keep]))
    return mean, scale, weights, bias


def _predict(
    mean: np.ndarray, scale: np.ndarray, weights: np.ndarray, bias: float, cases: Sequence[Case]
) -> np.ndarray:
    x = np.asarray([c.x for c in cases], dtype=np.float64)
    return 1.0 / (1.0 + np.exp(-np.clip(((x - mean) / scale) @ weights + bias, -50, 50)))


def cross_validated(cases: Sequence[Case], folds: int = FOLDS) -> np.ndarray:
    """Each case's decline probability from a model fit on the other folds."""
    return _out_of_fold(cases, np.asarray([fold_of(c.question_id, folds) for c in cases]))


def _out_of_fold(cases: Sequence[Case], ids: np.ndarray) -> np.ndarray:
    out = np.zeros(len(cases))
    for f in sorted(set(ids.tolist())):
        test = ids == f
        train = [c for c, t in zip(cases, test, strict=True) if not t]
        if not train:
            continue
        m, s, w, b = _fit(train)
        out[test] = _predict(m, s, w, b, [c for c, t in zip(cases, test, strict=True) if t])
    return out


def nested_gain(cases: Sequence[Case], folds: int = FOLDS) -> tuple[float, set[str]]:
    """The rule's gain (in answers) when each fold is decided by a model *and a threshold* chosen
    on the other folds alone (the threshold on their own out-of-fold probabilities), and the
    questions so declined. Choosing the threshold on every question's cross-validated probability
    lets each question help choose its own decision; this estimate does not."""
    ids = np.asarray([fold_of(c.question_id, folds) for c in cases])
    gains = np.asarray([c.decline_f1 - c.answer_f1 for c in cases])
    total, declined = 0.0, set()
    for f in sorted(set(ids.tolist())):
        test = ids == f
        inner = [c for c, t in zip(cases, test, strict=True) if not t]
        if len({int(i) for i in ids[~test]}) < 2:
            continue  # no inner folds to choose a threshold on: the fold is not declined
        t, _ = best_threshold(gains[~test], _out_of_fold(inner, ids[~test]))
        m, s, w, b = _fit(inner)
        held = [c for c, x in zip(cases, test, strict=True) if x]
        for c, p, g in zip(held, _predict(m, s, w, b, held), gains[test], strict=True):
            if p >= t:
                total += float(g)
                declined.add(c.question_id)
    return total, declined


def best_threshold(gains: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    """The decline threshold with the largest summed gain (declining every case with p >= it) and
    that gain; (inf, 0) when no threshold gains."""
    best_t, best_g = math.inf, 0.0
    order = np.argsort(-probs, kind="stable")
    total = 0.0
    for i, k in enumerate(order):
        total += float(gains[k])
        # A threshold must fall between distinct probabilities.
        if i + 1 < len(order) and probs[order[i + 1]] == probs[k]:
            continue
        if total > best_g + 1e-12:
            best_t, best_g = float(probs[k]), total
    return best_t, best_g


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """The area under the ROC curve (ties count half); None without both labels."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def shares(cases: Sequence[Case], declined: set[str]) -> dict[str, float | None]:
    """Unanswerable questions declined and answerable ones answered (the issue's two shares)."""
    un = [c for c in cases if c.unanswerable]
    an = [c for c in cases if not c.unanswerable]

    def gave(c: Case) -> bool:
        return c.x is not None and c.question_id not in declined

    return {
        "declined_unanswerable": round(sum(not gave(c) for c in un) / len(un), 4) if un else None,
        "answered_answerable": round(sum(gave(c) for c in an) / len(an), 4) if an else None,
    }


def fit_rule(cases: Sequence[Case], *, fit_on: str, reranker: str | None = None) -> AbstentionRule:
    """The rule: a model fit on every answered case, the threshold chosen on cross-validated
    probabilities, off when the nested estimate (:func:`nested_gain`) gains under MIN_GAIN_ANSWERS;
    and the figures of the fit (the "after" shares are the nested decisions'). ``reranker``: the
    scale of the traces' rerank scores (:func:`arag.models.reranker.score_scale`), which the rule
    then requires."""
    answered = [c for c in cases if c.x is not None]
    if len(answered) < FOLDS * 2:
        raise InputError(
            f"only {len(answered)} answered questions in the traces: too few to fit an abstention rule",
            where="arag train abstention",
            fix="trace more held-out train questions (`arag eval answers --held-out` without --limit)",
        )
    gains = np.asarray([c.decline_f1 - c.answer_f1 for c in answered])
    probs = cross_validated(answered)
    t, g = best_threshold(gains, probs)
    # On only when a rule whose threshold, too, was chosen without the question gains: the gain at
    # the best threshold on all the probabilities flatters it (a rule with +2.1 answers that way had
    # -0.8 nested, and lost 0.025 Answer-F1 on validation).
    g_nested, declined = nested_gain(answered)
    on = g_nested >= MIN_GAIN_ANSWERS
    n = len(cases)
    before = sum(c.answer_f1 for c in cases) / n
    after = before + g_nested / n
    mean, scale, weights, bias = _fit(answered)
    cv_auc = auc(list(probs), [c.unanswerable for c in answered])
    figures: dict[str, Any] = {
        "fit_on": fit_on,
        "reranker": reranker,
        "questions": n,
        "answered": len(answered),
        "unanswerable": sum(c.unanswerable for c in cases),
        "gain_answers": round(g_nested, 3),
        "gain_answers_best_threshold": round(g, 3),
        "min_gain_answers": MIN_GAIN_ANSWERS,
        "answer_f1_before": round(before, 4),
        "answer_f1_after_cv": round(after, 4),
        "auc_unanswerable_cv": None if cv_auc is None else round(cv_auc, 4),
        "declined_cv": len(declined),
        "before": shares(cases, set()),
        "after_cv": shares(cases, declined),
        "best_threshold_cv": None if not math.isfinite(t) else round(t, 4),
        "weights": {f: round(float(w), 4) for f, w in zip(FEATURES, weights, strict=True)},
    }
    return AbstentionRule(
        features=list(FEATURES),
        mean=[float(v) for v in mean],
        scale=[float(v) for v in scale],
        weights=[float(v) for v in weights],
        bias=bias,
        threshold=t if on else math.inf,
        fit=figures,
    )


def load_cases(traces: Path, questions: Sequence[AnswerQuestion], *, config: str = "full") -> list[Case]:
    """The fit cases: each traced one-paper answer of ``config`` to a question of ``questions``."""
    if not traces.is_file():
        raise InputError(
            f"no traces file at {traces}",
            where="arag train abstention",
            fix="write one with `arag eval answers --questions <train file> --held-out --configs full "
            "--traces FILE` (with ARAG_ABSTENTION__PROVIDER=none)",
        )
    cases: list[Case] = []
    for i, row, q in traced_answers(traces, questions, config=config):
        if any(d.get("node") == "abstention" for d in row.decisions):
            raise InputError(
                f"line {i} of the traces was answered with an abstention rule in use",
                where=str(traces),
                fix="trace the questions again with ARAG_ABSTENTION__PROVIDER=none: a rule is fit on "
                "the answers as they are without one",
            )
        if not row.abstained and not row.signals:
            raise InputError(
                f"line {i} of the traces has no signals (written by an older arag)",
                where=str(traces),
                fix="trace the questions again with this version of `arag eval answers`",
            )
        refs = references_for_question(q.answers, text_evidence_only=True, where=q.question_id)
        cases.append(
            Case(
                question_id=q.question_id,
                kind=q.kind,
                answer_f1=row.answer_f1,
                decline_f1=score_references(UNANSWERABLE, [], refs).answer_f1,
                x=None if row.abstained else tuple(float(row.signals.get(f, 0.0)) for f in FEATURES),
            )
        )
    return cases


def traced_scale(traces: Path, questions: Sequence[AnswerQuestion], *, config: str = "full") -> str | None:
    """The scale of the rerank scores the traced answers were given with (None: traces of an older
    arag, which did not say); an InputError when they were answered with different rerankers."""
    scales = {row.reranker for _, row, _ in traced_answers(traces, questions, config=config)}
    if len(scales) > 1:
        named = "; ".join(sorted(str(s) for s in scales))
        raise InputError(
            f"the traces were answered with different rerankers ({named})",
            where=str(traces),
            fix="fit on traces of one reranker: trace the questions again with the one in use",
        )
    return next(iter(scales), None)
