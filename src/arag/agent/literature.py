"""The literature answer: an open question (one that names no paper) answered across the library.

Pure functions the retriever, grader, context, synthesizer and verifier nodes call when the question
names no paper and the retrieval ranked papers:

- which ranked papers *address* the question: their passages (and title) hold most of the question's
  key terms and every name it asks about; no paper addresses it -> abstain (the library lacks it);
- each paper's *point*: the sentence of its best passages that holds most of the question's terms,
  preferring the sentence that says what the paper does ("we propose ..."), cited [n] (extractive:
  the local LLM is too slow to summarise ten papers one by one on a CPU);
- *groups*: for a compound question, one group per part; otherwise papers grouped by a term their
  titles and points share beyond the question's (the approach they have in common);
- an optional LLM *overview* of the points (two or three cited sentences), checked like any claim.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from arag.agent.answer_type import strip_lead
from arag.agent.state import ContextPassage, Evidence, Grade, PaperPart, QueryPapers
from arag.agent.terms import (
    about_others,
    entities,
    exclaims,
    has_entity,
    held_share,
    key_terms,
    sentences,
    strip_citations,
    strip_instructions,
    strip_self_reference,
    term_words,
    unfinished,
)
from arag.records import RankedPaper
from arag.text import LATEX_CITE_PATTERN, has_placeholder, held_terms, strip_placeholders, tokenize

# Words of an open question's frame ("how do researchers usually ...") that no passage needs to hold.
_FRAME = frozenset(
    tokenize(
        "researchers researcher research common commonly typical typically usually existing current "
        "automatically automatic ways approach approaches technique techniques methods people summarise "
        "summarize overview literature survey various different main state art recent recently "
        "best good better way"
    )
)
# Approaches papers are grouped by: a label, and the words (in a paper's title or point) that put it
# there. A category the question itself names (every paper would share it) is not used.
_APPROACH_WORDS = (
    ("Pre-trained transformers (BERT and kin)",
     r"bert|roberta|xlnet|gpt-?\d?|elmo|transformers?|pre-?trained language models?"),
    ("Transfer and multi-task learning",
     r"transfer learning|multi-?task|domain adaptation|cross-?lingual transfer|zero-?shot|few-?shot"),
    ("Neural networks (CNN, RNN, attention)",
     r"cnns?|convolutional|lstms?|bi-?lstm|rnns?|recurrent|gru|capsule|attention|neural networks?|"
     r"deep learning|encoder-decoder|seq2seq"),
    ("Graphs and social context",
     r"graphs?|propagation|diffusion|social context|user profiles?|network structure|"
     r"conversation structure|meta-?data"),
    ("Knowledge, evidence and retrieval",
     r"knowledge bases?|knowledge graphs?|evidence|retriev\w*|external sources|fact-?check\w*|wikipedia"),
    ("Features and classic classifiers",
     r"features?|svms?|support vector|logistic regression|random forests?|naive bayes|lexicons?|"
     r"linguistic cues|n-?grams?|hand-?crafted|rule-?based"),
    ("Unsupervised and weak supervision",
     r"unsupervised|distant(?:ly)? supervis\w*|weak(?:ly)? supervis\w*|self-?training|semi-?supervised|"
     r"clustering"),
    ("Multimodal", r"multi-?modal|images?|visual|audio|speech|video"),
    ("Datasets, corpora and shared tasks",
     r"datasets?|corpus|corpora|annotat\w*|benchmarks?|shared tasks?|crowd-?sourc\w*"),
)  # fmt: skip
APPROACHES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (label, re.compile(rf"\b(?:{words})\b", re.I)) for label, words in _APPROACH_WORDS
)
# A sentence that says what the paper itself does.
_CUE = re.compile(
    r"\b(?:we|this\s+(?:paper|work|study|article)|our\s+(?:model|approach|method|system|work))\s+"
    r"(?:\w+\s+){0,2}(?:propose|present|introduce|describe|develop|build|show|use|apply|explore|"
    r"investigate|study|design|train|evaluate|find|demonstrate|compare|analy[sz]e|create|release)",
    re.I,
)
_ANAPHORA = re.compile(r"^\W*(?:it|this|these|those|they|such|there|however|thus|hence|therefore)\b", re.I)
# A sentence that speaks of the paper itself, and one that names other papers' work.
_SELF = re.compile(r"\b(?:we|our|this\s+(?:paper|work|study|article))\b", re.I)
# A citation key left in the text where a reference was ("EMNLP19DaSanMartino",
# "jean-EtAl:2015:ACL-IJCNLP"): like a stand-in, it cites other work.
_CITATION_KEY = re.compile(
    r"\b(?:ACL|EMNLP|NAACL|EACL|COLING|AAAI|IJCAI|ICLR|ICML|NIPS|NeurIPS|LREC|CoNLL)\d{2,4}[A-Z][a-z]"
    r"|\bEtAl:\d{4}"
    rf"|{LATEX_CITE_PATTERN}"  # a LaTeX citation an arXiv abstract kept (removed from what is shown)
)
_OTHERS_WORK = re.compile(
    r"\bet\s+al\b|\btheir\s+(?:work|model|approach|method|system|paper|study)s?\b|"
    r"\b(?:previous|prior|earlier|existing)\s+(?:work|studies|approaches|methods|research|systems)\b",
    re.I,
)
POINT_MIN_WORDS, POINT_MAX_WORDS = 6, 60
# A later part that refers back to one paper, or to the first part's papers.
_ONE = r"it|its|this\s+paper|the\s+paper"
_REFERS_TO_ONE = re.compile(rf"\b(?:{_ONE})\b", re.I)
_REFERS_BACK = re.compile(rf"\b(?:{_ONE}|they|their|them|these\s+papers)\b", re.I)
# A first part that asks for one paper ("What work has been done on X" asks for the literature:
# "work" is no count noun there).
_ASKS_ONE_PAPER = re.compile(r"^\W*(?:which|what)\s+(?:paper|study|article)\b", re.I)
_QA_TOPIC = re.compile(r"\bquestion[- ]answering\b|\banswer(?:s|ing)?\s+(?:\w+\s+){0,2}questions\b", re.I)
# Share of the focus terms a paper's title and abstract must hold for the question to be its subject
# (a third: "replace" alone is not what "How do I replace the brake pads on a bicycle?" is about).
ABOUT_COVERAGE = 1 / 3
# Share of the focus terms a paper's passages must hold to address the question.
ADDRESS_COVERAGE = 0.5
MAX_GROUPS = 4


class Point(BaseModel):
    """A paper's point: the sentence and the context number of its passage."""

    model_config = ConfigDict(frozen=True)

    n: int
    paper_id: str
    title: str
    sentence: str


