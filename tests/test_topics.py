from __future__ import annotations

import numpy as np

from arag.library.topics import assign_nearest, kmeans, label_clusters


def test_kmeans_finds_separated_clusters_deterministically() -> None:
    rng = np.random.default_rng(1)
    centers = np.eye(8)[:3]
    x = np.concatenate([c + 0.05 * rng.standard_normal((10, 8)) for c in centers])
    a1, c1 = kmeans(x, 3, seed=0)
    a2, c2 = kmeans(x, 3, seed=0)
    assert np.array_equal(a1, a2) and np.allclose(c1, c2)
    # each true cluster maps to exactly one label
    groups = [set(a1[i * 10 : (i + 1) * 10].tolist()) for i in range(3)]
    assert all(len(g) == 1 for g in groups)
    assert len(set().union(*groups)) == 3
    assert np.array_equal(assign_nearest(x, c1), a1)


def test_kmeans_caps_k_at_n() -> None:
    a, c = kmeans(np.eye(4)[:2], 20)
    assert c.shape == (2, 4) and sorted(a.tolist()) == [0, 1]


def test_labels_are_the_distinctive_terms() -> None:
    texts = [
        "speech recognition acoustic speech",
        "acoustic speech recognition",
        "translation translation parallel corpora",
        "parallel translation corpora",
    ]
    labels = label_clusters(texts, [0, 0, 1, 1], n_terms=2)
    assert labels == {0: "speech, acoustic", 1: "translation, corpora"}
