"""Two `tgictl shard` processes as one tensor-parallel model (WORLD_SIZE=2 over gloo).

Every RPC goes to both ranks at once, as the router's ShardedClient sends it. Both ranks must answer
with the same CachedBatch, only rank 0 reports generations, and those carry the same tokens as a
single shard (the runtime library in this process): logprobs may differ in the last bits because the
ranks sum partial products in another order. The last test kills rank 1: rank 0's next collective
fails, which must answer INTERNAL and end rank 0 with a non-zero exit (the launcher's cue).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import torch
from shard_procs import (
    Blocks,
    Oracle,
    ShardConn,
    ShardProc,
    health_ok,
    start_shard,
    warmup_batch,
)

from tgictl.proto import convert
from tgictl.runtime.launcher.plan import free_port
from tgictl.proto import generate_pb2 as pb
from tgictl.proto.messages import (
    Batch,
    PrefillRequest,
    SamplingParams,
    StepResult,
    WarmupRequest,
    WarmupResult,
)
from tgictl.runtime.router.shard_client import ShardedClient

WARMUP = WarmupRequest(batch=warmup_batch(64), max_prefill_tokens=64)


@dataclass
class Pair:
    procs: list[ShardProc]
    conn: ShardConn
    oracle: Oracle
    uds_base: Path


@pytest.fixture(scope="module")
def pair(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    base_dir = tmp_path_factory.mktemp("tp")
    port = free_port()
    procs = [
        start_shard(tiny_model_dir, base_dir / "s", base_dir / f"rank{r}.log", rank=r, world_size=2, master_port=port)
        for r in range(2)
    ]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    conn = None
    try:
        oracle = Oracle(tiny_model_dir)
        oracle.runtime.warmup(WARMUP)
        for proc in procs:
            proc.wait_ready()
        conn = ShardConn(*(proc.socket_path for proc in procs))
        yield Pair(procs, conn, oracle, base_dir / "s")
    finally:
        torch.set_num_threads(threads)
        if conn is not None:
            conn.close()
        for proc in procs:
            proc.kill()


def _tokens(result: StepResult) -> list[tuple[int, tuple[int, ...], object]]:
    return [(g.request_id, g.tokens.ids, g.generated_text) for g in result.generations]


def _logprobs(result: StepResult) -> list[float]:
    return [lp for g in result.generations for lp in g.tokens.logprobs]


def _check_step(replies: list[pb.PrefillResponse] | list[pb.DecodeResponse], local: StepResult) -> StepResult:
    decode = isinstance(replies[0], pb.DecodeResponse)
    from_pb = convert.decode_response_from_pb if decode else convert.prefill_response_from_pb
    rank0, rank1 = (from_pb(r) for r in replies)
    assert rank0.batch == rank1.batch == local.batch
    assert rank1.generations == ()  # only rank 0 reports (generate.proto)
    assert _tokens(rank0) == _tokens(local)
    assert _logprobs(rank0) == pytest.approx(_logprobs(local), abs=1e-4)
    return rank0


def test_info_discovery_and_warmup_agree(pair: Pair) -> None:
    infos = [convert.info_from_pb(r) for r in pair.conn.all("Info", pb.InfoRequest())]
    assert infos[0] == infos[1]
    assert (infos[0].world_size, infos[0].vocab_size) == (2, 512)
    urls = [f"unix://{pair.uds_base}-{r}" for r in range(2)]
    assert [list(r.urls) for r in pair.conn.all("ServiceDiscovery", pb.ServiceDiscoveryRequest())] == [urls, urls]
    pair.conn.all("ClearCache", pb.ClearCacheRequest())
    replies = pair.conn.all("Warmup", convert.warmup_request_to_pb(WARMUP))
    # Each rank holds one of the two KV heads: 4 KiB per block, so 8 MiB holds 2048 blocks.
    expected = WarmupResult(max_supported_total_tokens=2048 * 16, max_input_tokens=2047, max_total_tokens=2048)
    assert [convert.warmup_response_from_pb(r) for r in replies] == [expected, expected]
    for rank in range(2):
        health_ok(pair.conn, rank)


def test_ranks_answer_identically_and_match_one_shard(pair: Pair) -> None:
    conn, oracle, blocks = pair.conn, pair.oracle, Blocks()
    sampled = SamplingParams(temperature=0.5, top_k=20, repetition_penalty=1.25, seed=11)
    first = Batch(
        id=1,
        requests=(
            blocks.request(1, tuple(range(10, 30)), 6, sampled),
            blocks.request(2, (5, 6, 7, 8, 9), 8, SamplingParams()),
        ),
    )
    step = _check_step(conn.all("Prefill", convert.prefill_request_to_pb(PrefillRequest(first))), oracle.prefill(first))
    for _ in range(2):
        replies = conn.all("Decode", pb.DecodeRequest(batches=[convert.cached_batch_to_pb(step.batch)]))
        step = _check_step(replies, oracle.decode([1]))
    kept = conn.all("FilterBatch", pb.FilterBatchRequest(batch_id=1, request_ids=[2]))
    assert [convert.filter_batch_response_from_pb(r) for r in kept] == [oracle.filter(1, (2,))] * 2
    second = Batch(id=2, requests=(blocks.request(3, tuple(range(60, 90)), 4, sampled, chunk_len=12),))
    prefill = convert.prefill_request_to_pb(PrefillRequest(second))
    other = _check_step(conn.all("Prefill", prefill), oracle.prefill(second))
    merged = pb.DecodeRequest(batches=[convert.cached_batch_to_pb(b) for b in (step.batch, other.batch)])
    merged_step = _check_step(conn.all("Decode", merged), oracle.decode([1, 2]))
    assert merged_step.batch is not None and merged_step.batch.request_ids == (2, 3)
    conn.all("ClearCache", pb.ClearCacheRequest())


def test_the_router_client_discovers_both_ranks_and_merges_their_answers(pair: Pair) -> None:
    """The router's own ShardedClient, given only rank 0's socket, as `tgictl router` would be."""
    blocks = Blocks()
    batch = Batch(id=7, requests=(blocks.request(20, (11, 12, 13, 14), 3, SamplingParams(temperature=0.5, seed=5)),))

    async def drive() -> tuple[tuple[str, ...], list[StepResult]]:
        client = await ShardedClient.connect(str(pair.procs[0].socket_path))
        try:
            await client.health()
            await client.clear_cache(None)
            steps = [await client.prefill(batch, None)]
            while steps[-1].batch is not None:
                steps.append(await client.decode([steps[-1].batch]))
            return client.urls, steps
        finally:
            await client.close()

    urls, steps = pair.conn.run(drive())
    assert urls == tuple(f"unix://{pair.uds_base}-{r}" for r in range(2))
    local = [pair.oracle.prefill(batch)]
    while local[-1].batch is not None:
        local.append(pair.oracle.decode([7]))
    assert [_tokens(s) for s in steps] == [_tokens(s) for s in local]
    assert len(steps) == 3  # max_new_tokens 3: the last step finishes the request and returns no batch


def test_a_failed_collective_fails_the_step_and_ends_the_rank(pair: Pair) -> None:
    """Runs last: it takes the pair down."""
    conn = pair.conn
    request = Blocks().request(9, (4, 5, 6), 4, SamplingParams())
    step = convert.prefill_response_from_pb(
        conn.all("Prefill", convert.prefill_request_to_pb(PrefillRequest(Batch(id=5, requests=(request,)))))[0]
    )
    pair.procs[1].signal(signal.SIGKILL)
    assert pair.procs[1].wait_exit() == -signal.SIGKILL
    # Rank 0 may have run the batch's next step ahead (look-ahead decoding) before the kill: the first Decode
    # then answers that kept step, and the one after it meets the dead peer. INTERNAL when a Decode's own step
    # meets it; UNAVAILABLE ("stopping after an error: ...") when a step run ahead met it first and the rank
    # is already stopping. Either way the answer names the failed collective.
    batch = step.batch
    for _ in range(2):
        try:
            answer = conn.call("Decode", pb.DecodeRequest(batches=[convert.cached_batch_to_pb(batch)]), rank=0)
        except grpc.aio.AioRpcError as err:
            code, details = err.code(), err.details() or ""
            break
        batch = convert.decode_response_from_pb(answer).batch
        assert batch is not None  # max_new_tokens 4: the request is still running
    else:
        raise AssertionError("two Decodes succeeded with the peer dead")
    assert code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE)
    # Shared memory: its pid is gone. Which collective meets it depends on how far the step had got at the kill
    # (a layer's all_reduce, or the logits' all_gather once the layers were through).
    assert re.search(r"a tensor-parallel peer died during (all_reduce|all_gather)", details), details
    assert pair.procs[0].wait_exit() == 1
    assert not pair.procs[0].socket_path.exists()
    assert "stopped after an unrecoverable error" in pair.procs[0].log()