def focus_terms(question: str) -> list[str]:
    """The key terms a paper must hold to address an open question: the question's, less its frame
    and any words about the assistant itself. "Question answering" is a topic here, though "question"
    and "answer" are generic words in a question about one paper."""
    terms = [t for t in key_terms(strip_self_reference(question)) if t not in _FRAME]
    if _QA_TOPIC.search(question):
        terms += [t for t in tokenize("question answering") if t not in terms]
    return terms


def about(paper: RankedPaper, terms: Sequence[str], names: Sequence[str]) -> bool:
    """Whether the question is a paper's subject, not an example in one of its passages: an abstract
    search found it, and its title or abstract holds a third of the question's terms; when the
    question has names, one of them or half its terms ("NLP" is rarely written in a code-mixing
    abstract).
    "Which team won the 2018 FIFA World Cup?" met by an entity-linking paper's example passage is
    not a topic of the library."""
    if paper.abstract is None:
        return False
    text = f"{paper.title} {paper.abstract}"
    held = held_terms(text)
    if names:
        return any(has_entity(e, text.lower()) for e in names) or held_share(terms, held) >= ADDRESS_COVERAGE
    return held_share(terms, held) >= ABOUT_COVERAGE


def addresses(texts: Sequence[str], terms: Sequence[str], names: Sequence[str]) -> bool:
    """Whether a paper's texts (title, passages) hold enough of the question's terms and every name."""
    joined = " ".join(texts)
    if not terms and not names:
        return bool(joined.strip())
    lower = joined.lower()
    if any(not has_entity(e, lower) for e in names):
        return False
    # With one or two terms, half is a single word: "the capital of Australia" met by a GeoQA paper's
    # "capital-of" relation. A short question's terms must all be there.
    needed = 1.0 if len(terms) <= 2 else ADDRESS_COVERAGE
    return held_share(terms, held_terms(joined)) >= needed


