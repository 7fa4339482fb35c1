"""The synthesizer: a short answer above an explanation with [n] citations, from the numbered context.
With an LLM, the prompt is shaped by the answer type and the reply is checked: markers that name no
passage are removed (and counted), the short answer is normalised (Yes/No, no placeholders, "not in
the library"). Without one, or when the LLM fails, the answer is extractive: the best-supported
sentences of the top passages. An unrelated question, or no context, gets an abstention."""

from __future__ import annotations

import logging
import re

from arag.agent import prompts
from arag.agent.answer_type import (
    extractive_yes_no,
    normalize_short_answer,
    strip_lead,
    yes_no_of,
)
from arag.agent.context import format_passages
from arag.agent.deps import AgentDeps, ask
from arag.agent.hooks import current_hooks
from arag.agent.literature import format_points, literature_groups, literature_short_answer
from arag.agent.state import AgentState, ContextPassage, Draft, Grade, Step
from arag.agent.terms import (
    cited_numbers,
    clean_citations,
    key_terms,
    sentences,
    strip_citations,
    strip_instructions,
)
from arag.agent.wording import complete_sentences, markers_as_words, ordinals_as_words, this_paper_as_words
from arag.errors import AragError, Cancelled, ModelUnavailable
from arag.llm.base import ChatMessage, next_token
from arag.records import AnswerType
from arag.text import strip_placeholders, tokenize

log = logging.getLogger(__name__)

# Extractive sentences taken from one passage at most (spread the answer over the evidence).
PER_PASSAGE = 2
# A short answer cut from a sentence: at most this many words.
SHORT_WORDS = 12
_MIN_WORDS, _MAX_WORDS = 4, 80
_NUMBER = re.compile(r"\d+(?:[.,]\d+)?%?")
_LABEL_SHORT = re.compile(r"^\W*short\s+answer\W*\s*[:\-–]\s*(?P<v>.*)$", re.I | re.M)
_LABEL_EXPL = re.compile(r"^\W*explanation\W*\s*[:\-–]\s*", re.I | re.M)


def with_marker(sentence: str, n: int) -> str:
    """``sentence`` with a [n] marker before its final punctuation."""
    s = sentence.rstrip()
    if s and s[-1] in ".!?":
        return f"{s[:-1].rstrip()} [{n}]{s[-1]}"
    return f"{s} [{n}]."


def clip(sentence: str, words: int = SHORT_WORDS) -> str:
    parts = sentence.split()
    text = " ".join(parts[:words])
    return text.rstrip(".,;:") + ("…" if len(parts) > words else "")


def extractive_draft(question: str, answer_type: AnswerType, passages: list[ContextPassage], k: int) -> Draft:
    """The ``k`` sentences of the context that hold most of the question's key terms, each cited."""
    terms = key_terms(strip_lead(question))
    scored: list[tuple[float, int, int, str]] = []
    for p in passages:
        for j, s in enumerate(sentences(strip_instructions(strip_placeholders(p.chunk.text))[0])):
            if not _MIN_WORDS <= len(s.split()) <= _MAX_WORDS:
                continue
            have = set(tokenize(s))
            share = sum(t in have for t in terms) / len(terms) if terms else 0.0
            if share > 0:
                scored.append((share, p.n, j, s))
    scored.sort(key=lambda x: (-x[0], x[1], x[2]))
    picked: list[tuple[int, str]] = []
    per: dict[int, int] = {}
    for _, n, _, s in scored:
        if per.get(n, 0) >= PER_PASSAGE:
            continue
        per[n] = per.get(n, 0) + 1
        picked.append((n, s))
        if len(picked) >= k:
            break
    if not picked:
        return abstain_draft("no sentence of the passages holds the question's terms")
    # The paper's own reference markers ("as in [1] and [2]") would read as citations of the context.
    best = strip_citations(picked[0][1])
    if answer_type == "yes_no":
        short = extractive_yes_no(best)
    elif answer_type == "span" and re.match(r"^\s*how\s+(?:many|much)\b", strip_lead(question), re.I):
        num = _NUMBER.search(best)
        short = num.group(0) if num else clip(best)
    else:
        short = clip(best)
    explanation = " ".join(with_marker(s, n) for n, s in picked)
    return Draft(short_answer=short, explanation=explanation, mode="extractive")


