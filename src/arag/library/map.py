"""The map of the library: every paper as a point in 2-D, from its abstract vector, beside its topic.

The projection is computed when the topics are (at build time, ``arag library topics --recluster``,
after adds) and stored in the build state, so the page only reads it. t-SNE (scikit-learn, cosine,
PCA-initialised, seeded: the same library gives the same map) keeps neighbours together, which PCA's
two directions of largest variance do not for sentence vectors (the topics overlap in a blob). A
paper added later is placed, like its topic, without moving the others: at the similarity-weighted
mean of its nearest mapped papers. Libraries too small for t-SNE's perplexity get PCA, and the
stored map says which method drew it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

from arag.library.state import LibraryState, PaperRow

log = logging.getLogger(__name__)

MAP_KEY = "map"
MapMethod = Literal["tsne", "pca"]
# t-SNE needs perplexity < n; under this many papers its picture means little: PCA draws it.
MIN_TSNE_PAPERS = 10
PERPLEXITY = 30.0
# A paper added later sits among this many nearest mapped papers.
NEIGHBOURS = 5


class MapPoint(BaseModel):
    """One paper on the map; x and y lie in [-1, 1]."""

    id: str
    title: str
    year: int | None
    topic: int | None
    topic_label: str | None
    x: float
    y: float


class MapTopic(BaseModel):
    """A topic's label and where it sits: the median of its papers' points."""

    topic: int
    label: str
    papers: int
    x: float
    y: float


class LibraryMap(BaseModel):
    """What ``GET /map`` returns and the page draws."""

    method: MapMethod = Field(description="tsne, or pca for libraries under 10 papers")
    projected: int = Field(description="papers in the last full projection; the rest were placed later")
    papers: list[MapPoint]
    topics: list[MapTopic]


def _unit(vectors: np.ndarray) -> np.ndarray:
    x = np.asarray(vectors, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _scale(y: np.ndarray) -> np.ndarray:
    """Centred and scaled into [-1, 1] (the aspect ratio kept)."""
    y = y - y.mean(axis=0, keepdims=True)
    span = float(np.abs(y).max()) if y.size else 0.0
    return y / span if span > 0 else y


def project(vectors: np.ndarray, method: MapMethod = "tsne", seed: int = 0) -> tuple[np.ndarray, MapMethod]:
    """2-D coordinates in [-1, 1] for unit-normalised ``vectors``, and the method that drew them
    (PCA when t-SNE was asked for fewer than MIN_TSNE_PAPERS vectors)."""
    n = len(vectors)
    if n == 0:
        return np.zeros((0, 2)), method
    x = _unit(vectors)
    if method == "tsne" and n >= MIN_TSNE_PAPERS:
        from sklearn.manifold import TSNE

        perplexity = min(PERPLEXITY, (n - 1) / 3)
        y = TSNE(
            n_components=2, init="pca", random_state=seed, perplexity=perplexity, metric="cosine"
        ).fit_transform(x)
        return _scale(np.asarray(y, dtype=np.float64)), "tsne"
    if n == 1:
        return np.zeros((1, 2)), "pca"
    from sklearn.decomposition import PCA

    k = min(2, n, x.shape[1])
    y = PCA(n_components=k, random_state=seed).fit_transform(x)
    if k < 2:
        y = np.hstack([y, np.zeros((n, 2 - k))])
    return _scale(np.asarray(y, dtype=np.float64)), "pca"


def place(new: np.ndarray, ref: np.ndarray, ref_xy: np.ndarray, k: int = NEIGHBOURS) -> np.ndarray:
    """Points for vectors ``new`` among mapped ones (``ref`` at ``ref_xy``): the mean of their ``k``
    most similar mapped papers' points, weighted by cosine (negative similarity counts as none)."""
    if len(new) == 0 or len(ref) == 0:
        return np.zeros((len(new), 2))
    sims = _unit(new) @ _unit(ref).T
    k = min(k, len(ref))
    out = np.empty((len(new), 2))
    for i, row in enumerate(sims):
        # A stable order: ties go to the earlier mapped paper.
        idx = np.argsort(-row, kind="stable")[:k]
        w = np.clip(row[idx], 0.0, None) + 1e-6
        out[i] = (w[:, None] * ref_xy[idx]).sum(axis=0) / w.sum()
    return out