def paper_texts(paper_id: str, evidence: Sequence[Evidence]) -> list[str]:
    """A paper's title and the text of each of its evidence chunks."""
    chunks = [e.chunk for e in evidence if e.chunk.paper_id == paper_id]
    if not chunks:
        return []
    return [chunks[0].title, *(f"{c.section or ''} {c.text}" for c in chunks)]


def addressing_parts(
    plan: Sequence[str],
    rankings: Sequence[QueryPapers],
    evidence: Sequence[Evidence],
    *,
    per_part: int,
    min_ratio: float = 0.0,
) -> list[PaperPart]:
    """For each planned part, the ranked papers that address it (its own terms), best first over the
    passes, at most ``per_part``. A later part that refers back ("which paper learns X, and what data
    was *it* evaluated on?") is about the first part's papers: only those, and at least its first."""
    parts: list[PaperPart] = []
    for i, target in enumerate(plan):
        terms = focus_terms(target)
        names = entities(strip_self_reference(target))
        best: dict[str, tuple[int, int]] = {}
        score: dict[str, float] = {}
        for r in rankings:
            if r.target != target:
                continue
            top = max((p.score for p in r.papers), default=0.0)
            for p in r.papers:
                if not about(p, terms, names):
                    continue
                key = (r.pass_index, p.rank)
                if p.paper_id not in best or key < best[p.paper_id]:
                    best[p.paper_id] = key
                # Evidence relative to the ranking's best paper: a paper found by one stray hit deep
                # in one list is not on the topic, whatever words it shares.
                ratio = p.score / top if top > 0 else 1.0
                score[p.paper_id] = max(score.get(p.paper_id, 0.0), ratio)
        ordered = [pid for pid in sorted(best, key=lambda pid: best[pid]) if score[pid] >= min_ratio]
        ok = [pid for pid in ordered if addresses(paper_texts(pid, evidence), terms, names)]
        if i > 0 and parts[0].paper_ids and refers_to_its_paper(plan[0], target):
            ok = parts[0].paper_ids[:1]
        elif i > 0 and parts[0].paper_ids and _REFERS_BACK.search(without_carried(target)):
            first = parts[0].paper_ids
            ok = [pid for pid in ok if pid in first] or first[:1]
        parts.append(PaperPart(target=target, paper_ids=ok[:per_part]))
    return parts


def refers_to_its_paper(first: str, part: str) -> bool:
    """Whether a later part asks about the one paper the first part asks for ("Which paper learns X,
    and what data was *it* evaluated on?"): that part is a question about the first part's best paper,
    searched in that paper alone (searched across the library, "what data was it evaluated on" found
    other ontology papers' evaluation sentences, and the answer cited them for the data part)."""
    return bool(_ASKS_ONE_PAPER.match(first) and _REFERS_TO_ONE.search(without_carried(part)))


def without_carried(target: str) -> str:
    """A sub-query without the words the planner carried into it from the first clause ("(...)")."""
    return re.sub(r"\s*\([^)]*\)\s*$", "", target)


def point_score(
    sentence: str, terms: Sequence[str], *, abstract: bool, section: str | None = None, cites: bool = False
) -> float:
    """How well a sentence states a paper's point on the question (``section``: its passage's;
    ``cites``: the sentence cited other work, a stand-in the text no longer shows)."""
    have = set(tokenize(sentence))
    share = sum(t in have for t in terms) / len(terms) if terms else 0.0
    # A sentence that says what the paper does beats one more on the topic; one that opens with a
    # pronoun ("It is at the core of ...") reads badly out of its paragraph, and an unfinished one
    # ("... the following models:") stops where its content begins; an exclamation is an aside.
    cue = 0.4 if _CUE.search(sentence) else 0.0
    anaphora = 0.2 if _ANAPHORA.match(sentence) else 0.0
    cut = 0.5 if unfinished(sentence) or exclaims(sentence) else 0.0
    # A sentence about other papers' work (in a related-work section, or naming "et al.", "their
    # model") would be shown as this paper's point: a last resort, unless it speaks of this paper.
    others = 0.0
    if not _SELF.search(sentence):
        others = 0.5 if about_others(section) else 0.0
        others += 0.3 if _OTHERS_WORK.search(sentence) or cites else 0.0
    return share + cue - anaphora - cut - others + (0.05 if abstract else 0.0)