def abstain_draft(note: str) -> Draft:
    return Draft(short_answer=prompts.NOT_IN_LIBRARY, explanation="", mode="abstain", notes=[note])


def parse_reply(text: str) -> tuple[str, str]:
    """(short answer, explanation) from "Short answer: ... / Explanation: ..." (labels optional)."""
    text = text.strip()
    m = _LABEL_SHORT.search(text)
    if m is not None:
        short = m.group("v").strip()
        rest = text[m.end() :]
        # "Short answer: X. Explanation: Y" on one line, or a dangling "Explanation" label.
        inline = re.search(r"\s*\bexplanation\b\s*[:\-–]?\s*", short, re.I)
        if inline is not None:
            rest = short[inline.end() :] + rest
            short = short[: inline.start()].strip()
        e = _LABEL_EXPL.search(rest)
        explanation = rest[e.end() :] if e else rest
        if not short and explanation.strip():
            # "Short answer:" alone on its line, the value on the next.
            lines = explanation.strip().splitlines()
            short, explanation = lines[0], "\n".join(lines[1:])
            e = _LABEL_EXPL.search(explanation)
            explanation = explanation[e.end() :] if e else explanation
        return short, " ".join(explanation.split())
    e = _LABEL_EXPL.search(text)
    if e is not None:
        return "", " ".join(text[e.end() :].split())
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) > 1 and len(lines[0].split()) <= 15:
        return lines[0], " ".join(" ".join(lines[1:]).split())
    if len(lines) == 1 and len(lines[0].split()) <= 15:
        # A bare short reply ("[1] 1100", "Yes."): it is the short answer, and its own explanation.
        return lines[0].strip(), lines[0].strip()
    return "", " ".join(text.split())


def _echoes_instructions(short: str) -> bool:
    """Whether a short answer is the prompt's own description of one, copied."""
    text = " ".join(short.lower().strip(" .<>\"'").split())
    if not text:
        return False
    forms = [f.lower() for f in prompts.SYNTH_SHORT_FORMS.values()]
    forms += ["a name, a number or a short phrase", "one short phrase", "short answer"]
    return text in ("...", "…") or any(text == f or (len(text) > 8 and text in f) or f in text for f in forms)


def check_llm_draft(
    raw: str,
    question: str,
    answer_type: AnswerType,
    passages: list[ContextPassage],
    grade: Grade,
    *,
    override_false_abstain: bool,
    extractive_k: int,
) -> Draft:
    """The LLM's reply made safe: valid citations only, a normalised short answer of the right type
    (a pure function of the reply)."""
    short_raw, explanation = parse_reply(raw)
    if _echoes_instructions(short_raw):
        # A small model copied the format's description ("the exact words from a passage") instead of
        # answering: no short answer, the passages supply one below.
        short_raw = ""
    if short_raw.strip() and not key_terms(strip_citations(explanation)):
        # Small models often answer on the short-answer line alone, or explain with a marker alone
        # ("Explanation: [2]"): the short answer is the claim, with those markers, so the verifier has
        # something to check (and an uncited supported claim gets its best passage).
        markers = "".join(f"[{n}]" for n in cited_numbers(explanation))
        explanation = f"{short_raw.strip()} {markers}".strip()
    explanation, removed = clean_citations(strip_placeholders(explanation), range(1, len(passages) + 1))
    explanation = " ".join(explanation.split())
    short = normalize_short_answer(short_raw, answer_type)
    notes: list[str] = []
    if short == prompts.NOT_IN_LIBRARY or (not short and not explanation):
        if override_false_abstain and grade.verdict == "sufficient":
            draft = extractive_draft(question, answer_type, passages, extractive_k)
            return draft.model_copy(
                update={
                    "removed_citations": removed,
                    "notes": ["the LLM said not in the library, but the grader found the context sufficient"],
                }
            )
        return abstain_draft("the LLM found no answer in the passages").model_copy(
            update={"removed_citations": removed}
        )
    stood_in = False
    if explanation and not key_terms(strip_citations(explanation)):
        # "Short answer: Yes / Explanation: [1]": the model points at its evidence without saying it,
        # and a bare "Yes [1]" makes no claim the verifier can check (it abstained on such answers).
        # The cited passage's sentence nearest the question says it, cited, and is checked like any.
        cited = set(cited_numbers(explanation))
        stand_in = extractive_draft(question, answer_type, [p for p in passages if p.n in cited], 1)
        if stand_in.mode == "extractive":
            explanation, stood_in = stand_in.explanation, True
            notes.append(
                "the explanation was markers alone; the cited passage's sentence nearest the question "
                "stands in"
            )
    if answer_type == "yes_no":
        # A stand-in is the passage's words, not the model's argument: it never flips the answer.
        said = None if stood_in else yes_no_of(explanation, strict=True)
        if short not in ("Yes", "No") and said is not None:
            short = said
            notes.append("short answer taken from the explanation's yes/no")
        elif said is not None and said != short:
            # The explanation argues its case; a flipped one-word answer is the likelier slip.
            short = said
            notes.append("short answer flipped to match the explanation")
        elif short not in ("Yes", "No"):
            notes.append("short answer is not yes/no")
    if not short:
        # A placeholder (BIBREF0) or nothing: the best-supported sentence stands in.
        short = extractive_draft(question, answer_type, passages, 1).short_answer
        notes.append("short answer was a placeholder or empty; taken from the passages")
    return Draft(
        short_answer=short, explanation=explanation, mode="llm", removed_citations=removed, notes=notes
    )


