"""Cut a paper into retrieval chunks, sized in the embedding model's own word-pieces.

One abstract chunk per paper: an abstract longer than the model reads is embedded as the mean of
its sentence-aligned pieces (``Chunk.embed_parts``), each of which fits.

Chunks are built sentence by sentence and never span sections; a paragraph boundary is the
preferred break. Every chunk's ``embed_text`` (title and section prefix included) is verified to fit
``ChunkSettings.max_tokens`` so nothing is truncated when it is embedded.

A chunk that continues a paragraph cut at the previous chunk's end starts with up to two of its last
sentences (capped at ``overlap_max_tokens``); a chunk that starts a new paragraph carries none, since
the paragraph starts a new thought. Carrying overlap at every boundary made the library 51% larger
than its text in embedded tokens; this rule makes it 18% larger (measured on 40 QASPER papers).

Token counts come from a :data:`TokenCounter`, called in batches (a few calls per paper): the count of
joined text is taken as the sum of its sentences' counts, then checked once on the finished chunks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from arag.errors import ModelError
from arag.ingest.splitter import split_sentences
from arag.records import Chunk, ChunkType, Paper, chunk_id
from arag.settings import ChunkSettings

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = ["TokenCounter", "chunk_paper", "embed_text_for", "mean_overlap", "wordpiece_counter"]

log = logging.getLogger(__name__)

TokenCounter = Callable[[Sequence[str]], list[int]]
"""Word-piece counts of a batch of texts, special tokens excluded."""

ABSTRACT_SECTION = "Abstract"
TABLE_SECTION = "Table"


def embed_text_for(title: str, section: str | None, text: str) -> str:
    """The text the embedder reads: title and section prefixed to the chunk text."""
    if section is None:
        return f"Title: {title}\n{text}"
    return f"Title: {title}\nSection: {section}\n{text}"


def wordpiece_counter(tokenizer: Tokenizer) -> TokenCounter:
    """A :data:`TokenCounter` from a ``tokenizers.Tokenizer`` (copied: truncation and padding off)."""
    from tokenizers import Tokenizer as _Tokenizer

    tok = _Tokenizer.from_str(tokenizer.to_str())
    tok.no_truncation()
    tok.no_padding()

    def count(texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        return [len(enc.ids) for enc in tok.encode_batch(list(texts), add_special_tokens=False)]

    return count


def mean_overlap(chunks: Sequence[Chunk]) -> float:
    """Mean number of overlap sentences carried into passage chunks (0.0 when there are none)."""
    values = [c.overlap_sentences for c in chunks if c.type == "passage"]
    return sum(values) / len(values) if values else 0.0


@dataclass(frozen=True)
class _Unit:
    """A sentence (or table line, or a piece of an over-long one) with its word-piece count."""

    text: str
    tokens: int
    group: int  # paragraph / line id: units of one group join with " ", groups with "\n"


@dataclass
class _Draft:
    type: ChunkType
    section: str | None
    units: list[_Unit]
    overlap: int = 0
    header: _Unit | None = None  # a table caption, repeated in each piece of a long table

    @property
    def text(self) -> str:
        units = [self.header, *self.units] if self.header is not None else self.units
        return _join(units)


@dataclass
class _Sec:
    """A section being chunked: its prefix name, paragraphs of units and budgets."""

    name: str | None
    groups: list[list[_Unit]] = field(default_factory=list)
    ceiling: int = 0  # the hard body limit: max_tokens - prefix tokens
    target: int = 0  # the body size to fill up to: min(target_tokens, ceiling)


def _join(units: Sequence[_Unit]) -> str:
    parts: list[str] = []
    prev = None
    for u in units:
        if parts:
            parts.append(" " if u.group == prev else "\n")
        parts.append(u.text)
        prev = u.group
    return "".join(parts)


def _total(units: Sequence[_Unit]) -> int:
    return sum(u.tokens for u in units)


def chunk_paper(paper: Paper, count_tokens: TokenCounter, settings: ChunkSettings) -> list[Chunk]:
    """Abstract, passage and table chunks of ``paper``, each ``embed_text`` within ``max_tokens``."""
    abstract = _Sec(ABSTRACT_SECTION)
    sections = [_Sec(s.name.strip() or None) for s in paper.sections]
    tables = [t for t in paper.tables if t.text.strip() or (t.caption or "").strip()]
    table_secs = [_Sec((t.section or "").strip() or TABLE_SECTION) for t in tables]
    all_secs = [abstract, *sections, *table_secs]

    # One batch for every sentence, table line, caption and prefix of the paper.
    slots: list[tuple[_Sec, int, str]] = []  # (section, group, text) of each unit
    for sentence in split_sentences(paper.abstract):
        slots.append((abstract, 0, sentence))
    for sec, section in zip(sections, paper.sections, strict=True):
        for g, para in enumerate(section.paragraphs):
            slots += [(sec, g, sentence) for sentence in split_sentences(para)]
    captions = [(t.caption or "").strip() or None for t in tables]
    for sec, table in zip(table_secs, tables, strict=True):
        lines = [ln.rstrip() for ln in table.text.strip().splitlines() if ln.strip()]
        slots += [(sec, g, line) for g, line in enumerate(lines, start=1)]
    title = paper.title
    prefixes = [embed_text_for(title, s.name, "") for s in all_secs]
    present = [c for c in captions if c is not None]
    counts = count_tokens([*(t for _, _, t in slots), *present, *prefixes])
    _check_counts(counts, len(slots) + len(present) + len(prefixes))
    for (sec, group, text), n in zip(slots, counts, strict=False):
        if not sec.groups or sec.groups[-1][0].group != group:
            sec.groups.append([])
        sec.groups[-1].append(_Unit(text, n, group))
    caption_counts = iter(counts[len(slots) : len(slots) + len(present)])
    headers = [_Unit(c, next(caption_counts), 0) if c is not None else None for c in captions]
    prefix_counts = counts[len(slots) + len(present) :]
    if max(prefix_counts) > settings.max_tokens // 2:
        # A runaway title or heading (PDF extraction): shorten it in the prefix, never the body.
        title, prefix_counts = _shorten_prefixes(title, all_secs, count_tokens, settings.max_tokens // 4)
    for sec, n in zip(all_secs, prefix_counts, strict=True):
        sec.ceiling = settings.max_tokens - n
        sec.target = min(settings.target_tokens, sec.ceiling)

    # Units longer than the budget they are packed under are cut at word boundaries (one batch).
    abstract_units = [u for g in abstract.groups for u in g]
    abstract_fits = _total(abstract_units) <= abstract.ceiling
    limits: list[tuple[_Sec, int]] = [(sec, sec.target) for sec in sections]
    if not abstract_fits:
        limits.append((abstract, abstract.target))
    for i, (sec, header) in enumerate(zip(table_secs, headers, strict=True)):
        if header is not None and header.tokens > sec.ceiling // 2:
            # A caption this long is not repeated in every piece: it becomes the table's first line.
            sec.groups.insert(0, [header])
            headers[i] = header = None
        limits.append((sec, sec.ceiling - (header.tokens if header is not None else 0)))
    _cut_long_units(limits, count_tokens)

    drafts: list[_Draft] = []
    # The abstract is one chunk whenever it fits the hard ceiling; otherwise sentence-wise pieces.
    if abstract_units:
        if abstract_fits:
            pieces: list[tuple[list[_Unit], int]] = [(abstract_units, 0)]
        else:
            packed = _pack(abstract.groups, abstract.target, abstract.ceiling, 0, settings.min_tokens, 0)
            pieces = _settle(packed, abstract.ceiling, settings.min_tokens, keep_small=True)
        drafts += [_Draft("abstract", ABSTRACT_SECTION, units) for units, _ in pieces]
    for sec in sections:
        packed = _pack(
            sec.groups,
            sec.target,
            sec.ceiling,
            settings.overlap_sentences,
            settings.min_tokens,
            settings.overlap_max_tokens,
        )
        for units, overlap in _settle(packed, sec.ceiling, settings.min_tokens, keep_small=False):
            drafts.append(_Draft("passage", sec.name, units, overlap))
    for sec, header in zip(table_secs, headers, strict=True):
        drafts += _table_drafts(sec, header)

    n_tokens = _verify(drafts, title, count_tokens, settings.max_tokens)
    n_abstract = sum(1 for d in drafts if d.type == "abstract")  # after _verify: it may re-split
    chunks: list[Chunk] = []
    if n_abstract > 1:
        # One abstract chunk per paper: a long abstract keeps its whole text (for BM25 and display)
        # and is embedded as the mean of its sentence-aligned pieces, so nothing is truncated.
        parts = drafts[:n_abstract]
        text = " ".join(d.text for d in parts)
        chunks.append(
            Chunk(
                id=chunk_id(paper.id, 0, text),
                paper_id=paper.id,
                index=0,
                title=paper.title,
                section=ABSTRACT_SECTION,
                type="abstract",
                text=text,
                embed_text=embed_text_for(title, ABSTRACT_SECTION, text),
                embed_parts=[embed_text_for(title, ABSTRACT_SECTION, d.text) for d in parts],
                n_tokens=max(n_tokens[:n_abstract]),
                year=paper.year,
            )
        )
        drafts, n_tokens = drafts[n_abstract:], n_tokens[n_abstract:]
    for draft, n in zip(drafts, n_tokens, strict=True):
        index = len(chunks)
        text = draft.text
        chunks.append(
            Chunk(
                id=chunk_id(paper.id, index, text),
                paper_id=paper.id,
                index=index,
                title=paper.title,
                section=draft.section,
                type=draft.type,
                text=text,
                embed_text=embed_text_for(title, draft.section, text),
                n_tokens=n,
                overlap_sentences=draft.overlap,
                year=paper.year,
            )
        )
    return chunks


def _check_counts(counts: Sequence[int], expected: int) -> None:
    if len(counts) != expected:
        raise ModelError(
            f"token counter returned {len(counts)} counts for {expected} texts",
            where="arag.ingest.chunker",
            fix="the TokenCounter must return one count per input text, in order",
        )


def _shorten_prefixes(
    title: str, secs: Sequence[_Sec], count_tokens: TokenCounter, limit: int
) -> tuple[str, list[int]]:
    """Cut the title and section names to ``limit`` word-pieces each; the new prefix counts."""
    names = [title, *(s.name for s in secs if s.name is not None)]
    words = [name.split() for name in names]
    counts = count_tokens([w for ws in words for w in ws])
    short: list[str] = []
    offset = 0
    for ws in words:
        kept: list[str] = []
        used = 0
        for w, n in zip(ws, counts[offset : offset + len(ws)], strict=True):
            if used + n > limit:
                break
            kept.append(w)
            used += n
        offset += len(ws)
        short.append(" ".join(kept) if len(kept) == len(ws) else " ".join([*kept, "…"]))
    rest = iter(short[1:])
    for sec in secs:
        if sec.name is not None:
            sec.name = next(rest)
    prefixes = count_tokens([embed_text_for(short[0], s.name, "") for s in secs])
    _check_counts(prefixes, len(secs))
    return short[0], prefixes


def _cut_long_units(limits: Sequence[tuple[_Sec, int]], count_tokens: TokenCounter) -> None:
    """Replace every unit over its section's limit by word-boundary pieces that fit (in place)."""
    long_units = [(sec, limit, u) for sec, limit in limits for g in sec.groups for u in g if u.tokens > limit]
    if not long_units:
        return
    words = [u.text.split() for _, _, u in long_units]
    counts = count_tokens([w for ws in words for w in ws])
    replaced: dict[int, list[_Unit]] = {}
    offset = 0
    for (_, limit, unit), ws in zip(long_units, words, strict=True):
        word_units = [
            _Unit(w, n, unit.group) for w, n in zip(ws, counts[offset : offset + len(ws)], strict=True)
        ]
        offset += len(ws)
        pieces: list[_Unit] = []
        for wu in word_units:
            pieces += _cut_word(wu, limit, count_tokens) if wu.tokens > limit else [wu]
        replaced[id(unit)] = _merge_words(pieces, limit)
    for sec, _ in limits:
        sec.groups = [[p for u in g for p in replaced.get(id(u), [u])] for g in sec.groups]


