"""Several decode steps per Decode (runtime/shard/decode_steps.py, proto/step_merge.py): a batch decoded k
steps per call reads as the same batch decoded one step per call: per request the same tokens, top tokens,
prompt logprobs and finish, for rows that finish inside a call, a prompt whose last chunk is computed inside
one, with and without look-ahead; a step count out of range is refused before anything changes."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from servicer_helpers import paged_request, serving

from tgictl.config import MAX_DECODE_STEPS
from tgictl.proto import convert
from tgictl.proto import generate_pb2 as pb
from tgictl.proto.messages import (
    Batch,
    BlockGrant,
    DecodeRequest,
    Generation,
    PrefillRequest,
    SamplingParams,
    StepResult,
)

GREEDY = SamplingParams()


def _batch() -> Batch:
    # Request 4's 45-token prompt: 8 tokens in the Prefill, then chunks within the warmup's 32-token budget,
    # so its first token (with its prompt logprobs) comes in a later step of the first Decode call.
    return Batch(1, (
        paged_request(1, 1, tuple(range(10, 30)), 8),
        paged_request(2, 4, (5, 6, 7, 8, 9), 12, GREEDY),
        paged_request(3, 7, tuple(range(100, 109)), 3),
        dataclasses.replace(paged_request(4, 10, tuple(range(200, 245)), 6, GREEDY),
                            chunk_len=8, prefill_logprobs=True, top_n_tokens=3),
    ))


async def _run(stub: Any, steps: int) -> tuple[dict[int, list[Generation]], int]:
    """Every generation per request, and how many Decode calls it took."""
    per_request: dict[int, list[Generation]] = {}

    def seen(result: StepResult) -> StepResult:
        for g in result.generations:
            per_request.setdefault(g.request_id, []).append(g)
        return result

    reply = await stub.Prefill(convert.prefill_request_to_pb(PrefillRequest(_batch())))
    step = seen(convert.prefill_response_from_pb(reply))
    calls = 0
    while step.batch is not None:
        reply = await stub.Decode(convert.decode_request_to_pb(DecodeRequest((step.batch,), steps)))
        step = seen(convert.decode_response_from_pb(reply))
        calls += 1
    return per_request, calls


def _flat(generations: list[Generation]) -> dict[str, Any]:
    """One request's stream as the router reads it: tokens in order, and how it ended."""
    ends = [g.generated_text for g in generations if g.generated_text is not None]
    prompts = [g.prefill_tokens for g in generations if g.prefill_tokens is not None]
    return {
        "ids": [i for g in generations for i in g.tokens.ids],
        "logprobs": [lp for g in generations for lp in g.tokens.logprobs],
        "top": [t.ids for g in generations for t in g.top_tokens],
        "prompt": [p.ids for p in prompts],
        "prompt_logprobs": [lp for p in prompts for lp in p.logprobs],
        "ends": ends,
    }


@pytest.mark.parametrize("lookahead", [True, False])
def test_steps_per_call_change_nothing_but_the_number_of_calls(
    tiny_model_dir: Path, tmp_path: Path, lookahead: bool
) -> None:
    async def body(steps: int) -> tuple[dict[int, list[Generation]], int]:
        async with serving(tiny_model_dir, tmp_path / f"s{steps}", [], lookahead=lookahead) as (stub, _):
            return await _run(stub, steps)

    one, one_calls = asyncio.run(body(1))
    four, four_calls = asyncio.run(body(4))
    assert sorted(four) == sorted(one) == [1, 2, 3, 4]
    for rid in one:
        a, b = _flat(one[rid]), _flat(four[rid])
        assert b["ids"] == a["ids"] and b["top"] == a["top"] and b["prompt"] == a["prompt"] and b["ends"] == a["ends"]
        assert b["logprobs"] == pytest.approx(a["logprobs"], abs=1e-5)
        assert b["prompt_logprobs"] == pytest.approx(a["prompt_logprobs"], nan_ok=True, abs=1e-5)
        assert len(b["ends"]) == 1 and b["ends"][0].generated_tokens == len(b["ids"])
        # at most one generation per request per call, and each call's tokens stay within its steps
        assert all(1 <= len(g.tokens.ids) <= 4 for g in four[rid])
    assert len(_flat(one[4])["prompt"]) == 1 and len(_flat(one[4])["top"]) == 6
    # request 2 decodes longest (12 new: 1 in Prefill, 11 in Decodes)
    assert one_calls == 11 and four_calls == 3
    # request 3 (3 new) finished inside the first 4-step call
    assert len(four[3]) == 2 and four[3][1].tokens.ids == tuple(_flat(one[3])["ids"][1:])
    # request 4 emitted nothing in the Prefill; its first call's generation began in that call's second step
    assert len(one[4]) == 6 and one[4][0].prefill_tokens is not None
    assert four[4][0].prefill_tokens is not None and len(four[4][0].tokens.ids) == 3


