"""ShardBatch: validation of the router's placement, the CachedBatch figures, per-step input packing."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from shard_helpers import BlockPool, make_request

from tgictl.errors import InvalidRequestError
from tgictl.proto.messages import Batch, BlockGrant, Request, SamplingParams
from tgictl.runtime.shard.batch import ShardBatch, apply_grants

VOCAB = 512
CPU = torch.device("cpu")


def build(requests: list[Request], num_blocks: int = 64, batch_id: int = 3) -> ShardBatch:
    return ShardBatch.from_batch(
        Batch(id=batch_id, requests=tuple(requests)), block_size=16, num_blocks=num_blocks, vocab_size=VOCAB, device=CPU
    )


def test_mixed_step_inputs_are_packed_in_batch_order() -> None:
    pool = BlockPool()
    decoding = make_request(pool, 10, list(range(1, 6)), max_new_tokens=4)  # blocks 1
    prefilling = make_request(pool, 11, list(range(20, 40)), max_new_tokens=2, prefill_logprobs=True)  # 2, 3
    chunked = make_request(pool, 12, list(range(50, 90)), max_new_tokens=3, chunk_len=7)  # 4, 5, 6
    batch = build([decoding, prefilling, chunked])
    # As if row 0 had finished its prompt and generated token 99, and row 2 had done one chunk.
    row0 = batch.rows[0]
    row0.cache_len, row0.chunk_len, row0.generated = 5, 1, 1
    row0.all_ids.append(99)
    batch.rows[2].cache_len, batch.rows[2].chunk_len = 7, 9

    inputs = batch.step_inputs(CPU)
    assert inputs.input_ids.tolist() == [99] + list(range(20, 40)) + list(range(57, 66))
    assert inputs.positions.tolist() == [5] + list(range(20)) + list(range(7, 16))
    # slot = block * 16 + offset: row 0 in block 1, row 1 in blocks 2-3, row 2 in blocks 4-6.
    assert inputs.slots.tolist() == [21] + list(range(32, 52)) + list(range(71, 80))
    # Row 1 wants prompt logprobs: logits at all its 20 positions; the others at their last token.
    assert inputs.logit_indices.tolist() == [0] + list(range(1, 21)) + [29]
    assert inputs.sample_rows is not None and inputs.sample_rows.tolist() == [0, 20, 21]
    assert inputs.prompt_spans == [(1, 1, 20)]
    assert inputs.cache_lens == [5, 0, 7] and inputs.new_lens == [1, 20, 9]
    assert inputs.block_tables == [[1], [2, 3], [4, 5, 6]]


def test_slots_follow_the_blocks_granted_as_a_row_grows() -> None:
    """A row admitted with its prompt's block only gets more with later calls (BlockGrant), anywhere in the
    cache: its next positions write into them, and a step that would write past them is refused."""
    pool = BlockPool()
    request = make_request(pool, 1, list(range(1, 15)), max_new_tokens=8, blocks=(7,))  # 14 of 16 positions
    batch = build([request])
    row = batch.rows[0]
    row.cache_len, row.chunk_len, row.generated = 14, 1, 3
    row.all_ids += [90, 91, 92]  # 17 tokens: the next step writes positions 14 .. 16
    assert not batch.fits_next_step()
    with pytest.raises(InvalidRequestError, match="request 1: its next step writes 17 positions but its 1 blocks hold 16"):
        batch.check_fits_next_step()
    apply_grants([batch], [BlockGrant(1, (40,))], num_blocks=64)
    assert batch.fits_next_step() and row.blocks == [7, 40] and batch.to_cached().max_tokens == 32
    row.chunk_len = 3
    inputs = batch.step_inputs(CPU)
    assert inputs.slots.tolist() == [7 * 16 + 14, 7 * 16 + 15, 40 * 16]  # position 16 is block 40's first slot
    assert inputs.block_tables == [[7, 40]]


def test_grants_are_checked_before_any_row_changes() -> None:
    pool = BlockPool()
    batch = build([make_request(pool, 1, [1, 2], blocks=(1,)), make_request(pool, 2, [3, 4], blocks=(2,))])
    with pytest.raises(InvalidRequestError, match="request 9, which is not in the batch"):
        apply_grants([batch], [BlockGrant(1, (5,)), BlockGrant(9, (6,))], num_blocks=64)
    with pytest.raises(InvalidRequestError, match="the grant of request 2: block ids must be in 0 .. 63"):
        apply_grants([batch], [BlockGrant(1, (5,)), BlockGrant(2, (64,))], num_blocks=64)
    assert [row.blocks for row in batch.rows] == [[1], [2]]  # neither call changed anything
    apply_grants([batch], [BlockGrant(2, (6, 8)), BlockGrant(9, (7,))], num_blocks=64, finished={9})
    assert [row.blocks for row in batch.rows] == [[1], [2, 6, 8]]  # a finished request's grant is ignored


def test_decode_only_step_samples_every_logit_row() -> None:
    pool = BlockPool()
    batch = build([make_request(pool, rid, [rid + 1, rid + 2]) for rid in range(3)])
    inputs = batch.step_inputs(CPU)
    assert inputs.logit_indices.tolist() == [1, 3, 5]
    assert inputs.sample_rows is None and inputs.prompt_spans == []


def test_cached_batch_figures() -> None:
    pool = BlockPool()
    requests = [
        make_request(pool, 1, list(range(1, 31)), max_new_tokens=10),  # 39 slots -> 3 blocks
        make_request(pool, 2, list(range(1, 21)), max_new_tokens=4, chunk_len=8),  # 23 slots -> 2 blocks
    ]
    cached = build(requests).to_cached()
    assert cached.id == 3 and cached.request_ids == (1, 2)
    assert cached.max_tokens == 5 * 16
    assert cached.current_tokens == 30 + 8


def test_filter_keeps_batch_order_and_concatenate_keeps_the_first_id() -> None:
    pool = BlockPool()
    batch = build([make_request(pool, rid, [rid + 1] * 3) for rid in range(4)])
    kept = batch.filter([3, 1])
    assert kept.request_ids == (1, 3) and kept.id == 3
    assert kept.filter([1, 3]) is kept  # unchanged membership: the same batch
    other = build([make_request(pool, 7, [5, 6], sampling=SamplingParams(repetition_penalty=1.2))], batch_id=9)
    merged = ShardBatch.concatenate([kept, other])
    assert merged.request_ids == (1, 3, 7) and merged.id == 3
    assert merged.history.size == 3 and merged.history.counts is not None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(input_ids=()), "input_ids must not be empty"),
        (dict(cache_len=5), "cache_len must be in 0 .. 4"),
        (dict(chunk_len=0), "chunk_len must be in 1 .. 5"),
        (dict(input_ids=(1, 2, 3, 4, VOCAB)), "token ids must be in 0 .. 511"),
        (dict(blocks=()), "0 blocks of 16 cannot hold its 5 prompt tokens"),
        (dict(blocks=(64,)), "block ids must be in 0 .. 63"),
    ],
)
def test_invalid_requests_are_refused(change: dict[str, object], message: str) -> None:
    request = make_request(BlockPool(), 1, [1, 2, 3, 4, 5], max_new_tokens=4)  # block 1: positions 0 .. 15
    with pytest.raises(InvalidRequestError, match=message):
        build([dataclasses.replace(request, **change)])


def test_duplicate_request_ids_are_refused() -> None:
    pool = BlockPool()
    with pytest.raises(InvalidRequestError, match="unique"):
        build([make_request(pool, 1, [1, 2]), make_request(pool, 1, [3, 4])])


def _adapter_batch(pool: BlockPool, first_adapter: int, third_adapter: int, first_new_tokens: int = 2
                   ) -> tuple[list[Request], ShardBatch]:
    """Three rows: [5, 6, 7] on `first_adapter`, [8, 9] on the base model, [10] on `third_adapter`."""
    requests = [
        dataclasses.replace(make_request(pool, 1, [5, 6, 7], max_new_tokens=first_new_tokens),
                            adapter_index=first_adapter),
        make_request(pool, 2, [8, 9], max_new_tokens=2),
        dataclasses.replace(make_request(pool, 3, [10], max_new_tokens=2), adapter_index=third_adapter),
    ]
    batch = ShardBatch.from_batch(Batch(id=1, requests=tuple(requests)), block_size=16, num_blocks=64,
                                  vocab_size=VOCAB, device=CPU, num_adapters=2)
    return requests, batch


def test_adapter_rows_are_grouped_per_token_and_out_of_range_indices_refused() -> None:
    pool = BlockPool()
    requests, batch = _adapter_batch(pool, first_adapter=2, third_adapter=1)
    inputs = batch.step_inputs(CPU, num_adapters=2)
    assert inputs.adapters is not None
    assert inputs.adapters.tokens.slots == (0, 1) and inputs.adapters.tokens.tokens == ((5,), (0, 1, 2))
    assert inputs.adapters.logit_rows is not None and inputs.adapters.logit_rows.tokens == ((2,), (0,))
    assert build([make_request(pool, 4, [1, 2])]).step_inputs(CPU, num_adapters=2).adapters is None
    with pytest.raises(InvalidRequestError, match="adapter_index must be in 0 .. 2"):
        ShardBatch.from_batch(Batch(id=2, requests=(dataclasses.replace(requests[1], adapter_index=3),)),
                              block_size=16, num_blocks=64, vocab_size=VOCAB, device=CPU, num_adapters=2)


def test_a_row_verifying_drafts_gives_every_draft_token_and_logit_row_its_adapter() -> None:
    pool = BlockPool()
    _, batch = _adapter_batch(pool, first_adapter=1, third_adapter=2, first_new_tokens=8)
    drafting = batch.rows[0]  # decoding: generated 99, then verifies three drafts in one forward
    drafting.cache_len, drafting.generated, drafting.draft = 3, 1, [5, 6, 7]
    drafting.all_ids.append(99)
    drafting.chunk_len = 1 + len(drafting.draft)
    inputs = batch.step_inputs(CPU, num_adapters=2)
    assert inputs.input_ids.tolist() == [99, 5, 6, 7, 8, 9, 10]
    assert inputs.logit_indices.tolist() == [0, 1, 2, 3, 5, 6]
    assert inputs.adapters is not None
    assert inputs.adapters.tokens.slots == (0, 1) and inputs.adapters.tokens.tokens == ((0, 1, 2, 3), (6,))
    assert inputs.adapters.logit_rows is not None and inputs.adapters.logit_rows.tokens == ((0, 1, 2, 3), (5,))