def generate(
    deps: AgentDeps, user: str, system: str = prompts.SYNTH_SYSTEM, max_tokens: int | None = None
) -> str:
    """The LLM's reply to a synthesis prompt; streamed piece by piece to the run's ``on_token``
    when it listens (the service), checking for cancellation between pieces."""
    assert deps.llm is not None
    max_tokens = max_tokens or deps.max_answer_tokens
    hooks = current_hooks()
    if hooks is None or hooks.on_token is None:
        return ask(deps.llm, system, user, max_tokens=max_tokens)
    messages = [
        ChatMessage(role="system", content=system),
        ChatMessage(role="user", content=user),
    ]
    pieces: list[str] = []
    stream = deps.llm.stream(messages, max_tokens=max_tokens)
    try:
        for piece in stream:
            hooks.check("synthesizer")
            pieces.append(piece)
            hooks.on_token(piece)
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()  # releases the model's lock when the run stopped early
    return "".join(pieces)


def wants_confidence(deps: AgentDeps) -> bool:
    """Whether an LLM answer is scored for its first token: on, or (``auto``) when the abstention
    rule in use reads those signals. It costs a model call, so nothing else pays for it."""
    mode = deps.settings.answer_confidence
    if mode == "auto":
        return deps.abstention is not None and deps.abstention.reads_llm_signals
    return mode == "on"


def answer_confidence(deps: AgentDeps, user: str) -> dict[str, float]:
    """The model's own reckoning at the start of its short answer: the probability that it begins
    "not (in the library)", the most likely token's probability and the entropy (step counts; empty
    when the backend cannot tell, or when nothing reads them: :func:`wants_confidence`). Read by
    calibrated abstention (models/abstention.py)."""
    if deps.llm is None or not wants_confidence(deps):
        return {}
    messages = [
        ChatMessage(role="system", content=prompts.SYNTH_SYSTEM),
        ChatMessage(role="user", content=user),
    ]
    try:
        scored = next_token(deps.llm, messages, prompts.SHORT_ANSWER_PREFIX, prompts.ABSTAIN_STARTS)
    except (Cancelled, ModelUnavailable):
        raise
    except AragError as exc:
        log.warning("could not score the short answer's first token: %s", exc)
        return {}
    if scored is None:
        return {}
    return {
        "llm_p_abstain": min(1.0, sum(scored.probs.values())),
        "llm_top_p": scored.top[0][1] if scored.top else 0.0,
        "llm_entropy": scored.entropy,
    }


