"""The map of the library (library/map.py): the projection of abstract vectors, stored with the topics
at build time, recomputed with them, new papers placed without moving the others; and a library built
before maps existed gets one from `arag library topics` or a no-op build."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from arag.bench.map import neighbour_agreement, run_map_bench, topic_purity
from arag.cli.main import app
from arag.library.build import LibraryBuilder
from arag.library.manage import build_library
from arag.library.map import MAP_KEY, load_map, map_missing, place, project
from arag.library.state import LibraryState
from arag.records import Paper
from arag.settings import Settings, get_settings

SMALL = {"embedding": {"provider": "hash"}, "topics": {"k": 3}, "rerank": {"provider": "none"}}


def blobs(n_per: int = 8, dim: int = 16, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = np.eye(dim)[:3] * 3
    return np.concatenate([c + 0.1 * rng.standard_normal((n_per, dim)) for c in centres])


def test_tsne_keeps_clusters_apart_deterministically_within_the_unit_box() -> None:
    x = blobs()
    xy, method = project(x, "tsne", seed=0)
    again, _ = project(x, "tsne", seed=0)
    assert method == "tsne" and xy.shape == (24, 2) and np.array_equal(xy, again)
    assert np.abs(xy).max() == pytest.approx(1.0) and np.allclose(xy.mean(axis=0), 0.0, atol=1e-9)
    # Every paper is nearer its own cluster's centre on the map than another cluster's.
    centres = np.stack([xy[i * 8 : (i + 1) * 8].mean(axis=0) for i in range(3)])
    nearest = np.argmin(((xy[:, None, :] - centres[None]) ** 2).sum(axis=2), axis=1)
    assert nearest.tolist() == [i // 8 for i in range(24)]


def test_small_libraries_get_pca_and_say_so() -> None:
    xy, method = project(blobs(n_per=3), "tsne")
    assert method == "pca" and xy.shape == (9, 2) and np.abs(xy).max() == pytest.approx(1.0)
    assert project(blobs(), "pca")[1] == "pca"
    one, _ = project(np.ones((1, 4)), "tsne")
    assert one.tolist() == [[0.0, 0.0]]
    assert project(np.zeros((0, 4)))[0].shape == (0, 2)


def test_a_new_paper_is_placed_among_its_nearest_mapped_papers() -> None:
    ref = np.eye(4)
    ref_xy = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])
    assert place(ref[[2]], ref, ref_xy, k=1).tolist() == [[0.0, 1.0]]
    # Halfway between two mapped papers, equally similar to both: their midpoint.
    mid = place(np.array([[0.0, 1.0, 1.0, 0.0]]), ref, ref_xy, k=2)
    assert np.allclose(mid, [[0.5, 0.5]], atol=1e-5)


def test_the_benchmark_scores_a_map_by_the_neighbours_it_keeps() -> None:
    # Unit vectors on a circle drawn where they are: distance orders as cosine does, every neighbour kept.
    angles = np.cumsum(np.arange(1, 21) * 0.02)  # unequal gaps: no tied neighbours
    circle = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    assert neighbour_agreement(circle, circle, k=3) == 1.0
    shuffled = circle[np.random.default_rng(0).permutation(20)]
    assert neighbour_agreement(circle, shuffled, k=3) < 0.5
    x = blobs()
    xy, _ = project(x, "tsne")
    topics = np.repeat([0, 1, 2], 8)
    assert topic_purity(xy, topics, k=5) == 1.0
    assert topic_purity(np.zeros((24, 2)) + np.arange(24)[:, None], np.tile([0, 1, 2], 8), k=2) == 0.0


def settings_for(data: Path) -> Settings:
    return get_settings(data_dir=data, **SMALL)


def stored_points(settings: Settings) -> dict[str, list[float]]:
    state = LibraryState(settings.state_db)
    try:
        return dict(state.get_meta(MAP_KEY)["points"])
    finally:
        state.close()


def extra_paper() -> Paper:
    return Paper(
        id="2101.00001",
        title="Learning an ontology for a semantic parser",
        abstract="We learn an ontology and a semantic parser from text with grammar induction.",
        source="arxiv",
        year=2021,
    )


def test_the_build_stores_the_map_and_recluster_recomputes_it_identically(
    tmp_path: Path, qasper_path: Path
) -> None:
    settings = settings_for(tmp_path / "lib")
    build_library(get_settings(data_dir=tmp_path / "lib", corpus={"max_papers": 12}, **SMALL))
    state = LibraryState(settings.state_db)
    try:
        stored = state.get_meta(MAP_KEY)
        assert stored["method"] == "tsne" and stored["projected"] == 12 and not map_missing(state)
        m = load_map(state)
        assert m is not None and len(m.papers) == 12 and {p.id for p in m.papers} == set(stored["points"])
        assert sum(t.papers for t in m.topics) == 12 and len(m.topics) == 3
        for t in m.topics:
            members = [p for p in m.papers if p.topic == t.topic]
            assert t.label == members[0].topic_label and -1 <= t.x <= 1 and -1 <= t.y <= 1
    finally:
        state.close()
    bench = run_map_bench(settings)
    assert bench.papers == 12 and [r.method for r in bench.results] == ["pca", "tsne"]
    assert all(0.0 <= r.neighbour_agreement <= 1.0 and 0.0 <= r.topic_purity <= 1.0 for r in bench.results)
    before = stored_points(settings)
    with LibraryBuilder(settings) as builder:
        builder.update_topics(recluster=True)
    assert stored_points(settings) == before  # seeded: the same library, the same map

    # A paper added later is placed among the others, which stay where they were (12 -> 13 papers does
    # not grow the library past the recluster threshold).
    with LibraryBuilder(settings) as builder:
        builder.index_papers([extra_paper()])
    after = stored_points(settings)
    assert {k: v for k, v in after.items() if k in before} == before
    assert "2101.00001" in after and all(-1.0 <= c <= 1.0 for c in after["2101.00001"])


def test_a_library_without_a_map_gets_one_from_topics_or_a_noop_build(
    tmp_path: Path, qasper_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "lib"
    build_library(get_settings(data_dir=data, corpus={"max_papers": 6}, **SMALL))
    settings = settings_for(data)
    mapped = stored_points(settings)

    def forget() -> None:
        state = LibraryState(settings.state_db)
        try:
            state.set_meta(MAP_KEY, None)
            assert map_missing(state) and load_map(state) is None
        finally:
            state.close()

    forget()
    build_library(get_settings(data_dir=data, corpus={"max_papers": 6}, **SMALL))  # nothing to add
    assert stored_points(settings) == mapped

    # A map drawn for an earlier clustering (a build killed while drawing after a recluster) is stale.
    state = LibraryState(settings.state_db)
    try:
        state.set_meta(MAP_KEY, {**state.get_meta(MAP_KEY), "topics": "5:3"})
        assert map_missing(state)
    finally:
        state.close()
    build_library(get_settings(data_dir=data, corpus={"max_papers": 6}, **SMALL))
    assert stored_points(settings) == mapped

    forget()
    monkeypatch.setenv("ARAG_DATA_DIR", str(data))
    monkeypatch.setenv("ARAG_EMBEDDING__PROVIDER", "hash")
    monkeypatch.setenv("ARAG_TOPICS__K", "3")
    topics_before = {r.id: r.topic for r in LibraryState(settings.state_db).papers()}
    r = CliRunner().invoke(app, ["library", "topics"])
    assert r.exit_code == 0, r.output
    assert stored_points(settings) == mapped
    assert {r.id: r.topic for r in LibraryState(settings.state_db).papers()} == topics_before
