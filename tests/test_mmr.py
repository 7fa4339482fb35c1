from __future__ import annotations

import numpy as np
import pytest

from arag.retrieval.mmr import mmr_order


def test_near_duplicate_of_the_same_paper_moves_down() -> None:
    v = np.array([[1.0, 0.0], [1.0, 0.01], [0.6, 0.8]])
    # 0 and 1 are near-identical chunks of paper A; 2 is a different chunk of A.
    order = mmr_order([1.0, 0.9, 0.5], v, ["A", "A", "A"])
    # after 0: cand 1 = .7*.8 - .3*~1.0 = .26; cand 2 = .7*0 - .3*.6 = -.18 -> 1 then 2
    assert order == [0, 1, 2]
    order = mmr_order([1.0, 0.9, 0.8], v, ["A", "A", "A"])
    # rel scaled: 1, .5, 0 -> cand 1 = .35 - .3 = .05; cand 2 = 0 - .18 = -.18
    assert order == [0, 1, 2]
    order = mmr_order([1.0, 0.95, 0.9], v, ["A", "A", "A"], lam=0.3)
    # rel 1, .5, 0; lam .3: cand 1 = .15 - .7*1.0 = -.55; cand 2 = 0 - .7*.6 = -.42 -> 2 first
    assert order == [0, 2, 1]


def test_other_papers_never_count_as_duplicates() -> None:
    v = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    assert mmr_order([1.0, 0.9, 0.8], v, ["A", "B", "A"], lam=0.3) == [0, 1, 2]
    assert mmr_order([1.0, 0.9, 0.8], v, ["A", "A", "C"], lam=0.3) == [0, 2, 1]


def test_lambda_one_keeps_relevance_order_and_k_caps() -> None:
    v = np.eye(4)
    assert mmr_order([0.2, 0.9, 0.5, 0.9], v, list("AAAA"), lam=1.0) == [1, 3, 2, 0]
    assert mmr_order([0.2, 0.9, 0.5, 0.9], v, list("AAAA"), k=2) == [1, 3]
    assert mmr_order([], np.zeros((0, 2)), []) == []
    with pytest.raises(ValueError):
        mmr_order([1.0], v[:1], ["A"], lam=1.5)
