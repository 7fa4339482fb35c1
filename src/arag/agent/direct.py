"""Messages answered without retrieval: greetings, thanks, small talk and arithmetic."""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from typing import Any

from arag.agent import prompts

GREETING = re.compile(
    r"^\s*(?:hi|hello|hey|hiya|howdy|yo|greetings|good\s+(?:morning|afternoon|evening|day))\b"
    r"[\s!.,:;)(-]*(?:there|arag|all|everyone|again|friend)?[\s!.,:;)(-]*$",
    re.I,
)
THANKS = re.compile(r"^\s*(?:thanks|thank\s+you|thx|ty|cheers|much\s+appreciated)\b[\w\s!.,]{0,25}$", re.I)
FAREWELL = re.compile(r"^\s*(?:bye|goodbye|see\s+you|farewell|good\s*night)\b[\w\s!.,]{0,20}$", re.I)
SMALL_TALK = re.compile(
    r"^\s*(?:how\s+are\s+you|how's\s+it\s+going|what'?s\s+up|sup|tell\s+me\s+a\s+joke|"
    r"nice\s+to\s+meet\s+you|are\s+you\s+(?:a\s+)?(?:human|robot|bot|real)|ok(?:ay)?|cool|great|nice|"
    r"lol|good\s+job|well\s+done)\b[\w\s!.,?']{0,30}$",
    re.I,
)

_ARITH_LEAD = re.compile(
    r"^\s*(?:what(?:'s|\s+is|\s+are)|calculate|compute|evaluate|how\s+much\s+is|solve)?\s*(?P<expr>.+?)"
    r"\s*[?=.!]*\s*$",
    re.I,
)
_WORD_OPS = (
    (r"\bmultiplied\s+by\b|\btimes\b|×", "*"),
    (r"\bdivided\s+by\b|\bover\b|÷", "/"),
    (r"\bplus\b", "+"),
    (r"\bminus\b", "-"),
    (r"\bto\s+the\s+power\s+of\b|\^", "**"),
    (r"\bmod(?:ulo)?\b", "%"),
    (r"(?<=\d)\s*x\s*(?=\d)", "*"),
)
_EXPR = re.compile(r"^[\d\s.+\-*/%()]+$")
_OPS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def arithmetic_expression(message: str) -> str | None:
    """The arithmetic expression a message asks to evaluate ('what is 12*7', '3 plus 4'), or None."""
    m = _ARITH_LEAD.match(message)
    if m is None:
        return None
    expr = m.group("expr")
    for pattern, op in _WORD_OPS:
        expr = re.sub(pattern, op, expr, flags=re.I)
    expr = expr.strip()
    if not _EXPR.match(expr) or not re.search(r"\d", expr) or not re.search(r"\d\s*[-+*/%]", expr):
        return None
    try:
        ast.parse(expr, mode="eval")
    except SyntaxError:
        return None
    return expr


def _eval(node: ast.AST) -> float | int:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        # Refuse exponents that would take long or overflow.
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 10**6):
            raise ValueError("exponent too large")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError(f"not arithmetic: {ast.dump(node)}")


def evaluate(expr: str) -> str:
    """The value of an arithmetic expression, formatted (integers without a decimal point)."""
    try:
        value = _eval(ast.parse(expr, mode="eval"))
    except ZeroDivisionError:
        return "undefined (division by zero)"
    except (ValueError, OverflowError):
        return "too large to compute here"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "too large to compute here"
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.10g}"
    return str(value)


def fixed_reply(message: str) -> str | None:
    """The canned reply for a greeting, thanks or farewell; None for anything else."""
    if GREETING.match(message):
        return prompts.GREETING_REPLY
    if THANKS.match(message):
        return prompts.THANKS_REPLY
    if FAREWELL.match(message):
        return prompts.FAREWELL_REPLY
    return None


def is_chitchat(message: str) -> bool:
    """Greetings, thanks, farewells and small talk."""
    return fixed_reply(message) is not None or SMALL_TALK.match(message) is not None
