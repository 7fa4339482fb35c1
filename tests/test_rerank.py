"""The rerank stage's rules, the reranker factory, calibration and the retrieval pipeline (no real models)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from arag.errors import ConfigError, ModelError
from arag.library.manage import open_for_search
from arag.models.reranker import (
    Bars,
    IdentityReranker,
    ModelCard,
    Reranker,
    get_reranker,
    pair_text,
    read_card,
)
from arag.records import Chunk, ScoredChunk
from arag.retrieval.hybrid import HybridRetriever
from arag.retrieval.pipeline import SEARCHES, found_by, make_reranking_retriever
from arag.retrieval.rerank import RerankStage, floor_canonical, select_kept
from arag.settings import RerankSettings, Settings, get_settings
from arag.train.calibrate import calibrate_bars, score_histogram
from arag.train.data import Candidates
from arag.train.metrics import kept_f1, rank_metrics, reranked_order

BARS = Bars(lower=0.5, upper=0.8)


# --- select_kept -------------------------------------------------------------------------------


def test_select_kept_lower_bar_for_supported_ranks_upper_for_the_rest() -> None:
    scores = [0.9, 0.2, 0.6, 0.95, 0.55, 0.7]
    ranks = [1, 2, 3, 12, 10, 15]
    # By score: 3 (.95, r12: needs .8, clears), 0 (.9), 5 (.7, r15: needs .8, fails), 2 (.6), 4 (.55, r10:
    # the last supported rank, needs .5), 1 (.2, fails).
    assert select_kept(scores, ranks, BARS) == [3, 0, 2, 4]
    assert select_kept(scores, ranks, BARS, keep=2) == [3, 0]
    # A smaller supported range: rank 10 now needs the upper bar too.
    assert select_kept(scores, ranks, BARS, supported_rank=3) == [3, 0, 2]


def test_select_kept_bar_is_inclusive() -> None:
    assert select_kept([0.5, 0.8], [1, 11], BARS) == [1, 0]


def test_select_kept_ties_go_to_the_better_fused_rank() -> None:
    assert select_kept([0.6, 0.6, 0.6], [3, 1, 2], BARS) == [1, 2, 0]
    assert select_kept([0.6, 0.6, 0.6], [3, 1, 2], None) == [1, 2, 0]


def test_select_kept_fallback_to_the_single_best() -> None:
    # Nothing clears its bar; the best (a rank-15 candidate) clears the lower bar only: kept alone.
    assert select_kept([0.3, 0.7, 0.6], [1, 15, 12], BARS) == [1]
    # The best is below the lower bar too: nothing.
    assert select_kept([0.3, 0.45, 0.2], [1, 15, 2], BARS) == []
    assert select_kept([], [], BARS) == []


def test_select_kept_without_bars_keeps_the_first_by_score() -> None:
    assert select_kept([0.1, 0.5, 0.3, -2.0], [1, 2, 3, 4], None, keep=2) == [1, 2]
    assert select_kept([0.1, 0.5, 0.3, -2.0], [1, 2, 3, 4], None) == [1, 2, 0, 3]
    assert select_kept([], [], None) == []


# --- floor_canonical ---------------------------------------------------------------------------


def test_floor_canonical_raises_supported_canonical_chunks_only() -> None:
    scores = [0.1, 0.9, 0.2, 0.3, 0.05, 0.5]
    ranks = [1, 2, 10, 11, 3, 4]
    canonical = [True, True, True, True, False, True]
    out, raised = floor_canonical(scores, ranks, canonical, lower=0.5)
    # 0: raised to the bar; 1: higher already, kept; 2: rank 10 is still supported; 3: rank 11 is not;
    # 4: not canonical; 5: at the bar already, not "raised".
    assert out == [0.5, 0.9, 0.5, 0.3, 0.05, 0.5]
    assert raised == [True, False, True, False, False, False]
    out, raised = floor_canonical(scores, ranks, canonical, lower=0.5, supported_rank=1)
    assert out == [0.5, 0.9, 0.2, 0.3, 0.05, 0.5]
    assert raised == [True, False, False, False, False, False]
    assert floor_canonical([], [], [], lower=1.0) == ([], [])


# --- RerankStage -------------------------------------------------------------------------------


def _chunk(cid: str, paper: str, text: str, section: str | None = None) -> Chunk:
    return Chunk(
        id=cid,
        paper_id=paper,
        index=0,
        title=f"Paper {paper}",
        section=section,
        type="passage",
        text=text,
        embed_text=text,
        n_tokens=1,
    )


def _fused(*chunks: Chunk) -> list[ScoredChunk]:
    """Fused hits with decreasing RRF-like scores, in the order given."""
    return [
        ScoredChunk(chunk=c, score=round(0.05 - 0.01 * i, 4), source="fused") for i, c in enumerate(chunks)
    ]


class ScriptedReranker:
    """A fake reranker: preset scores by passage text (as the cross-encoder reads it)."""

    def __init__(
        self, scores: dict[str, float], bars: Bars | None, name: str = "scripted", fusion_weight: float = 0.0
    ) -> None:
        self.name = name
        self.bars = bars
        self.fusion_weight = fusion_weight
        self.table = scores
        self.calls: list[tuple[str, list[str]]] = []

    def score(self, query: str, passages: Sequence[str]) -> np.ndarray:
        self.calls.append((query, list(passages)))
        return np.asarray([self.table[p] for p in passages], dtype=np.float32)


class FusedOrderReranker:
    """A fake model that agrees with the fusion (unlike the identity, the stage treats it as a model)."""

    name = "fused-order"
    bars: Bars | None = None
    fusion_weight = 0.0

    def score(self, query: str, passages: Sequence[str]) -> np.ndarray:
        return -np.arange(len(passages), dtype=np.float32)


def test_scripted_reranker_is_a_reranker() -> None:
    assert isinstance(ScriptedReranker({}, None), Reranker)
    assert isinstance(IdentityReranker(), Reranker)


def test_pair_text_puts_the_section_first() -> None:
    assert pair_text(_chunk("a", "P", "alpha", "Methods")) == "Methods: alpha"
    assert pair_text(_chunk("a", "P", "alpha")) == "alpha"


def test_rerank_stage_orders_floors_and_keeps() -> None:
    fused = _fused(
        _chunk("a", "P1", "alpha"),
        _chunk("b", "P2", "beta"),
        _chunk("c", "P1", "gamma", section="Methods"),
        _chunk("d", "P3", "delta"),
    )
    model = ScriptedReranker(
        {"alpha": 1.0, "beta": -1.0, "Methods: gamma": 3.0, "delta": 0.5}, Bars(lower=0.0, upper=2.0)
    )
    # Fused ranks 1-2 need the lower bar (0.0), ranks 3+ the upper bar (2.0).
    stage = RerankStage(model, RerankSettings(supported_rank=2), canonical={"P2"})
    fb = {"a": ["abstracts", "bm25"], "c": ["passages"]}
    r = stage.run("what?", fused, fb)
    assert model.calls == [("what?", ["alpha", "beta", "Methods: gamma", "delta"])]
    # b (canonical, fused rank 2) is floored from -1.0 to the lower bar 0.0, still last.
    assert [c.chunk.id for c in r.ranked] == ["c", "a", "d", "b"]
    assert [c.score for c in r.ranked] == [3.0, 1.0, 0.5, 0.0]
    assert [c.rerank_score for c in r.ranked] == [3.0, 1.0, 0.5, -1.0]
    assert [c.fused_rank for c in r.ranked] == [3, 1, 4, 2]
    assert [c.fused_score for c in r.ranked] == [0.03, 0.05, 0.02, 0.04]
    assert [c.floored for c in r.ranked] == [False, False, False, True]
    assert [c.found_by for c in r.ranked] == [["passages"], ["abstracts", "bm25"], [], []]
    assert {c.source for c in r.ranked} == {"reranked"}
    # d (rank 4, 0.5) misses the upper bar; c (rank 3, 3.0) clears it; a and b clear the lower bar.
    assert [c.chunk.id for c in r.kept] == ["c", "a", "b"]
    assert r.model == "scripted" and 0.0 < r.rerank_ms < 60_000  # the model call was timed

    # Without canonical papers nothing is floored, and b (-1.0) misses the lower bar.
    plain = RerankStage(model, RerankSettings(supported_rank=2)).run("what?", fused)
    assert [c.floored for c in plain.ranked] == [False] * 4
    assert [c.chunk.id for c in plain.kept] == ["c", "a"]
    assert all(c.found_by == [] for c in plain.ranked)
    # keep caps the kept set.
    capped = RerankStage(model, RerankSettings(supported_rank=2, keep=1), canonical={"P2"}).run("q", fused)
    assert [c.chunk.id for c in capped.kept] == ["c"]


def test_rerank_stage_with_nothing_clearing_keeps_the_single_best() -> None:
    fused = _fused(*(_chunk(x, "P", x) for x in "abc"))
    model = ScriptedReranker({"a": 0.1, "b": 0.6, "c": 0.2}, BARS)
    r = RerankStage(model, RerankSettings(supported_rank=1)).run("q", fused)
    # b (rank 2, 0.6) needs 0.8; a (rank 1, 0.1) needs 0.5: none clears; b clears the lower bar alone.
    assert [c.chunk.id for c in r.ranked] == ["b", "c", "a"]
    assert [c.chunk.id for c in r.kept] == ["b"]
    model.table["b"] = 0.4
    assert RerankStage(model, RerankSettings(supported_rank=1)).run("q", fused).kept == []


def test_rerank_stage_identity_keeps_the_fused_order() -> None:
    fused = _fused(*(_chunk(f"c{i}", f"P{i % 3}", f"text {i}") for i in range(10)))
    r = RerankStage(IdentityReranker(), RerankSettings(), canonical={"P0"}).run("q", fused, {"c1": ["bm25"]})
    assert [c.chunk.id for c in r.ranked] == [h.chunk.id for h in fused]
    assert [c.fused_rank for c in r.ranked] == list(range(1, 11))
    assert [c.score for c in r.ranked] == [h.score for h in fused]
    assert all(c.rerank_score is None and not c.floored and c.source == "fused" for c in r.ranked)
    assert r.ranked[1].found_by == ["bm25"]
    assert [c.chunk.id for c in r.kept] == [f"c{i}" for i in range(8)]
    assert r.model == "none"
    assert RerankStage(IdentityReranker(), RerankSettings()).run("q", []).ranked == []


def test_rerank_stage_mmr_pushes_a_same_paper_duplicate_down() -> None:
    fused = _fused(_chunk("x", "P1", "x"), _chunk("y", "P1", "y"), _chunk("z", "P2", "z"))
    model = ScriptedReranker({"x": 4.0, "y": 2.0, "z": 1.0}, None)
    vecs = {"x": [1.0, 0.0], "y": [1.0, 0.0], "z": [0.0, 1.0]}
    asked: list[list[str]] = []

    def vectors(ids: Sequence[str]) -> np.ndarray:
        asked.append(list(ids))
        return np.asarray([vecs[i] for i in ids])

    plain = RerankStage(model, RerankSettings(), vectors=vectors).run("q", fused)
    assert [c.chunk.id for c in plain.ranked] == ["x", "y", "z"] and asked == []
    r = RerankStage(model, RerankSettings(mmr=True), vectors=vectors).run("q", fused)
    # Relevance min-max scaled: x 1, y 1/3, z 0. After x: y = .7/3 - .3 * cos(x, y)=1 = -0.067;
    # z (another paper, never a duplicate) = 0 -> z before y.
    assert [c.chunk.id for c in r.ranked] == ["x", "z", "y"]
    assert asked == [["x", "y", "z"]]
    assert [c.chunk.id for c in r.kept] == ["x", "z", "y"]
    # With room for two, the kept set follows the MMR order: the duplicate y gives way to z.
    two = RerankStage(model, RerankSettings(mmr=True, keep=2), vectors=vectors).run("q", fused)
    assert [c.chunk.id for c in two.kept] == ["x", "z"]
    # MMR needs the vectors: without them the reranked order stands.
    alone = RerankStage(model, RerankSettings(mmr=True)).run("q", fused)
    assert [c.chunk.id for c in alone.ranked] == ["x", "y", "z"]


# --- get_reranker, read_card -------------------------------------------------------------------


def test_get_reranker_none_gives_the_identity() -> None:
    r = get_reranker(get_settings(rerank={"provider": "none"}))
    assert isinstance(r, IdentityReranker) and r.bars is None
    assert r.score("q", ["a", "b", "c"]).tolist() == [0.0, -1.0, -2.0]


def test_get_reranker_trained_without_a_model_says_train_it() -> None:
    with pytest.raises(ModelError, match="arag train reranker"):
        get_reranker(get_settings(rerank={"provider": "trained"}))


def test_get_reranker_bars_from_settings() -> None:
    with pytest.raises(ConfigError, match="set both bars"):
        get_reranker(get_settings(rerank={"provider": "none", "lower_bar": 0.2}))
    with pytest.raises(ConfigError):
        get_reranker(Settings(rerank=RerankSettings(provider="none", upper_bar=0.2)))
    r = get_reranker(get_settings(rerank={"provider": "none", "lower_bar": -0.5, "upper_bar": 1.5}))
    assert r.bars == Bars(lower=-0.5, upper=1.5)
    # The setting lands on the instance, not on the class every identity reranker shares.
    assert IdentityReranker().bars is None


def test_read_card_broken_or_missing(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="no trained reranker"):
        read_card(tmp_path)
    (tmp_path / "model.onnx").write_bytes(b"x")
    (tmp_path / "card.json").write_text("{not json")
    with pytest.raises(ModelError, match="unreadable"):
        read_card(tmp_path)
    card = ModelCard(
        model_id="m",
        base_model="b",
        layers=1,
        max_length=64,
        quantized=False,
        onnx_sha256="0" * 64,
        created="now",
        seed=0,
        bars=Bars(lower=0.0, upper=1.0),
    )
    (tmp_path / "card.json").write_text(card.model_dump_json())
    assert read_card(tmp_path) == card


# --- calibrate ---------------------------------------------------------------------------------


def _cands() -> list[Candidates]:
    """Two questions: six candidates (gold paragraphs 0 and 1 of 3 at candidates 1 and 5), and two
    (the only gold paragraph at candidate 0)."""
    one = Candidates(
        question_id="q1",
        query="q1",
        texts=[f"t{i}" for i in range(6)],
        paper_ids=["P"] * 6,
        gold_paper="P",
        hits=[[], [0], [], [], [], [1]],
        n_gold=3,
    )
    two = Candidates(
        question_id="q2",
        query="q2",
        texts=["u0", "u1"],
        paper_ids=["Q", "Q"],
        gold_paper="Q",
        hits=[[0], []],
        n_gold=1,
    )
    return [one, two]


SCORES = [[0.6, 0.9, 0.5, 0.4, 0.3, 0.1], [0.2, 0.8]]


def test_reranked_order_ties_keep_the_fused_order() -> None:
    assert reranked_order([0.5, 0.5, 0.9]) == [2, 0, 1]
    assert reranked_order(np.asarray([0.1, 0.3, 0.2])) == [1, 2, 0]


def test_rank_metrics_by_hand() -> None:
    m = rank_metrics(_cands(), SCORES)
    # q1 reordered: 1 (gold 0), 0, 2, 3, 4, 5 (gold 1); q2 reordered: 1, 0 (gold 0).
    ideal1 = 1 + 1 / math.log2(3) + 1 / math.log2(4)
    assert m["recall@5"] == pytest.approx((1 / 3 + 1) / 2)
    assert m["recall@10"] == pytest.approx((2 / 3 + 1) / 2)
    assert m["ndcg@10"] == pytest.approx(((1 + 1 / math.log2(7)) / ideal1 + 1 / math.log2(3)) / 2)
    assert m["mrr@10"] == pytest.approx((1 + 1 / 2) / 2)
    fused = rank_metrics(_cands(), [[-i for i in range(6)], [0, -1]])
    assert fused["mrr@10"] == pytest.approx((1 / 2 + 1) / 2)


def test_kept_f1_by_hand() -> None:
    m = kept_f1(_cands(), SCORES, Bars(lower=0.55, upper=0.85), supported_rank=2)
    # q1: ranks 1-2 clear .55 (kept 1 and 0), ranks 3+ miss .85: p 1/2, r 1/3, f1 .4.
    # q2: 0 (rank 1, .2) misses; 1 (rank 2, .8) kept but holds no evidence: p = r = f1 = 0.
    assert m == pytest.approx({"precision": 0.25, "recall": 1 / 6, "f1": 0.2, "kept_mean": 1.5})
    # No bars: all kept. q1: p 2/6, r 2/3, f1 4/9; q2: p 1/2, r 1, f1 2/3.
    m = kept_f1(_cands(), SCORES, None)
    assert m == pytest.approx({"precision": 5 / 12, "recall": 5 / 6, "f1": 5 / 9, "kept_mean": 4.0})
    m = kept_f1(_cands(), SCORES, None, keep=1)
    # q1 keeps 1 (gold 0): p 1, r 1/3, f1 .5; q2 keeps 1 (no evidence): 0.
    assert m == pytest.approx({"precision": 0.5, "recall": 1 / 6, "f1": 0.25, "kept_mean": 1.0})
    # Bars above every score: nothing kept scores 0.
    assert kept_f1(_cands(), SCORES, Bars(lower=5.0, upper=5.0)) == pytest.approx(
        {"precision": 0.0, "recall": 0.0, "f1": 0.0, "kept_mean": 0.0}
    )


def test_calibrate_bars_is_the_best_of_its_grid() -> None:
    rng = np.random.default_rng(0)
    cands, scores = [], []
    for q in range(6):
        n = 12
        hits = [[int(j)] if rng.random() < 0.3 else [] for j in range(n)]
        cands.append(
            Candidates(
                question_id=f"q{q}",
                query="q",
                texts=[str(j) for j in range(n)],
                paper_ids=["P"] * n,
                gold_paper="P",
                hits=hits,
                n_gold=max(1, sum(1 for h in hits if h)),
            )
        )
        scores.append([float(rng.normal(1.0 if h else 0.0)) for h in hits])
    bars, m = calibrate_bars(cands, scores, keep=4, supported_rank=5, grid=10)
    assert bars.lower <= bars.upper
    assert m == kept_f1(cands, scores, bars, keep=4, supported_rank=5)
    # Brute force over the same quantile grid.
    flat = np.concatenate([np.asarray(s) for s in scores])
    qs = np.unique(np.round(np.quantile(flat, np.linspace(0.02, 0.98, 10)), 4))
    best = max(
        kept_f1(cands, scores, Bars(lower=float(lo), upper=float(hi)), keep=4, supported_rank=5)["f1"]
        for lo in qs
        for hi in qs
        if hi >= lo
    )
    assert m["f1"] == pytest.approx(best)
    assert m["f1"] > kept_f1(cands, scores, None, keep=4, supported_rank=5)["f1"] - 1e-12


def test_calibrate_bars_separates_obvious_scores() -> None:
    # Evidence scores 0.9, everything else 0.1: any lower bar in (0.1, 0.9] keeps exactly the evidence.
    cands = _cands()
    scores = [[0.9 if h else 0.1 for h in c.hits] for c in cands]
    bars, m = calibrate_bars(cands, scores)
    assert 0.1 < bars.lower <= 0.9 and bars.lower <= bars.upper
    # q1 keeps both of its evidence chunks (2 of 3 gold): f1 .8; q2 keeps its one: f1 1.
    assert m["precision"] == pytest.approx(1.0) and m["f1"] == pytest.approx(0.9)


def test_score_histogram_counts_every_candidate_once() -> None:
    h = score_histogram(_cands(), SCORES, bins=5, supported_rank=2)
    edges = h["edges"]
    assert isinstance(edges, list) and len(edges) == 6
    assert edges[0] == pytest.approx(0.1) and edges[-1] == pytest.approx(0.9)
    counts = {k: v for k, v in h.items() if k != "edges"}
    assert all(isinstance(v, list) and len(v) == 5 for v in counts.values())
    totals = {k: sum(v) for k, v in counts.items()}
    # Ranks 1-2: q1's 0 (other) and 1 (evidence), q2's 0 (evidence) and 1 (other); q1's 2-5: 5 is evidence.
    assert totals == {"top_evidence": 2, "top_other": 2, "rest_evidence": 1, "rest_other": 3}
    assert sum(totals.values()) == sum(len(c.texts) for c in _cands())


# --- the retrieval pipeline on a small hash-embedder library -----------------------------------


@pytest.fixture(scope="module")
def lib(small_library: Callable[..., Settings]) -> Settings:
    return small_library(rerank={"provider": "none"})


def test_retriever_with_the_identity_keeps_the_fused_order(lib: Settings) -> None:
    store, embedder = open_for_search(lib)
    try:
        hybrid = HybridRetriever(store, embedder, lib.retrieval)
        retriever = make_reranking_retriever(lib, store, hybrid, IdentityReranker())
        r = retriever.search("ontology semantic parser grammar Wikipedia")
    finally:
        store.close()
    fused_ids = [h.chunk.id for h in r.hybrid.fused]
    assert len(fused_ids) == 25
    assert [c.chunk.id for c in r.ranked] == fused_ids
    assert [c.fused_rank for c in r.ranked] == list(range(1, 26))
    assert [c.chunk.id for c in r.kept] == fused_ids[:8]
    # The query names no paper: its papers are ranked too (timed as "papers").
    assert r.model == "none" and set(r.timings) == {"search", "rerank", "papers"} and r.papers
    # found_by names the searches whose lists hold the chunk.
    lists = {
        "abstracts": r.hybrid.dense_abstracts,
        "passages": r.hybrid.dense_passages,
        "bm25": r.hybrid.bm25,
    }
    assert tuple(lists) == SEARCHES
    for c in r.ranked:
        want = [name for name, hits in lists.items() if c.chunk.id in {h.chunk.id for h in hits}]
        assert c.found_by == want and want
    # found_by also names chunks the fusion cut (past fused_k); the ranked ones match it.
    every = found_by(r.hybrid)
    assert {cid: every[cid] for cid in fused_ids} == {c.chunk.id: c.found_by for c in r.ranked}
    assert set(every) == {h.chunk.id for hits in lists.values() for h in hits}


def test_search_many_concurrent_equals_sequential(lib: Settings) -> None:
    store, embedder = open_for_search(lib)
    try:
        hybrid = HybridRetriever(store, embedder, lib.retrieval)
        retriever = make_reranking_retriever(lib, store, hybrid, IdentityReranker())
        queries = [
            "ontology learning from text",
            "semantic parser grammar induction",
            "evaluation on Wikipedia",
        ]
        concurrent = retriever.search_many(queries, concurrent=True)
        sequential = retriever.search_many(queries, concurrent=False)
    finally:
        store.close()
    assert len(concurrent) == len(sequential) == 3
    for a, b in zip(concurrent, sequential, strict=True):
        assert [c.chunk.id for c in a.ranked] == [c.chunk.id for c in b.ranked]
        assert [c.chunk.id for c in a.kept] == [c.chunk.id for c in b.kept]
        assert [c.found_by for c in a.ranked] == [c.found_by for c in b.ranked]
        assert len(a.kept) <= 8 and set(a.timings) == {"search", "rerank", "papers"}
        assert [p.paper_id for p in a.papers] == [p.paper_id for p in b.papers]


def test_make_reranking_retriever_uses_the_configured_reranker_and_mmr_vectors(lib: Settings) -> None:
    store, embedder = open_for_search(lib)
    try:
        hybrid = HybridRetriever(store, embedder, lib.retrieval)
        assert isinstance(make_reranking_retriever(lib, store, hybrid).stage.reranker, IdentityReranker)
        mmr = lib.model_copy(update={"rerank": lib.rerank.model_copy(update={"mmr": True})})
        r = make_reranking_retriever(mmr, store, hybrid, FusedOrderReranker()).search(
            "ontology semantic parser grammar Wikipedia"
        )
    finally:
        store.close()
    # MMR only reorders: the same candidates, the first one first.
    assert sorted(c.chunk.id for c in r.ranked) == sorted(h.chunk.id for h in r.hybrid.fused)
    assert r.ranked[0].chunk.id == r.hybrid.fused[0].chunk.id


def test_store_get_vectors_returns_the_stored_vectors(lib: Settings) -> None:
    store, embedder = open_for_search(lib)
    try:
        hits = HybridRetriever(store, embedder, lib.retrieval).search("semantic parsing").fused[:6]
        chunks = [h.chunk for h in hits]
        ids = [c.id for c in chunks] + ["nope:0000:00000000"]
        got = store.get_vectors(ids)
        assert store.get_vectors([]).shape == (0, embedder.dim)
        # What the build stored: the chunk's vector, or the normalised mean of its parts' vectors.
        want = []
        for c in chunks:
            mean = embedder.embed(c.texts_to_embed).mean(axis=0)
            want.append(mean / np.linalg.norm(mean))
    finally:
        store.close()
    assert got.shape == (7, embedder.dim) and got.dtype == np.float32
    np.testing.assert_allclose(got[:6], np.asarray(want), atol=1e-5)
    assert not got[6].any()


# --- fusion weight -------------------------------------------------------------------------------


def test_combine_adds_the_weighted_log_rank_prior() -> None:
    from arag.retrieval.rerank import combine

    assert combine([1.0, 1.0, 0.5], [1, 2, 4], 0.0) == [1.0, 1.0, 0.5]
    got = combine([1.0, 1.0, 0.5], [1, 2, 4], 0.5)
    assert got == pytest.approx([1.0, 1.0 - 0.5 * math.log(2), 0.5 - 0.5 * math.log(4)])


def test_fit_fusion_weight_keeps_the_fused_order_when_the_model_is_noise() -> None:
    from arag.train.calibrate import fit_fusion_weight

    # Gold at fused rank 1 everywhere; the model scores prefer rank 3 by a little: a weight large enough
    # to restore rank 1 wins, and the smallest such grid value is chosen (ties keep the first).
    cands = [
        Candidates(
            question_id=f"q{i}",
            query="q",
            texts=["a", "b", "c", "d"],
            paper_ids=["P"] * 4,
            gold_paper="P",
            hits=[[0], [], [], []],
            n_gold=1,
        )
        for i in range(4)
    ]
    scores = [np.asarray([0.0, 0.0, 0.2, 0.0]) for _ in cands]
    w, fit = fit_fusion_weight(cands, scores, grid=(0.0, 0.1, 0.2, 0.5))
    # 0.2 > w * ln 3 needs w > 0.182: 0.2 is the first grid value that puts the gold first.
    assert w == 0.2 and fit["ndcg@10"] == pytest.approx(1.0) and fit["ndcg@10_two_fold"] == pytest.approx(1.0)


def test_rerank_stage_final_score_keeps_part_of_the_fused_order() -> None:
    fused = _fused(_chunk("a", "P1", "a"), _chunk("b", "P1", "b"), _chunk("c", "P2", "c"))
    # The model prefers c (rank 3) by 0.5; with weight 1, c loses ln 3 = 1.10 and a wins.
    model = ScriptedReranker({"a": 0.0, "b": -1.0, "c": 0.5}, None, fusion_weight=1.0)
    r = RerankStage(model, RerankSettings()).run("q", fused)
    assert [c.chunk.id for c in r.ranked] == ["a", "c", "b"]
    assert [c.rerank_score for c in r.ranked] == [0.0, 0.5, -1.0]  # the raw model scores stay visible
    assert r.ranked[1].score == pytest.approx(0.5 - math.log(3))