def test_a_step_count_out_of_range_is_refused_and_changes_nothing(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def body() -> None:
        async with serving(tiny_model_dir, tmp_path / "s", []) as (stub, _):
            reply = await stub.Prefill(convert.prefill_request_to_pb(
                PrefillRequest(Batch(1, (paged_request(1, 1, (3, 4, 5), 4, GREEDY),)))))
            cached = convert.prefill_response_from_pb(reply).batch
            request = convert.decode_request_to_pb(DecodeRequest((cached,)))
            request.steps = MAX_DECODE_STEPS + 1
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Decode(request)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"within 1..{MAX_DECODE_STEPS}" in refused.value.details()
            # The batch is still there, one step from where it was: the remaining 3 tokens in one call.
            reply = await stub.Decode(convert.decode_request_to_pb(DecodeRequest((cached,), MAX_DECODE_STEPS)))
            result = convert.decode_response_from_pb(reply)
            assert result.batch is None and len(result.generations[0].tokens.ids) == 3
            assert await stub.Health(pb.HealthRequest()) == pb.HealthResponse()

    asyncio.run(body())


@pytest.mark.parametrize("lookahead", [True, False])
def test_a_call_stops_where_a_rows_blocks_end_and_goes_on_once_granted(
    tiny_model_dir: Path, tmp_path: Path, lookahead: bool
) -> None:
    """Row 1 holds one block (its 14-token prompt and 2 more positions), row 2 finishes after 2 tokens: a
    Decode of 8 steps stops after the steps row 1's block holds (the look-ahead step does not run past it
    either); the next Decode grants row 1 a block. The first Decode grants row 2 a block, which with
    look-ahead it no longer needs: it finished in the step run ahead, which the router has not seen (the
    grant is ignored). The tokens are those of the same requests holding all their blocks."""
    prompt = tuple(range(30, 44))

    def batch(short: bool) -> Batch:
        first = paged_request(1, 1, prompt, 10, GREEDY)
        return Batch(1, (dataclasses.replace(first, blocks=(1,)) if short else first,
                         paged_request(2, 5, (5, 6, 7), 2, GREEDY)))

    async def run(short: bool) -> tuple[list[int], list[int]]:
        async with serving(tiny_model_dir, tmp_path / f"s{short}", [], lookahead=lookahead) as (stub, _):
            step = convert.prefill_response_from_pb(await stub.Prefill(convert.prefill_request_to_pb(
                PrefillRequest(batch(short)))))
            ids = [i for g in step.generations if g.request_id == 1 for i in g.tokens.ids]
            per_call = []
            grants: tuple[BlockGrant, ...] = (BlockGrant(2, (21,)),)
            while step.batch is not None:
                step = convert.decode_response_from_pb(await stub.Decode(convert.decode_request_to_pb(
                    DecodeRequest((step.batch,), 8, grants))))
                got = [i for g in step.generations if g.request_id == 1 for i in g.tokens.ids]
                ids += got
                per_call.append(len(got))
                grants = (BlockGrant(1, (20,)),) if short and len(per_call) == 1 else ()
            return ids, per_call

    short_ids, short_calls = asyncio.run(run(short=True))
    full_ids, full_calls = asyncio.run(run(short=False))
    assert short_ids == full_ids and len(full_ids) == 10
    assert short_calls == [2, 7] and full_calls == [8, 1]