def _fill(units: Sequence[_Unit], limit: int) -> list[list[_Unit]]:
    """Greedily pack units, in order, into runs of at most ``limit`` tokens (a unit over it alone)."""
    runs: list[list[_Unit]] = []
    used = 0
    for u in units:
        if runs and used + u.tokens <= limit:
            runs[-1].append(u)
            used += u.tokens
        else:
            runs.append([u])
            used = u.tokens
    return runs


def _merge_words(words: Sequence[_Unit], limit: int) -> list[_Unit]:
    """Greedily join word units (one group) into pieces of at most ``limit`` tokens."""
    return [_Unit(" ".join(w.text for w in p), _total(p), p[0].group) for p in _fill(words, limit)]


def _cut_word(word: _Unit, limit: int, count_tokens: TokenCounter) -> list[_Unit]:
    """Cut one whitespace-free string over ``limit`` tokens into character runs that fit.

    Only garbage (a base64 blob, a 2,000-character URL) gets here, so a bisection per piece is fine.
    """
    pieces: list[_Unit] = []
    rest = word.text
    while rest:
        n_rest = count_tokens([rest])[0]
        if n_rest <= limit:
            pieces.append(_Unit(rest, n_rest, word.group))
            break
        lo, hi = 1, len(rest)  # the longest prefix that fits is in [lo, hi)
        n_lo = count_tokens([rest[:1]])[0]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            n_mid = count_tokens([rest[:mid]])[0]
            if n_mid <= limit:
                lo, n_lo = mid, n_mid
            else:
                hi = mid
        pieces.append(_Unit(rest[:lo], n_lo, word.group))
        rest = rest[lo:]
    return pieces


