"""``arag bench map``: the map's projections compared on the built library, in one run: PCA (the
baseline) against t-SNE (the default), each timed, and scored by how well the picture keeps what the
vectors say: the share of each paper's 10 nearest papers by abstract cosine that are among its 10
nearest on the map, and the share of its 10 nearest on the map that share its topic. Reads the
library (abstract vectors from the embedding cache); writes nothing to it."""

from __future__ import annotations

import time

import numpy as np
from pydantic import BaseModel

from arag.errors import InputError
from arag.library.map import MapMethod, project
from arag.library.state import LibraryState
from arag.models.factory import library_embedder
from arag.settings import Settings

NEIGHBOURS = 10


class ProjectionFigures(BaseModel):
    method: MapMethod
    seconds: float
    neighbour_agreement: float
    topic_purity: float


class MapBench(BaseModel):
    papers: int
    topics: int
    neighbours: int = NEIGHBOURS
    embed_seconds: float
    results: list[ProjectionFigures]


def _nearest(scores: np.ndarray, k: int) -> np.ndarray:
    """Each row's ``k`` best columns (highest score), itself excluded."""
    s = scores.copy()
    np.fill_diagonal(s, -np.inf)
    return np.argsort(-s, axis=1, kind="stable")[:, :k]


def neighbour_agreement(vectors: np.ndarray, xy: np.ndarray, k: int = NEIGHBOURS) -> float:
    """Mean share of each point's ``k`` nearest by cosine that are among its ``k`` nearest on the map."""
    x = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    near_v = _nearest(x @ x.T, k)
    d2 = ((xy[:, None, :] - xy[None, :, :]) ** 2).sum(axis=2)
    near_m = _nearest(-d2, k)
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(near_v, near_m, strict=True)]))


def topic_purity(xy: np.ndarray, topics: np.ndarray, k: int = NEIGHBOURS) -> float:
    """Mean share of each point's ``k`` nearest on the map that have its topic."""
    d2 = ((xy[:, None, :] - xy[None, :, :]) ** 2).sum(axis=2)
    near = _nearest(-d2, k)
    return float(np.mean(topics[near] == topics[:, None]))


def run_map_bench(settings: Settings, *, seed: int = 0) -> MapBench:
    """PCA and t-SNE on the library's abstract vectors, timed and scored."""
    with LibraryState(settings.state_db) as state:
        rows = state.papers()
    if len(rows) <= NEIGHBOURS or any(r.topic is None for r in rows):
        raise InputError(
            f"the library in {settings.data_dir} has {len(rows)} papers (with topics); the map benchmark "
            f"needs more than {NEIGHBOURS}",
            where="ARAG_DATA_DIR",
            fix="build a library first: arag library build",
        )
    embedder = library_embedder(settings)
    t0 = time.perf_counter()
    vectors = embedder.embed([r.abstract_text or r.title for r in rows])
    embed_s = time.perf_counter() - t0
    topics = np.asarray([r.topic for r in rows])
    results = []
    for method in ("pca", "tsne"):
        t0 = time.perf_counter()
        xy, used = project(vectors, method, seed)
        seconds = time.perf_counter() - t0
        results.append(
            ProjectionFigures(
                method=used,
                seconds=round(seconds, 2),
                neighbour_agreement=round(neighbour_agreement(vectors, xy), 4),
                topic_purity=round(topic_purity(xy, topics), 4),
            )
        )
    return MapBench(
        papers=len(rows), topics=len(set(topics.tolist())), embed_seconds=round(embed_s, 2), results=results
    )