def draw_point(
    passages: Sequence[ContextPassage], terms: Sequence[str], exclude: frozenset[str] = frozenset()
) -> Point | None:
    """A paper's point from its numbered passages: the best-scoring sentence of fitting length (not one
    in ``exclude``: a paper's point for an earlier part of the question)."""
    best: tuple[float, int, int, str] | None = None
    for p in passages:
        raw = strip_instructions(p.chunk.text)[0]
        for j, cited in enumerate(sentences(raw)):
            s = strip_citations(strip_placeholders(cited))
            if not POINT_MIN_WORDS <= len(s.split()) <= POINT_MAX_WORDS or s.strip() in exclude:
                continue
            score = point_score(
                s,
                terms,
                abstract=p.chunk.type == "abstract",
                section=p.chunk.section,
                cites=has_placeholder(cited) or _CITATION_KEY.search(cited) is not None,
            )
            key = (score, -p.n, -j, s)
            if best is None or key[:3] > best[:3]:
                best = (score, -p.n, -j, s)
    if best is None:
        return None
    n = -best[1]
    chunk = next(p.chunk for p in passages if p.n == n)
    return Point(n=n, paper_id=chunk.paper_id, title=chunk.title, sentence=best[3].strip())


def group_points(
    points: Sequence[Point], question: str, max_groups: int = MAX_GROUPS
) -> list[tuple[str, list[Point]]]:
    """Points grouped by approach (``APPROACHES``, matched in each paper's title and point): greedily,
    the approach most of the ungrouped papers share (at least two) makes the next group; the rest go
    to "Other approaches". Fewer than three papers: one group."""
    if len(points) < 3:
        return [("Papers", list(points))]
    usable = [(label, rx) for label, rx in APPROACHES if not rx.search(question)]
    matched = {
        p.paper_id: {label for label, rx in usable if rx.search(f"{p.title} {p.sentence}")} for p in points
    }
    left = list(points)
    groups: list[tuple[str, list[Point]]] = []
    while left and len(groups) < max_groups - 1:
        counts = {label: sum(label in matched[p.paper_id] for p in left) for label, _ in usable}
        best = max((c for c in counts.values()), default=0)
        if best < 2:
            break
        label = next(lbl for lbl, _ in usable if counts[lbl] == best)
        groups.append((label, [p for p in left if label in matched[p.paper_id]]))
        left = [p for p in left if label not in matched[p.paper_id]]
    if left:
        groups.append(("Other approaches" if groups else "Papers", left))
    return groups


def point_text(point: Point) -> str:
    """The point as a sentence of the answer, with its [n] marker before the final stop."""
    s = point.sentence.rstrip()
    if s and s[-1] in ".!?":
        return f"{s[:-1].rstrip()} [{point.n}]{s[-1]}"
    return f"{s} [{point.n}]."


def format_points(points: Sequence[Point], max_words: int = 25, max_points: int = 6) -> str:
    """The points as the overview prompt shows them: "[n] Title: sentence", the first ``max_points``
    (one per paper, best first) with sentences clipped: every prompt token is prefill time on a CPU."""
    lines = []
    for p in sorted(points, key=lambda p: p.n)[:max_points]:
        words = p.sentence.split()
        text = " ".join(words[:max_words]) + (" …" if len(words) > max_words else "")
        lines.append(f"[{p.n}] {p.title}: {text}")
    return "\n".join(lines)


def literature_short_answer(groups: Sequence[tuple[str, Sequence[str]]], n_papers: int) -> str:
    """The short answer of a literature answer: how many papers, and how many in each group ("8 papers:
    Neural networks (CNN, RNN, attention) (2); Other approaches (6)"; the first label alone had read
    as if it were all 8). ``groups``: each group's label and paper ids."""
    noun = "paper" if n_papers == 1 else "papers"
    named = [(label, len(set(ids))) for label, ids in groups if label != "Papers"]
    return f"{n_papers} {noun}" + (": " + "; ".join(f"{label} ({k})" for label, k in named) if named else "")


