"""The abstention step: after the verifier (and the specialists), the fitted rule of
:mod:`arag.models.abstention` declines a one-paper answer whose signals say that declining scores
better than answering (fit on held-out QASPER train papers, never on validation)."""

from __future__ import annotations

from arag.agent import prompts
from arag.agent.deps import AgentDeps
from arag.agent.state import AgentState, Step
from arag.agent.verifier import abstain_text
from arag.models.abstention import signals
from arag.records import Answer


def uses_abstention(deps: AgentDeps) -> bool:
    """Whether the step has anything to do: a rule that is on."""
    return deps.abstention is not None and deps.abstention.active


def make_abstention(deps: AgentDeps):
    """The abstention node: declines a one-paper answer the rule finds too weak to give."""
    rule = deps.abstention

    def abstention(state: AgentState) -> Step:
        answer: Answer = state["answer"]
        if rule is None or answer.route != "research" or answer.form != "answer" or answer.abstained:
            return Step({}, "not an answer to decline", {})
        p = rule.p_decline(signals(answer, list(state.get("events", []))))
        counts = {"p_decline": round(p, 3)}
        if p < rule.threshold:
            return Step({}, f"answered (decline p={p:.2f} < {rule.threshold:.2f})", counts)
        text = abstain_text(list(state.get("closest", [])))
        text += (
            f"\n\nA draft answer was withheld: its evidence looks too weak to answer from "
            f"(decline p={p:.2f}, bar {rule.threshold:.2f})."
        )
        new = answer.model_copy(
            update={
                "short_answer": prompts.NOT_IN_LIBRARY,
                "text": text,
                "citations": [],
                "abstained": True,
                "mode": "abstain",
            }
        )
        # The withheld short answer stays in the trace: `arag eval answers` scores the same answers
        # without the rule from it (eval/rule_effect.py), a paired measure of what the rule does.
        decision = (
            f"abstain: decline p={p:.2f} >= {rule.threshold:.2f}; "
            f"withheld short answer {answer.short_answer!r}"
        )
        return Step({"answer": new}, decision, counts)

    return abstention
