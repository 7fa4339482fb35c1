"""The calibrated abstention model: after the verifier (and the specialists), one decision from the
answer's signals (the kept passages' rerank scores, the grader's key-term coverage, the retry, the
claims' support, the answer's type and length, the LLM's own probability of saying "not in the
library") whether to give the answer or decline it.

The decision is a logistic model over :data:`FEATURES` and a threshold, both fit by ``arag train
abstention`` on the agent's own answers to QASPER train questions held out of every training
(``arag eval answers --held-out --traces``, rule off), to maximise the official Answer-F1; a rule
whose held-out gain is under one right answer's worth is stored off and the step is not run.
:func:`signals` is pure and is the same function the fit reads traces with; the step itself is
:mod:`arag.agent.abstention`."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from arag.errors import ModelError
from arag.models.reranker import settings_scale
from arag.records import Answer, NodeEvent
from arag.settings import Settings
from arag.text import tokenize

# The answer's signals, in the model's order. Scores are the reranker's final (calibrated) scores.
FEATURES: tuple[str, ...] = (
    "best_score",
    "second_score",
    "mean_top3",
    "context_passages",
    "retries",
    "coverage",
    "missing",
    "empty_queries",
    "citations",
    "min_support",
    "mean_support",
    "dropped_claims",
    "short_words",
    "short_overlap",
    "short_in_question",
    "hedged",
    "yes_no",
    "span",
    "free_form",
    "llm_scored",
    "llm_abstain_logit",
    "llm_top_p",
    "llm_entropy",
)
# The score of a passage that is not there (no context at all): below any bar a reranker sets.
NO_SCORE = -10.0
# Phrases by which an answer says the passages do not give it, while still answering.
_HEDGE = re.compile(
    r"\b(?:not (?:explicitly |directly |clearly )?(?:mention|specif|state|provide|report|discuss|describ|"
    r"given|available|clear)\w*|no (?:information|mention|details?)|unclear|unknown|cannot be determined)\b",
    re.IGNORECASE,
)
FIT = "arag train abstention --traces FILE"


def signals(answer: Answer, events: Sequence[NodeEvent]) -> dict[str, float]:
    """The answer's signals by :data:`FEATURES` name (a pure function of the answer and its run's
    events; an abstention has no citations and no short answer, so its support signals are 0)."""
    context = sorted((c.score for c in answer.chunks if c.n is not None), reverse=True)
    scores = context or sorted((c.score for c in answer.chunks), reverse=True)
    top = scores[:3]
    grader = next((e.counts for e in reversed(events) if e.node == "grader"), {})
    synth = next((e.counts for e in reversed(events) if e.node == "synthesizer"), {})
    # The model's own probability of starting its short answer "not (in the library)", as log-odds
    # (absent for a backend that cannot tell, or an answer not written by the LLM).
    scored = "llm_p_abstain" in synth
    p_not = min(max(float(synth.get("llm_p_abstain", 0.0)), 1e-4), 1 - 1e-4)
    support = [c.support for c in answer.citations if c.support is not None]
    t = answer.answer_type
    short = set(tokenize(answer.short_answer)) if not answer.abstained else set()
    context_words = set(tokenize(" ".join(c.text for c in answer.chunks if c.n is not None)))
    asked = set(tokenize(answer.question))
    return {
        "best_score": top[0] if top else NO_SCORE,
        "second_score": top[1] if len(top) > 1 else NO_SCORE,
        "mean_top3": sum(top) / len(top) if top else NO_SCORE,
        "context_passages": float(len(context)),
        "retries": float(answer.retries),
        "coverage": float(grader.get("coverage", 0.0)),
        "missing": float(grader.get("missing", 0.0)),
        "empty_queries": float(grader.get("empty_queries", 0.0)),
        "citations": float(len(answer.citations)),
        "min_support": min(support) if support else 0.0,
        "mean_support": sum(support) / len(support) if support else 0.0,
        "dropped_claims": float(answer.dropped_claims),
        "short_words": math.log1p(len(answer.short_answer.split())) if not answer.abstained else 0.0,
        # How much of the short answer is the passages' words (a yes or no has none to share).
        "short_overlap": len(short & context_words) / len(short) if short else 0.0,
        # An answer that repeats the question's words says little.
        "short_in_question": len(short & asked) / len(short) if short else 0.0,
        "hedged": float(not answer.abstained and bool(_HEDGE.search(f"{answer.short_answer} {answer.text}"))),
        "yes_no": float(t == "yes_no"),
        "span": float(t == "span"),
        "free_form": float(t == "free_form"),
        "llm_scored": float(scored),
        "llm_abstain_logit": math.log(p_not / (1 - p_not)) if scored else 0.0,
        "llm_top_p": float(synth.get("llm_top_p", 0.0)),
        "llm_entropy": float(synth.get("llm_entropy", 0.0)),
    }


class AbstentionRule(BaseModel):
    """The fitted decision: standardised features, logistic weights and the probability of "decline
    scores better" at or above which an answer is declined (``inf``: the rule is off)."""

    features: list[str] = Field(default_factory=lambda: list(FEATURES))
    mean: list[float]
    scale: list[float]
    weights: list[float]
    bias: float
    threshold: float = math.inf
    # How it was fit: the traces, the split, the figures (cross-validated on the fit questions).
    fit: dict[str, Any] = Field(default_factory=dict)

    @property
    def active(self) -> bool:
        return math.isfinite(self.threshold)

    @property
    def reads_llm_signals(self) -> bool:
        """Whether the decision weighs the LLM's own next-token signals (then the answer must be
        scored for them: ``ARAG_AGENT__ANSWER_CONFIDENCE=auto``)."""
        return self.active and any(
            name.startswith("llm_") and w != 0.0 for name, w in zip(self.features, self.weights, strict=True)
        )

    def p_decline(self, values: Mapping[str, float]) -> float:
        """The model's probability that declining scores better than answering."""
        z = self.bias
        for name, m, s, w in zip(self.features, self.mean, self.scale, self.weights, strict=True):
            z += w * (float(values.get(name, 0.0)) - m) / s
        return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, z))))


