"""The tensor-parallel split rule: KV-head groups as evenly as possible, replication beyond KV heads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tgictl.errors import UnsupportedModelError
from tgictl.runtime.tensor_parallel import HeadSplit, even_split, head_split, head_splits


def test_smollm2_on_two_ranks_is_two_groups_and_one() -> None:
    # 9 query heads, 3 KV heads (groups of 3): the first rank takes 2 groups, the second 1.
    assert head_splits(9, 3, 2) == (HeadSplit(0, 6, 0, 2), HeadSplit(6, 3, 2, 1))
    assert head_splits(9, 3, 3) == (HeadSplit(0, 3, 0, 1), HeadSplit(3, 3, 1, 1), HeadSplit(6, 3, 2, 1))


def test_more_ranks_than_kv_heads_replicate_them() -> None:
    # 4 ranks over 3 KV heads: KV head 0 is held twice, its 3 query heads split 2 + 1.
    assert head_splits(9, 3, 4) == (HeadSplit(0, 2, 0, 1), HeadSplit(2, 1, 0, 1), HeadSplit(3, 3, 1, 1),
                                    HeadSplit(6, 3, 2, 1))


def test_impossible_splits_are_named() -> None:
    with pytest.raises(UnsupportedModelError, match="more than the model's 9 attention heads"):
        head_split(9, 3, 0, 10)
    with pytest.raises(UnsupportedModelError, match="must be a multiple of num_key_value_heads"):
        head_split(9, 2, 0, 1)


@given(st.integers(1, 8), st.integers(1, 6), st.integers(1, 16))
def test_every_query_head_is_held_once_and_reads_a_kv_head_its_rank_holds(kv: int, group: int, world: int) -> None:
    heads = kv * group
    if world > heads or (world > kv and -(-world // kv) > group):
        return  # refused, as the test above shows
    splits = head_splits(heads, kv, world)
    held = [q for s in splits for q in range(s.q_start, s.q_start + s.q_count)]
    assert held == list(range(heads))  # contiguous, in rank order, each once
    for s in splits:
        assert s.q_count >= 1
        for q in range(s.q_start, s.q_start + s.q_count):
            assert s.kv_start <= q // group < s.kv_start + s.kv_count
    sizes = [s.q_count for s in splits]
    assert max(sizes) - min(sizes) <= group  # as even as whole groups (or shares of one) allow


@given(st.integers(1, 1000), st.integers(1, 16))
def test_even_split_covers_everything_with_sizes_one_apart(size: int, parts: int) -> None:
    ranges = [even_split(size, i, parts) for i in range(parts)]
    assert ranges[0][0] == 0 and ranges[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    lengths = [stop - start for start, stop in ranges]
    assert max(lengths) - min(lengths) <= 1 and lengths == sorted(lengths, reverse=True)
