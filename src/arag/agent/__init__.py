"""The answering agent: a LangGraph graph that routes, plans, retrieves, grades, reformulates once,
builds a pruned and budgeted context, writes a cited answer and verifies it."""

from arag.agent.graph import Agent, build_agent
from arag.agent.support import LexicalSupport, LLMJudgeSupport, SupportScorer

__all__ = ["Agent", "LLMJudgeSupport", "LexicalSupport", "SupportScorer", "build_agent"]