def literature_draft(deps: AgentDeps, question: str, grade: Grade, passages: list[ContextPassage]) -> Draft:
    """An open question's draft: each addressing paper's point, grouped, and (with an LLM) an overview
    of the points, cited by their numbers. The LLM failing costs only the overview."""
    groups = literature_groups(question, grade.parts, passages)
    points = [p for _, pts in groups for p in pts]
    if not points:
        return abstain_draft("no sentence of the papers' passages states a point")
    overview, notes, mode = "", [], "extractive"
    if deps.llm is not None and deps.settings.literature_overview and len(points) >= 2:
        user = prompts.OVERVIEW_USER.format(points=format_points(points), question=question)
        try:
            raw = generate(deps, user, prompts.OVERVIEW_SYSTEM, deps.settings.overview_tokens)
        except Cancelled:
            raise
        except AragError as exc:
            log.warning("overview LLM failed, points only: %s", exc)
            notes.append(f"LLM failed ({exc.what}); points only")
        else:
            text = re.sub(r"^\W*overview\W*[:\-–]\s*", "", raw.strip(), flags=re.I)
            overview, removed = clean_citations(strip_placeholders(text), {p.n for p in points})
            # The 1.5B writes markers as words ("[2] uses ..."), counts papers off in an order the reader
            # never sees ("the second ..."), and runs out of tokens mid-sentence.
            worded = markers_as_words(" ".join(overview.split()))
            ids = {p.n: p.paper_id for p in points}
            overview = complete_sentences(this_paper_as_words(ordinals_as_words(worded, ids), ids))
            mode = "llm" if overview else "extractive"
            if removed:
                notes.append(f"removed {removed} invalid citation(s)")
    n_papers = len({p.paper_id for p in points})
    return Draft(
        short_answer=literature_short_answer([(g, [p.paper_id for p in pts]) for g, pts in groups], n_papers),
        explanation=overview,
        mode=mode,  # type: ignore[arg-type]
        notes=notes,
        overview=overview,
        groups=[(label, [(p.n, p.sentence) for p in pts]) for label, pts in groups],
    )


def make_synthesizer(deps: AgentDeps):
    """The synthesizer node."""
    settings = deps.settings

    def synthesizer(state: AgentState) -> Step:
        question = state["question"]
        answer_type = state.get("answer_type", "free_form")
        passages = list(state.get("context", []))
        grade = state.get("grade") or Grade(verdict="unrelated")
        counts: dict[str, float] = {"passages": len(passages)}
        if grade.verdict == "unrelated" or not passages:
            draft = abstain_draft("; ".join(grade.reasons) or "no passages")
            return Step({"draft": draft}, f"abstain: {draft.notes[0]}", counts)
        if state.get("literature"):
            draft = literature_draft(deps, question, grade, passages)
            counts["papers"] = len({n for _, pts in draft.groups for n, _ in pts})
            decision = f"literature ({draft.mode}): {len(draft.groups)} groups; {draft.short_answer}"
            if draft.notes:
                decision += "; " + "; ".join(draft.notes)
            return Step({"draft": draft}, decision, counts)
        if deps.llm is None:
            draft = extractive_draft(question, answer_type, passages, settings.extractive_sentences)
            how = "extractive"
        else:
            user = prompts.SYNTH_USER.format(
                passages=format_passages(passages),
                question=question,
                instruction=prompts.SYNTH_INSTRUCTIONS[answer_type],
                short_form=prompts.SYNTH_SHORT_FORMS[answer_type],
            )
            try:
                raw = generate(deps, user)
            except (Cancelled, ModelUnavailable):
                # A model process that died fails this answer: an extractive one in its place would
                # be another answer than the one asked for.
                raise
            except AragError as exc:
                log.warning("synthesis LLM failed, answering extractively: %s", exc)
                draft = extractive_draft(question, answer_type, passages, settings.extractive_sentences)
                draft = draft.model_copy(update={"notes": [f"LLM failed ({exc.what}); extractive answer"]})
                how = "extractive (LLM failed)"
            else:
                counts.update(answer_confidence(deps, user))
                draft = check_llm_draft(
                    raw,
                    question,
                    answer_type,
                    passages,
                    grade,
                    override_false_abstain=settings.override_false_abstain,
                    extractive_k=settings.extractive_sentences,
                )
                how = "llm" if draft.mode == "llm" else f"llm -> {draft.mode}"
        counts["removed_citations"] = draft.removed_citations
        decision = f"{how}; short answer {draft.short_answer!r}"
        if draft.removed_citations:
            decision += f"; removed {draft.removed_citations} invalid citation(s)"
        if draft.notes:
            decision += "; " + "; ".join(draft.notes)
        return Step({"draft": draft}, decision, counts)

    return synthesizer