def save_rule(path: Path, rule: AbstentionRule) -> None:
    """Write the rule atomically (a crash leaves the old one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    # JSON has no infinity: an off rule is stored with a null threshold.
    data = rule.model_dump()
    data["threshold"] = rule.threshold if rule.active else None
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def load_rule(path: Path) -> AbstentionRule:
    """The rule stored at ``path``; a ModelError naming the fix when it is missing or unreadable."""
    if not path.is_file():
        raise ModelError(
            f"no abstention rule at {path}",
            where="ARAG_ABSTENTION__PROVIDER=fitted",
            fix=f"fit it with `{FIT}`, or set ARAG_ABSTENTION__PROVIDER=none",
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("threshold") is None:
            data["threshold"] = math.inf
        rule = AbstentionRule.model_validate(data)
    except ValueError as exc:
        raise ModelError(
            f"the abstention rule at {path} is unreadable ({exc})",
            where=str(path),
            fix=f"fit it again: `{FIT}`",
        ) from exc
    unknown = sorted(set(rule.features) - set(FEATURES))
    if unknown or not (len(rule.features) == len(rule.mean) == len(rule.scale) == len(rule.weights)):
        raise ModelError(
            f"the abstention rule at {path} does not match this version's signals ({unknown or 'sizes'})",
            where=str(path),
            fix=f"fit it again: `{FIT}`",
        )
    return rule


def get_abstention(settings: Settings) -> AbstentionRule | None:
    """The rule the settings select; None when off, or (``auto``) when none has been fit."""
    s = settings.abstention
    if s.provider == "none":
        return None
    path = settings.abstention_path
    if s.provider == "auto" and not path.is_file():
        return None
    rule = load_rule(path)
    if rule.active:
        check_scale(rule, settings_scale(settings), where=str(path))
    return rule


def check_scale(rule: AbstentionRule, scale: str, *, where: str) -> None:
    """A ModelError unless ``rule`` was fit on answers whose rerank scores are on ``scale``
    (:func:`arag.models.reranker.score_scale`): its weights and threshold read those scores, and
    another reranker, length, fusion weight or bars moves them."""
    fit = rule.fit.get("reranker")
    if fit == scale:
        return
    refit = (
        "trace the held-out questions again with this reranker (`ARAG_ABSTENTION__PROVIDER=none arag eval "
        f"answers --questions <train file> --held-out --configs full --traces FILE`), then `{FIT}`; or set "
        "ARAG_ABSTENTION__PROVIDER=none"
    )
    said = f"the reranker {fit}" if fit else "a reranker it does not name (fit by an older arag)"
    raise ModelError(
        f"the abstention rule was fit on answers ranked by {said}, and the reranker in use is {scale}",
        where=where,
        fix=refit,
    )