def _carry(
    prev: Sequence[_Unit], next_tokens: int, budget: int, overlap_max: int, overlap_max_tokens: int
) -> list[_Unit]:
    """The last sentences of ``prev`` (at most ``overlap_max`` sentences and ``overlap_max_tokens``
    tokens) that fit before the next unit."""
    for k in range(min(overlap_max, len(prev)), 0, -1):
        carried = list(prev[-k:])
        if _total(carried) <= overlap_max_tokens and _total(carried) + next_tokens <= budget:
            return carried
    return []


def _pack(
    groups: Sequence[Sequence[_Unit]],
    target: int,
    ceiling: int,
    overlap_max: int,
    min_new: int,
    overlap_max_tokens: int,
) -> list[tuple[list[_Unit], int]]:
    """Greedy packing of paragraphs of units into (units, n_overlap) chunks of about ``target`` tokens.

    A paragraph that does not fit the room left starts a new chunk if it then fits whole; a chunk
    whose new text is still under ``min_new`` may grow up to ``ceiling`` rather than stay tiny.
    """
    out: list[tuple[list[_Unit], int]] = []
    cur: list[_Unit] = []
    n_over = 0

    def close(next_tokens: int, *, paragraph_break: bool) -> None:
        # Overlap keeps a sentence cut from its paragraph next to its context; a chunk that starts a
        # new paragraph needs none, and carrying it there cost ~25% more tokens to embed (measured).
        nonlocal cur, n_over
        out.append((cur, n_over))
        cur = [] if paragraph_break else _carry(cur, next_tokens, target, overlap_max, overlap_max_tokens)
        n_over = len(cur)

    for group in groups:
        if not group:
            continue
        size = _total(group)
        # Break before a paragraph that does not fit the room left only if that keeps it whole
        # (carrying only the overlap that fits beside all of it); a paragraph longer than a chunk
        # is split anyway, so it first fills the room left here.
        full = _total(cur) + size > target
        if len(cur) > n_over and _total(cur[n_over:]) >= min_new and full and size <= target:
            close(size, paragraph_break=True)
        for i, unit in enumerate(group):
            limit = target if _total(cur[n_over:]) >= min_new else ceiling
            if len(cur) > n_over and _total(cur) + unit.tokens > limit:
                close(unit.tokens, paragraph_break=i == 0)
            cur.append(unit)
    if len(cur) > n_over:
        out.append((cur, n_over))
    return out