def topics_key(state: LibraryState) -> str:
    """Which clustering the topics come from (papers clustered, centroids): a map drawn for another
    one is stale (a build killed while drawing it after a recluster)."""
    cents = state.get_meta("topic_centroids") or []
    return f"{state.get_meta('topic_clustered_papers') or 0}:{len(cents)}"


def map_missing(state: LibraryState) -> bool:
    """Whether some recorded paper has no point on the stored map, the map belongs to an earlier
    clustering of the topics, or there is no map."""
    stored = state.get_meta(MAP_KEY)
    if not stored:
        return bool(state.papers())
    if stored.get("topics") != topics_key(state):
        return True
    points = stored.get("points", {})
    return any(r.id not in points for r in state.papers())


def update_map(
    state: LibraryState,
    rows: Sequence[PaperRow],
    vectors: np.ndarray,
    *,
    method: MapMethod,
    seed: int,
    recompute: bool,
) -> None:
    """Store the map of ``rows`` (their abstract vectors in ``vectors``, same order): projected anew
    when ``recompute``, when there is none, or when the method or the topics' clustering changed since
    it was drawn; otherwise papers without a point are placed among the mapped ones and papers no
    longer recorded are forgotten."""
    stored = state.get_meta(MAP_KEY) or {}
    points: dict[str, list[float]] = stored.get("points", {})
    ids = [r.id for r in rows]
    key = topics_key(state)
    if recompute or not points or stored.get("asked") != method or stored.get("topics") != key:
        xy, used = project(vectors, method, seed)
        new_points = {
            pid: [round(float(a), 5), round(float(b), 5)] for pid, (a, b) in zip(ids, xy, strict=True)
        }
        state.set_meta(
            MAP_KEY,
            {"method": used, "asked": method, "topics": key, "projected": len(ids), "points": new_points},
        )
        log.info("mapped %d papers (%s)", len(ids), used)
        return
    have = [i for i, pid in enumerate(ids) if pid in points]
    todo = [i for i, pid in enumerate(ids) if pid not in points]
    kept = {ids[i]: points[ids[i]] for i in have}
    if todo:
        ref_xy = np.asarray([points[ids[i]] for i in have], dtype=np.float64)
        xy = place(vectors[todo], vectors[have], ref_xy)
        for i, (a, b) in zip(todo, xy, strict=True):
            kept[ids[i]] = [round(float(a), 5), round(float(b), 5)]
    if todo or len(kept) != len(points):
        state.set_meta(MAP_KEY, {**stored, "points": kept})


def load_map(state: LibraryState) -> LibraryMap | None:
    """The stored map with each paper's title and topic; None when the library has none yet."""
    stored = state.get_meta(MAP_KEY)
    if not stored or not stored.get("points"):
        return None
    points: dict[str, list[float]] = stored["points"]
    papers = [
        MapPoint(
            id=r.id,
            title=r.title,
            year=r.year,
            topic=r.topic,
            topic_label=r.topic_label,
            x=points[r.id][0],
            y=points[r.id][1],
        )
        for r in state.papers()
        if r.id in points
    ]
    by_topic: dict[int, list[MapPoint]] = {}
    for p in papers:
        if p.topic is not None:
            by_topic.setdefault(p.topic, []).append(p)
    labels = state.get_meta("topic_labels") or {}
    topics = [
        MapTopic(
            topic=t,
            label=labels.get(str(t)) or members[0].topic_label or f"topic {t}",
            papers=len(members),
            x=round(float(np.median([m.x for m in members])), 5),
            y=round(float(np.median([m.y for m in members])), 5),
        )
        for t, members in sorted(by_topic.items())
    ]
    return LibraryMap(
        method=stored.get("method", "tsne"),
        projected=int(stored.get("projected", len(papers))),
        papers=papers,
        topics=topics,
    )
