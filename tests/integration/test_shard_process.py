"""One real `tgictl shard` process on the tiny llama, driven over gRPC as the router drives it.

Outputs are compared with the shard runtime library run in this process on the same weights
(float32, one thread each side, sampling parameters exactly representable in float32), so every
token id and logprob must match exactly. One shard serves the whole module.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from shard_procs import (
    Blocks,
    Oracle,
    ShardConn,
    ShardProc,
    health_ok,
    plain,
    start_shard,
    warmup_batch,
)

from tgictl.proto import convert
from tgictl.proto import generate_pb2 as pb
from tgictl.proto.messages import (
    Batch,
    CachedBatch,
    PrefillRequest,
    SamplingParams,
    StepResult,
    WarmupRequest,
    WarmupResult,
)

GREEDY = SamplingParams()
WARM = SamplingParams(temperature=0.5, seed=7)
WARPED = SamplingParams(temperature=0.5, top_k=20, top_p=0.75, repetition_penalty=1.25, frequency_penalty=0.5, seed=3)
WARMUP = WarmupRequest(batch=warmup_batch(64), max_prefill_tokens=64)


@dataclass
class Module:
    proc: ShardProc
    conn: ShardConn
    oracle: Oracle
    warmup: WarmupResult
    uds_base: Path


@pytest.fixture(scope="module")
def shard(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Module]:
    base_dir = tmp_path_factory.mktemp("shard")
    # The oracle steps each batch as the router sees it; a look-ahead step (lookahead.py) computes a batch before
    # its filter, whose float rounding differs from the filtered batch's (test_lookahead.py covers that path).
    proc = start_shard(tiny_model_dir, base_dir / "s", base_dir / "shard.log", extra_env={"TGICTL_LOOKAHEAD": "0"})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the shard runs one thread too: identical float reductions
    conn = None
    try:
        oracle = Oracle(tiny_model_dir)
        proc.wait_ready()
        conn = ShardConn(proc.socket_path)
        # The router's start-up order (TGI's backends/v3/src/client/sharded_client.rs): clear, info, warmup.
        conn.call("ClearCache", pb.ClearCacheRequest())
        warmup = convert.warmup_response_from_pb(conn.call("Warmup", convert.warmup_request_to_pb(WARMUP)))
        assert oracle.runtime.warmup(WARMUP) == warmup
        yield Module(proc, conn, oracle, warmup, base_dir / "s")
        assert proc.proc.poll() is None, proc.log()
    finally:
        torch.set_num_threads(threads)
        if conn is not None:
            conn.close()
        proc.kill()


def _prefill(conn: ShardConn, batch: Batch, cached: CachedBatch | None = None) -> tuple[StepResult, pb.PrefillResponse]:
    reply = conn.call("Prefill", convert.prefill_request_to_pb(PrefillRequest(batch, cached)))
    return convert.prefill_response_from_pb(reply), reply


def _decode(conn: ShardConn, *batches: CachedBatch) -> tuple[StepResult, pb.DecodeResponse]:
    reply = conn.call("Decode", pb.DecodeRequest(batches=[convert.cached_batch_to_pb(b) for b in batches]))
    return convert.decode_response_from_pb(reply), reply


def _same(remote: StepResult, local: StepResult) -> None:
    assert plain(remote.generations) == plain(local.generations)
    assert remote.batch == local.batch


def test_info_health_discovery_and_warmup_figures(shard: Module) -> None:
    info = convert.info_from_pb(shard.conn.call("Info", pb.InfoRequest()))
    assert info == shard.oracle.runtime.info()
    assert (info.dtype, info.device_type, info.block_size, info.world_size) == ("float32", "cpu", 16, 1)
    assert (info.model_type, info.vocab_size, info.num_layers, info.eos_token_ids) == ("llama", 512, 2, (2,))
    assert info.support_chunking and info.use_prefix_caching and not info.requires_padding
    health_ok(shard.conn)
    urls = shard.conn.call("ServiceDiscovery", pb.ServiceDiscoveryRequest()).urls
    assert list(urls) == [f"unix://{shard.uds_base}-0"]
    # 8 MiB of KV at 8 KiB per block (2 layers x 16 tokens x 2 KV heads x 16 dims x K,V x 4 bytes).
    expected = WarmupResult(max_supported_total_tokens=1024 * 16, max_input_tokens=2047, max_total_tokens=2048)
    assert shard.warmup == expected


def test_prefill_decode_filter_concatenate_clear_match_the_runtime(shard: Module) -> None:
    conn, oracle, blocks = shard.conn, shard.oracle, Blocks()
    first = Batch(
        id=1,
        requests=(
            blocks.request(1, tuple(range(10, 30)), 8, WARM, top_n_tokens=3, prefill_logprobs=True),
            blocks.request(2, (5, 6, 7, 8, 9), 12, GREEDY),
            blocks.request(3, tuple(range(100, 109)), 3, WARPED),
        ),
    )
    remote, reply = _prefill(conn, first)
    _same(remote, oracle.prefill(first))
    assert remote.generations[0].prefill_tokens is not None and len(remote.generations[0].top_tokens) == 1
    assert reply.forward_ns > 0 and reply.total_ns >= reply.forward_ns + reply.decode_ns
    assert not reply.HasField("concat_ns")
    batch = remote.batch
    for _ in range(2):
        remote, _ = _decode(conn, batch)
        _same(remote, oracle.decode([1]))
        batch = remote.batch
    # Request 3 reached max_new_tokens. As the router does, finished requests (and request 1, as if a
    # stop string had matched) leave the batch before the next step.
    assert [g.request_id for g in remote.generations if g.generated_text is not None] == [3]
    filtered = convert.filter_batch_response_from_pb(
        conn.call("FilterBatch", pb.FilterBatchRequest(batch_id=1, request_ids=[2]))
    )
    assert filtered == oracle.filter(1, (2,)) and filtered.request_ids == (2,)
    remote, _ = _decode(conn, filtered)
    _same(remote, oracle.decode([1]))

    # Chunking: a long prompt prefilled 16 tokens at a time, in one forward with the running batch.
    second = Batch(id=2, requests=(blocks.request(4, tuple(range(200, 240)), 6, WARM, chunk_len=16),))
    remote, reply = _prefill(conn, second, remote.batch)
    _same(remote, oracle.prefill(second, cached_id=1))
    assert reply.HasField("concat_ns")
    assert remote.batch is not None and remote.batch.id == 2 and remote.batch.request_ids == (2, 4)
    assert [g.request_id for g in remote.generations] == [2]  # request 4 is still prefilling
    assert remote.batch.current_tokens == 1 + 24  # the rest of the prompt fits the 64-token budget
    remote, _ = _decode(conn, remote.batch)
    _same(remote, oracle.decode([2]))
    running = remote.batch

    # Two cached batches merged into one Decode forward, cached under the first id.
    third = Batch(id=3, requests=(blocks.request(5, (40, 41, 42, 43, 44, 45), 6, WARPED),))
    remote, _ = _prefill(conn, third)
    _same(remote, oracle.prefill(third))
    remote, reply = _decode(conn, running, remote.batch)
    _same(remote, oracle.decode([2, 3]))
    assert reply.HasField("concat_ns")
    assert remote.batch is not None and remote.batch.id == 2 and remote.batch.request_ids == (2, 4, 5)

    conn.call("ClearCache", pb.ClearCacheRequest(id=2))
    assert conn.status("Decode", pb.DecodeRequest(batches=[convert.cached_batch_to_pb(remote.batch)]))[0] == (
        grpc.StatusCode.NOT_FOUND
    )
    fourth = Batch(id=4, requests=(blocks.request(6, (7, 8, 9), 4, GREEDY),))
    remote, _ = _prefill(conn, fourth)
    conn.call("ClearCache", pb.ClearCacheRequest())  # no id: everything goes
    assert conn.status("Decode", pb.DecodeRequest(batches=[convert.cached_batch_to_pb(remote.batch)]))[0] == (
        grpc.StatusCode.NOT_FOUND
    )
    health_ok(conn)


def _request(**changes: Any) -> Any:
    request = Blocks().request(7, (3, 4, 5), 4, GREEDY)
    return replace(request, **changes)


def _prefill_pb(*requests: Any, batch_id: int = 90) -> pb.PrefillRequest:
    return convert.prefill_request_to_pb(PrefillRequest(Batch(id=batch_id, requests=tuple(requests))))


def _cached(batch_id: int) -> pb.CachedBatch:
    return pb.CachedBatch(id=batch_id, request_ids=[7], size=1)


_BAD_BLOCK = _request(blocks=(1024,))
_NO_PARAMETERS = pb.Batch(id=90, size=1, requests=[pb.Request(id=7)])
# case: (method, request, status, part of the message)
ERRORS: dict[str, tuple[str, Any, str, str]] = {
    "decode unknown batch": ("Decode", pb.DecodeRequest(batches=[_cached(999)]), "NOT_FOUND", "Batch ID 999 not found"),
    "decode no batch": ("Decode", pb.DecodeRequest(), "INVALID_ARGUMENT", "at least one cached batch"),
    "filter unknown batch": ("FilterBatch", pb.FilterBatchRequest(batch_id=999, request_ids=[7]), "NOT_FOUND", "999"),
    "clear unknown batch": ("ClearCache", pb.ClearCacheRequest(id=999), "NOT_FOUND", "Batch ID 999"),
    "prefill unknown cached batch": (
        "Prefill",
        pb.PrefillRequest(batch=_prefill_pb(_request()).batch, cached_batch=_cached(999)),
        "NOT_FOUND",
        "Batch ID 999",
    ),
    "block out of range": ("Prefill", _prefill_pb(_BAD_BLOCK), "INVALID_ARGUMENT", "block ids must be in 0 .. 1023"),
    "blocks short of the prompt": (
        "Prefill", _prefill_pb(_request(blocks=())), "INVALID_ARGUMENT", "0 blocks of 16 cannot hold its 3 prompt tokens",
    ),

    "token id outside the vocabulary": (
        "Prefill",
        _prefill_pb(_request(input_ids=(3, 512, 5))),
        "INVALID_ARGUMENT",
        "token ids must be in 0 .. 511",
    ),
    "empty prompt": ("Prefill", _prefill_pb(_request(input_ids=())), "INVALID_ARGUMENT", "input_ids must not be empty"),
    "size mismatch": (
        "Prefill",
        pb.PrefillRequest(batch=pb.Batch(id=90, size=3)),
        "INVALID_ARGUMENT",
        "size is 3 but it lists 0",
    ),
    "missing parameters": (
        "Prefill",
        pb.PrefillRequest(batch=_NO_PARAMETERS),
        "INVALID_ARGUMENT",
        "`parameters` is required",
    ),
    "warmup without a prefill budget": (
        "Warmup",
        pb.WarmupRequest(batch=convert.batch_to_pb(warmup_batch(8)), max_prefill_tokens=0),
        "INVALID_ARGUMENT",
        "max_prefill_tokens must be >= 1, got 0",
    ),
    "duplicate request ids": (
        "Prefill",
        _prefill_pb(_request(), _request()),
        "INVALID_ARGUMENT",
        "request ids must be unique",
    ),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_invalid_request_is_refused_and_the_shard_keeps_serving(shard: Module, case: str) -> None:
    method, request, code, fragment = ERRORS[case]
    status, details = shard.conn.status(method, request)
    assert status == grpc.StatusCode[code]
    assert fragment in details
    health_ok(shard.conn)
    assert shard.proc.proc.poll() is None


def test_filter_errors_leave_the_batch_intact(shard: Module) -> None:
    conn = shard.conn
    request = Blocks().request(8, (3, 4, 5, 6), 4, GREEDY)
    remote, _ = _prefill(conn, Batch(id=60, requests=(request,)))
    assert conn.status("FilterBatch", pb.FilterBatchRequest(batch_id=60)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "batch 60: filter needs at least one request id to keep",
    )
    code, details = conn.status("FilterBatch", pb.FilterBatchRequest(batch_id=60, request_ids=[8, 77]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "[77]" in details
    # A cached id may not be reused by a new batch, which would silently drop the cached one.
    assert conn.status("Prefill", _prefill_pb(_request(), batch_id=60))[0] == grpc.StatusCode.INVALID_ARGUMENT
    # Decode is all or nothing: an unknown id in the list consumes nothing.
    decode = pb.DecodeRequest(batches=[convert.cached_batch_to_pb(remote.batch), _cached(999)])
    assert conn.status("Decode", decode)[0] == grpc.StatusCode.NOT_FOUND
    after, _ = _decode(conn, remote.batch)
    assert [g.request_id for g in after.generations] == [8]
    assert after.batch is not None and after.batch.request_ids == (8,)
    conn.call("ClearCache", pb.ClearCacheRequest(id=60))
    health_ok(conn)
