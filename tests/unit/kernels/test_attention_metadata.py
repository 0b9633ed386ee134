import pytest
import torch

from tgictl.errors import InvalidRequestError, UnsupportedModelError
from tgictl.kernels import build_attention_metadata, check_attention_inputs


def test_metadata_describes_a_mixed_batch() -> None:
    # seq 0: prefill after a prefix; seq 1: decode; seq 2: fresh prompt; seq 3: decode
    meta = build_attention_metadata(
        cache_lens=[3, 5, 0, 1],
        new_lens=[2, 1, 3, 1],
        block_tables=[[4, 2], [7, 1], [3], [6]],
        block_size=4,
        device="cpu",
    )
    assert meta.batch_size == 4
    assert meta.num_tokens == 7
    assert meta.max_context_len == 6
    assert meta.cu_seqlens_q.tolist() == [0, 2, 3, 6, 7]
    assert meta.cu_seqlens_k.tolist() == [0, 5, 11, 14, 16]
    assert meta.context_lens.tolist() == [5, 6, 3, 2]
    assert meta.position_ids.tolist() == [3, 4, 5, 0, 1, 2, 1]
    assert meta.new_token_slots.tolist() == [19, 8, 5, 12, 13, 14, 25]
    assert meta.block_tables.tolist() == [[4, 2], [7, 1], [3, 0], [6, 0]]
    assert meta.block_tables.dtype == torch.int64
    assert not meta.is_decode_only

    dec = meta.decode
    assert dec is not None
    assert dec.seq_indices.tolist() == [1, 3]
    assert dec.query_rows is not None and dec.query_rows.tolist() == [2, 6]
    assert dec.max_context_len == 6
    # seq 1: positions 0..5 in blocks 7, 1; seq 3: positions 0..1 in block 6, padded with its position 0
    assert dec.slots.tolist() == [28, 29, 30, 31, 4, 5] + [24, 25, 24, 24, 24, 24]
    assert dec.bias.shape == (2, 1, 1, 6)
    assert torch.isinf(dec.bias[1, 0, 0, 2:]).all() and dec.bias[1, 0, 0, :2].eq(0).all()
    assert dec.bias[0].eq(0).all()

    assert [p.seq_index for p in meta.prefill] == [0, 2]
    first, second = meta.prefill
    assert (first.query_start, first.query_end, first.cache_len) == (0, 2, 3)
    assert first.slots.tolist() == [16, 17, 18, 19, 8]
    assert first.mask is not None
    assert first.mask.tolist() == [[True] * 4 + [False], [True] * 5]
    assert (second.query_start, second.query_end) == (3, 6)
    assert second.slots.tolist() == [12, 13, 14]
    assert second.mask is None


def test_decode_only_rows_in_order_need_no_row_index() -> None:
    meta = build_attention_metadata([2, 9], [1, 1], [[1], [2, 3, 4]], 4, "cpu")
    assert meta.is_decode_only
    assert meta.prefill == ()
    assert meta.decode is not None and meta.decode.query_rows is None
    assert meta.decode.context_lens.tolist() == [3, 10]


def test_prefill_only_has_no_decode_plan() -> None:
    meta = build_attention_metadata([0], [5], [[1, 2]], 4, "cpu")
    assert meta.decode is None and len(meta.prefill) == 1


@pytest.mark.parametrize(
    ("cache_lens", "new_lens", "tables", "block_size", "fragment"),
    [
        ([0], [1, 1], [[1]], 4, "one entry per sequence"),
        ([], [], [], 4, "at least one sequence"),
        ([0], [0], [[1]], 4, "new_len >= 1"),
        ([-1], [2], [[1]], 4, "cache_len must be >= 0"),
        ([4], [1], [[1]], 4, "needs more than the 1 blocks of 4"),
        ([0], [2], [[-3]], 4, "block ids must be >= 0"),
        ([0], [2], [[1]], 0, "block_size must be >= 1"),
    ],
)
def test_invalid_layouts_raise(cache_lens, new_lens, tables, block_size, fragment) -> None:
    with pytest.raises(InvalidRequestError, match=fragment):
        build_attention_metadata(cache_lens, new_lens, tables, block_size, "cpu")


def test_check_attention_inputs_rejects_mismatches() -> None:
    meta = build_attention_metadata([0], [3], [[1]], 4, "cpu")
    cache = torch.zeros(2, 4, 2, 8)
    check_attention_inputs(torch.zeros(3, 4, 8), cache, cache, meta)
    with pytest.raises(InvalidRequestError, match="query has 2 rows"):
        check_attention_inputs(torch.zeros(2, 4, 8), cache, cache, meta)
    with pytest.raises(UnsupportedModelError, match="multiple of kv_heads"):
        check_attention_inputs(torch.zeros(3, 3, 8), cache, cache, meta)
    with pytest.raises(InvalidRequestError, match="head_dim"):
        check_attention_inputs(torch.zeros(3, 4, 4), cache, cache, meta)
    far = build_attention_metadata([0], [3], [[2]], 4, "cpu")
    with pytest.raises(InvalidRequestError, match="block id 2 is out of range for a cache of 2 blocks"):
        check_attention_inputs(torch.zeros(3, 4, 8), cache, cache, far)
    other_block = torch.zeros(2, 8, 2, 8)
    with pytest.raises(InvalidRequestError, match="block_size"):
        check_attention_inputs(torch.zeros(3, 4, 8), other_block, other_block, meta)
    assert meta.max_context_len == 3 and meta.max_block_id == 1


def test_positions_and_new_token_slots_follow_the_block_tables(base_spec, make_case) -> None:
    case = make_case(base_spec)
    bs = base_spec.block_size
    positions, slots = [], []
    for (cache_len, new_len), table in zip(base_spec.seqs, case.block_tables):
        for p in range(cache_len, cache_len + new_len):
            positions.append(p)
            slots.append(table[p // bs] * bs + p % bs)
    assert case.meta.position_ids.tolist() == positions
    assert case.meta.new_token_slots.tolist() == slots


def test_metadata_on_another_device_than_the_query_is_rejected() -> None:
    # "meta" tensors stand in for an accelerator: they have a device but no storage
    meta = build_attention_metadata([0], [3], [[1]], 4, "meta")
    assert meta.block_tables.device.type == "meta" and meta.decode is None
    cache = torch.zeros(2, 4, 2, 8)
    with pytest.raises(InvalidRequestError, match="metadata lives on meta but the query on cpu"):
        check_attention_inputs(torch.zeros(3, 4, 8), cache, cache, meta)
