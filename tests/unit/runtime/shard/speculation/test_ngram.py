"""NgramIndex: the longest suffix that occurred before, its most recent occurrence, incrementally."""

from __future__ import annotations

import pytest

from tgictl.runtime.shard.speculation.ngram import NgramIndex


def brute_force(ids: list[int], sizes: range, limit: int) -> list[int]:
    """The definition: for the longest n with an earlier occurrence of the last n tokens, what followed
    the latest such occurrence."""
    for n in sorted(sizes, reverse=True):
        if len(ids) <= n:
            continue
        suffix = ids[-n:]
        for end in range(len(ids) - 1, n - 1, -1):
            if ids[end - n : end] == suffix:
                return ids[end : end + limit]
    return []


def test_longest_match_wins_and_the_latest_occurrence() -> None:
    index = NgramIndex(1, 3)
    ids = [1, 2, 3, 9, 2, 3, 8, 7, 1, 2, 3]
    # [1, 2, 3] occurred at the start (followed by 9); [2, 3] most recently before 8: the longer one wins.
    assert index.propose(ids, 2) == [9, 2]
    assert NgramIndex(1, 2).propose(ids, 2) == [8, 7]


def test_no_earlier_occurrence_gives_no_draft() -> None:
    assert NgramIndex(1, 3).propose([1, 2, 3, 4], 4) == []
    assert NgramIndex(2, 3).propose([5, 1, 5], 4) == []  # only a 1-gram repeats
    assert NgramIndex(1, 3).propose([5, 1, 5], 4) == [1, 5]


def test_limit_zero_only_updates_the_index() -> None:
    index = NgramIndex(1, 2)
    assert index.propose([4, 5, 6, 4], 0) == []
    assert index.propose([4, 5, 6, 4, 5], 3) == [6, 4, 5]


@pytest.mark.parametrize("seed", range(20))
def test_incremental_index_equals_the_definition(seed: int) -> None:
    import random

    rng = random.Random(seed)
    ids = [rng.randrange(6) for _ in range(rng.randrange(1, 10))]
    index = NgramIndex(1, 3)
    for _ in range(40):
        limit = rng.randrange(0, 5)
        assert index.propose(ids, limit) == brute_force(ids, range(1, 4), limit)
        ids.extend(rng.randrange(6) for _ in range(rng.randrange(1, 4)))


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="n-gram sizes"):
        NgramIndex(3, 2)
