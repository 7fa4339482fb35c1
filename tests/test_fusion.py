from __future__ import annotations

import pytest

from arag.records import Chunk, ScoredChunk
from arag.retrieval.fusion import fuse_chunks, rrf_scores


def test_rrf_exact_scores_and_order() -> None:
    dense = ["a", "b", "c"]
    sparse = ["c", "a", "d"]
    fused = rrf_scores([dense, sparse], k=60)
    assert [key for key, _ in fused] == ["a", "c", "b", "d"]
    scores = dict(fused)
    assert scores["a"] == pytest.approx(1 / 61 + 1 / 62)
    assert scores["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert scores["b"] == pytest.approx(1 / 62)
    assert scores["d"] == pytest.approx(1 / 63)


def test_rrf_uses_rank_not_score_and_breaks_ties_deterministically() -> None:
    # x and y tie on fused score (1/61 + 1/62 each); x reached rank 1 first.
    fused = rrf_scores([["x", "y"], ["y", "x"]], k=60)
    assert [key for key, _ in fused] == ["x", "y"]
    assert fused[0][1] == fused[1][1]


def test_rrf_counts_a_duplicate_once_per_list() -> None:
    assert dict(rrf_scores([["a", "a", "b"]], k=0)) == {"a": 1.0, "b": 1 / 3}


def test_rrf_k_zero_and_empty_inputs() -> None:
    assert rrf_scores([], k=60) == []
    assert rrf_scores([[], []]) == []
    assert rrf_scores([["a"], ["b"]], k=0) == [("a", 1.0), ("b", 1.0)]
    with pytest.raises(ValueError):
        rrf_scores([["a"]], k=-1)


def _hit(cid: str, score: float) -> ScoredChunk:
    chunk = Chunk(
        id=cid, paper_id="p", index=0, title="T", type="passage", text=cid, embed_text=cid, n_tokens=1
    )
    return ScoredChunk(chunk=chunk, score=score, source="dense")


def test_fuse_chunks_keeps_records_and_limits() -> None:
    dense = [_hit("a", 0.9), _hit("b", 0.8)]
    sparse = [_hit("b", 12.0), _hit("c", 3.0)]
    fused = fuse_chunks([dense, sparse], limit=2)
    assert [h.chunk.id for h in fused] == ["b", "a"]
    assert all(h.source == "fused" for h in fused)
    assert fused[0].score == pytest.approx(1 / 62 + 1 / 61)