def _settle(
    packed: Sequence[tuple[list[_Unit], int]], ceiling: int, min_tokens: int, *, keep_small: bool
) -> list[tuple[list[_Unit], int]]:
    """Merge chunks with little new text into the previous chunk when it fits; drop tiny ones."""
    out: list[tuple[list[_Unit], int]] = []
    for units, n_over in packed:
        new = units[n_over:]
        if _total(new) < min_tokens and out and _total(out[-1][0]) + _total(new) <= ceiling:
            out[-1] = (out[-1][0] + new, out[-1][1])
        elif _total(units) >= min_tokens or (keep_small and units):
            out.append((units, n_over))
        else:
            log.debug("dropping a %d-token chunk: %.60r", _total(units), _join(units))
    return out


def _table_drafts(sec: _Sec, header: _Unit | None) -> list[_Draft]:
    """One chunk per table, or groups of whole rows (caption repeated) when it is too long."""
    lines = [u for g in sec.groups for u in g]
    whole = ([header] if header is not None else []) + lines
    if not whole:
        return []
    if _total(whole) <= sec.ceiling:
        return [_Draft("table", sec.name, lines, header=header)]
    room = sec.ceiling - (header.tokens if header is not None else 0)
    return [_Draft("table", sec.name, g, header=header) for g in _fill(lines, room)]