def grade_literature(
    plan: Sequence[str],
    rankings: Sequence[QueryPapers],
    evidence: Sequence[Evidence],
    *,
    max_papers: int,
    min_ratio: float = 0.0,
) -> Grade:
    """The verdict on an open question (a pure function): sufficient when every part has a paper that
    addresses it, partial when some part has none, unrelated when no paper addresses any part."""
    per_part = max_papers if len(plan) <= 1 else max(3, max_papers // len(plan))
    parts = addressing_parts(plan, rankings, evidence, per_part=per_part, min_ratio=min_ratio)
    papers = list(dict.fromkeys(pid for p in parts for pid in p.paper_ids))
    ranked = len({p.paper_id for r in rankings for p in r.papers})
    empty = [p.target for p in parts if not p.paper_ids]
    if not papers:
        terms = focus_terms(" ".join(plan))
        return Grade(
            verdict="unrelated",
            reasons=[f"none of the {ranked} papers ranked holds the question's terms"],
            coverage=0.0,
            missing_terms=[term_words(" ".join(plan)).get(t, t) for t in terms],
            missing_entities=[e for e in entities(" ".join(plan))],
            empty_queries=list(plan) if len(plan) > 1 else [],
            parts=parts,
        )
    if empty:
        return Grade(
            verdict="partial",
            reasons=["no paper addresses: " + "; ".join(empty)],
            coverage=round(1 - len(empty) / len(parts), 4),
            empty_queries=empty,
            parts=parts,
        )
    return Grade(
        verdict="sufficient",
        reasons=[f"{len(papers)} of {ranked} papers ranked address the question"],
        parts=parts,
    )


def literature_context(
    parts: Sequence[PaperPart], evidence: Sequence[Evidence], per_paper: int
) -> list[ContextPassage]:
    """The addressing papers' passages, numbered paper by paper (best paper first, at most
    ``per_paper`` each). The LLM reads only the points drawn from them; the verifier reads them whole."""
    order = list(dict.fromkeys(pid for p in parts for pid in p.paper_ids))
    out: list[ContextPassage] = []
    for pid in order:
        # Round-robin over the queries that found the paper: each part's best passage of it is numbered
        # (a paper in two parts needs its passage on each), then the next best.
        by_query: dict[str, list[Evidence]] = {}
        for e in evidence:
            if e.chunk.paper_id == pid:
                by_query.setdefault(e.query, []).append(e)
        queues = list(by_query.values())
        picked: list[Evidence] = []
        depth = 0
        while len(picked) < per_paper and any(depth < len(q) for q in queues):
            for q in queues:
                if (
                    depth < len(q)
                    and len(picked) < per_paper
                    and q[depth].chunk.id not in {x.chunk.id for x in picked}
                ):
                    picked.append(q[depth])
            depth += 1
        for e in picked:
            text = strip_instructions(strip_placeholders(e.chunk.text))[0]
            out.append(
                ContextPassage(
                    n=len(out) + 1, chunk=e.chunk, text=text, score=e.score, tokens=max(1, len(text) // 4)
                )
            )
    return out


def part_label(target: str) -> str:
    """A compound question's part as a group label: the sub-query without its lead or question mark."""
    text = without_carried(strip_self_reference(strip_lead(target))).rstrip("?.! ")
    return text[:1].upper() + text[1:]


def literature_groups(
    question: str, parts: Sequence[PaperPart], passages: Sequence[ContextPassage]
) -> list[tuple[str, list[Point]]]:
    """Each paper's point, grouped: by part for a compound question, else by shared approach."""
    by_paper: dict[str, list[ContextPassage]] = {}
    for p in passages:
        by_paper.setdefault(p.chunk.paper_id, []).append(p)

    used: set[str] = set()

    def points(pids: Sequence[str], terms: Sequence[str]) -> list[Point]:
        drawn = [draw_point(by_paper.get(pid, []), terms, frozenset(used)) for pid in pids]
        out = [p for p in drawn if p is not None]
        used.update(p.sentence for p in out)
        return out

    if len(parts) > 1:
        # Each part's own words pick its points (not the words carried in from the first clause).
        groups = [
            (part_label(p.target), points(p.paper_ids, focus_terms(without_carried(p.target)))) for p in parts
        ]
        return [(label, pts) for label, pts in groups if pts]
    pids = parts[0].paper_ids if parts else []
    return group_points(points(pids, focus_terms(question)), question)
