"""Hybrid search on a small library built with the hash embedder."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arag.cli.main import app
from arag.errors import InputError, StoreError
from arag.library.manage import open_for_search
from arag.records import SearchFilter
from arag.retrieval.hybrid import HybridRetriever
from arag.settings import Settings, get_settings


@pytest.fixture(scope="module")
def lib(small_library: Callable[..., Settings]) -> Settings:
    return small_library()


def test_three_searches_fused(lib: Settings) -> None:
    store, embedder = open_for_search(lib)
    try:
        r = HybridRetriever(store, embedder, lib.retrieval).search(
            "ontology semantic parser grammar Wikipedia"
        )
    finally:
        store.close()
    assert len(r.dense_abstracts) <= 5 and {h.chunk.type for h in r.dense_abstracts} == {"abstract"}
    assert len(r.dense_passages) == 15 and {h.chunk.type for h in r.dense_passages} <= {"passage", "table"}
    assert len(r.bm25) == 20
    assert len(r.fused) == 25 == len({h.chunk.id for h in r.fused})
    assert r.fused[0].chunk.paper_id == "1601.00901"
    scores = [h.score for h in r.fused]
    assert scores == sorted(scores, reverse=True)


def test_filters_scope_every_search(lib: Settings) -> None:
    store, embedder = open_for_search(lib)
    try:
        retriever = HybridRetriever(store, embedder, lib.retrieval)
        scoped = retriever.search("semantic parsing", SearchFilter(paper_ids=["1601.01705"]))
        assert scoped.fused and {h.chunk.paper_id for h in scoped.fused} == {"1601.01705"}
        # One paper: no reserved abstract slice; its abstract competes with its passages.
        assert scoped.dense_abstracts == []
        deep = HybridRetriever(store, embedder, lib.retrieval.model_copy(update={"passage_k": 1000}))
        everything = deep.search("semantic parsing", SearchFilter(paper_ids=["1601.01705"])).dense_passages
        assert [h.chunk.type for h in everything].count("abstract") == 1
        only_abs = retriever.search("semantic parsing", SearchFilter(types=["abstract"]))
        assert only_abs.dense_passages == [] and {h.chunk.type for h in only_abs.fused} == {"abstract"}
        stop = retriever.search("the of and")  # no BM25 terms: dense still answers
        assert stop.bm25 == [] and stop.fused
    finally:
        store.close()


def test_search_cli(lib: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARAG_DATA_DIR", str(lib.data_dir))
    monkeypatch.setenv("ARAG_EMBEDDING__PROVIDER", "hash")
    monkeypatch.setenv("ARAG_RERANK__PROVIDER", "none")
    runner = CliRunner()
    res = runner.invoke(app, ["search", "ontology grammar", "--json", "-k", "3"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    hits = out["hits"]
    assert len(hits) == 3 and hits[0]["chunk"]["paper_id"] == "1601.00901"
    # The query names no paper: the papers are ranked too, each with its best passages.
    assert out["resolved_paper"] is None and out["papers"][0]["paper_id"] == "1601.00901"
    assert [p["rank"] for p in out["papers"]] == list(range(1, len(out["papers"]) + 1))
    for p in out["papers"]:
        assert p["passages"] and p["passages"][0]["chunk"]["paper_id"] == p["paper_id"]
    shown = runner.invoke(app, ["search", "ontology grammar", "--explain"])
    assert shown.exit_code == 0 and "stages" in shown.output and "fused #" in shown.output
    assert "the question names none: ranked by" in shown.output
    bad = runner.invoke(app, ["search", "x", "--type", "figure"])
    assert bad.exit_code == InputError.exit_code and "abstract, passage or table" in bad.output


def test_search_without_a_library_says_build_first(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="arag library build"):
        open_for_search(get_settings(data_dir=tmp_path / "none", embedding={"provider": "hash"}))


def test_eval_retrieval_cli_on_questions_of_the_built_papers(
    lib: Settings, shared_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from arag.library.manage import list_papers

    ids = {r.id for r in list_papers(lib)}
    train = json.loads((shared_dir / "benchmarks" / "qasper" / "questions_train.json").read_text())
    mine = [q for q in train if q["paper_id"] in ids]
    assert mine, "the first papers of the corpus have train questions"
    qfile = tmp_path / "q.json"
    qfile.write_text(json.dumps(mine))
    monkeypatch.setenv("ARAG_DATA_DIR", str(lib.data_dir))
    monkeypatch.setenv("ARAG_EMBEDDING__PROVIDER", "hash")
    monkeypatch.setenv("ARAG_RERANK__PROVIDER", "none")
    out = tmp_path / "r.json"
    png = tmp_path / "ablation.png"
    res = CliRunner().invoke(
        app, ["eval", "retrieval", "--questions", str(qfile), "--json", str(out), "--plot", str(png)]
    )
    assert res.exit_code == 0, res.output
    reports = json.loads(out.read_text())
    assert [(r["scope"], r["method"]) for r in reports] == [
        (s, m)
        for s in ("library", "paper")
        for m in ("dense", "bm25", "hybrid", "hybrid+resolve", "+rerank", "+rerank+mmr")
    ]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    by = {(r["scope"], r["method"]): r["metrics"] for r in reports}
    # The identity reranker keeps the fused order, so its row repeats hybrid+resolve's.
    assert by[("library", "+rerank")] == by[("library", "hybrid+resolve")]
    for r in reports:
        for m in r["metrics"].values():
            assert 0.0 <= m["lo"] <= m["mean"] <= m["hi"] <= 1.0
        assert (
            r["metrics"]["recall@5"]["mean"]
            <= r["metrics"]["recall@10"]["mean"]
            <= r["metrics"]["recall@20"]["mean"]
        )
    paper_scoped = [r["metrics"] for r in reports if r["scope"] == "paper"]
    assert all(m["paper@5"]["mean"] == 1.0 for m in paper_scoped)  # scoped search only returns that paper
    assert max(m["recall@10"]["mean"] for m in paper_scoped) > 0.2  # the evidence is in these papers' chunks


def test_a_named_paper_scopes_the_search(lib: Settings) -> None:
    from arag.library.manage import load_resolver

    resolver = load_resolver(lib)
    title = resolver.titles["1601.01705"]
    store, embedder = open_for_search(lib)
    try:
        retriever = HybridRetriever(store, embedder, lib.retrieval, resolver)
        named = retriever.search(f"In the paper '{title}': which datasets do they use?")
        assert named.resolved is not None and named.resolved.paper_id == "1601.01705"
        assert named.resolved.method == "quoted-title"
        assert {h.chunk.paper_id for h in named.fused} == {"1601.01705"}
        unnamed = retriever.search("which datasets do they use?")
        assert unnamed.resolved is None and len({h.chunk.paper_id for h in unnamed.fused}) > 1
        # An explicit paper filter wins over resolution.
        forced = retriever.search(
            f"In the paper '{title}': which datasets?", SearchFilter(paper_ids=["1601.00901"])
        )
        assert forced.resolved is None and {h.chunk.paper_id for h in forced.fused} == {"1601.00901"}
    finally:
        store.close()


def test_sub_queries_concurrent_equals_sequential(lib: Settings) -> None:
    store, embedder = open_for_search(lib)
    calls: list[int] = []
    real = embedder.embed_batch

    def counting(texts):  # type: ignore[no-untyped-def]
        calls.append(len(texts))
        return real(texts)

    embedder.embed_batch = counting  # type: ignore[method-assign]
    try:
        retriever = HybridRetriever(store, embedder, lib.retrieval)
        queries = [
            "ontology learning from text",
            "semantic parser grammar induction",
            "evaluation on Wikipedia",
        ]
        concurrent = retriever.search_many(queries)
        assert calls == [3]  # one batch for all sub-queries, before any search
        sequential = retriever.search_many(queries, concurrent=False)
        ids = [h.chunk.id for h in concurrent.merged]
        assert ids == [h.chunk.id for h in sequential.merged]
        assert len(ids) == len(set(ids)) > 25
        for a, b in zip(concurrent.per_query, sequential.per_query, strict=True):
            assert [h.chunk.id for h in a.fused] == [h.chunk.id for h in b.fused]
        # The merge keeps sub-query order: the first sub-query's hits come first.
        assert ids[: len(concurrent.per_query[0].fused)] == [
            h.chunk.id for h in concurrent.per_query[0].fused
        ]
    finally:
        store.close()


def test_eval_anchors_cli(lib: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ARAG_DATA_DIR", str(lib.data_dir))
    monkeypatch.setenv("ARAG_EMBEDDING__PROVIDER", "hash")
    monkeypatch.setenv("ARAG_RERANK__PROVIDER", "none")
    out = tmp_path / "a.json"
    res = CliRunner().invoke(app, ["eval", "anchors", "--json", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert report["papers"] == 6 and report["recall"] == 1.0 and report["misses"] == []


def test_bench_retrieval_runs_every_stage(
    lib: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ARAG_DATA_DIR", str(lib.data_dir))
    monkeypatch.setenv("ARAG_EMBEDDING__PROVIDER", "hash")
    monkeypatch.setenv("ARAG_RERANK__PROVIDER", "none")
    out = tmp_path / "b.json"
    res = CliRunner().invoke(app, ["bench", "retrieval", "--queries", "12", "--json", str(out)])
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    assert set(r["stage_ms"]) == {"embed", "dense", "sparse", "fuse", "rerank"}
    assert r["reranker"] == "none" and r["rerank_candidates"] == 25
    assert r["queries"] == 12 and all(v > 0 for v in r["stage_ms"].values())
    assert r["cold_start_ms"] > r["index_open_ms"] > 0
    assert r["one_query_reranked_ms"] > 0 and r["one_named_query_reranked_ms"] > 0


def test_open_retrieval_reads_the_build_state_once_and_closes_the_store(
    lib: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from arag.library.manage import list_papers, open_retrieval
    from arag.library.state import LibraryState
    from arag.models.reranker import IdentityReranker

    papers = list_papers(lib)
    visits: list[Path] = []
    real_init = LibraryState.__init__

    def counting(self: LibraryState, path: Path, *args: object, **kwargs: object) -> None:
        visits.append(path)
        real_init(self, path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(LibraryState, "__init__", counting)
    with open_retrieval(lib, reranker=IdentityReranker()) as retrieval:
        assert visits.count(lib.state_db) == 1
        assert [r.id for r in retrieval.papers] == [r.id for r in papers]
        assert retrieval.hybrid.resolver is retrieval.resolver and retrieval.plain.resolver is None
        title = retrieval.resolver.titles["1601.01705"]
        result = retrieval.retriever.search(f"In the paper '{title}': which datasets do they use?")
        assert result.hybrid.resolved is not None and result.hybrid.resolved.paper_id == "1601.01705"
        assert result.model == "none"
        assert retrieval.retriever is retrieval.retriever  # built once
        store = retrieval.store
    # Closed: the store refuses further searches, and the library opens again.
    with pytest.raises(StoreError, match="closed"):
        store.count()
    with open_retrieval(lib) as again:
        assert again.store.count() > 0