def _verify(drafts: list[_Draft], title: str, count_tokens: TokenCounter, max_tokens: int) -> list[int]:
    """Count every finished embed_text in one batch; re-split (in place) the rare one over the limit.

    Summed sentence counts equal the joined count for BERT word-pieces, so offenders only come from
    counters that are not additive; each round halves them, so the loop ends.
    """
    while drafts:
        counts = count_tokens([embed_text_for(title, d.section, d.text) for d in drafts])
        _check_counts(counts, len(drafts))
        bad = [i for i, n in enumerate(counts) if n > max_tokens]
        if not bad:
            return counts
        log.debug("re-splitting %d chunk(s) over %d tokens", len(bad), max_tokens)
        for i in reversed(bad):
            drafts[i : i + 1] = _resplit(drafts[i])
    return []


def _resplit(d: _Draft) -> list[_Draft]:
    """Make an over-long draft smaller: drop its overlap, else halve its units, else halve its text."""
    if d.overlap:
        return [_Draft(d.type, d.section, d.units[d.overlap :], 0, d.header)]
    if d.header is not None and len(d.units) <= 1:
        return [_Draft(d.type, d.section, [d.header, *d.units])]  # the caption becomes a plain line
    if len(d.units) >= 2:
        half, acc = 1, d.units[0].tokens
        while half < len(d.units) - 1 and acc + d.units[half].tokens <= _total(d.units) / 2:
            acc += d.units[half].tokens
            half += 1
        return [
            _Draft(d.type, d.section, d.units[:half], 0, d.header),
            _Draft(d.type, d.section, d.units[half:], 0, d.header),
        ]
    unit = d.units[0]
    words = unit.text.split()
    if len(words) >= 2:
        parts = [" ".join(words[: len(words) // 2]), " ".join(words[len(words) // 2 :])]
    else:
        parts = [unit.text[: len(unit.text) // 2], unit.text[len(unit.text) // 2 :]]
    return [_Draft(d.type, d.section, [_Unit(p, unit.tokens // 2, unit.group)], 0, d.header) for p in parts]
