"""Warmup: KV sizing arithmetic, default limits, and the whole probe-size-reallocate path on a tiny model."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from shard_helpers import BlockPool, make_request

from tgictl.errors import ConfigError, DeviceError, InvalidRequestError
from tgictl.proto.messages import (
    Batch,
    Request,
    SamplingParams,
    StoppingParams,
    WarmupRequest,
)
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.runtime import ShardRuntime
from tgictl.runtime.shard.warmup import (
    GIB,
    KVMemorySettings,
    assign_probe_blocks,
    cpu_kv_budget,
    cuda_kv_budget,
    default_limits,
)

# Tiny llama: 2 layers, 2 KV heads of 16 dims; block 16: 16 x 2 x 16 x 2 layers x 2 (K, V) x 4 bytes.
TINY_BYTES_PER_BLOCK_F32 = 16 * 2 * 16 * 2 * 2 * 4


def probe_batch(prompt_lens: list[int]) -> Batch:
    """The router's warmup batch: every request id 0, no blocks (the shard places them), sampling on."""
    sampling = SamplingParams(temperature=0.9, top_k=10, top_p=0.9, typical_p=0.9, repetition_penalty=1.2, frequency_penalty=0.1)
    requests = tuple(
        Request(
            id=0,
            input_ids=tuple((7 * i + n) % 500 + 3 for i in range(n)),
            sampling=sampling,
            stopping=StoppingParams(max_new_tokens=100, ignore_eos=True),
            prefill_logprobs=True,
            top_n_tokens=20,
        )
        for n in prompt_lens
    )
    return Batch(id=0, requests=requests)


def test_cpu_budget_defaults_to_a_quarter_of_available_ram_at_most_4_gib() -> None:
    assert cpu_kv_budget(8 * GIB, None) == 2 * GIB
    assert cpu_kv_budget(40 * GIB, None) == 4 * GIB
    assert cpu_kv_budget(8 * GIB, 5 * GIB) == 5 * GIB
    with pytest.raises(ConfigError, match="kv_cache_memory .* exceeds the available RAM"):
        cpu_kv_budget(8 * GIB, 9 * GIB)


def test_cuda_budget_leaves_the_unused_fraction_and_counts_the_probe_cache() -> None:
    settings = KVMemorySettings(cuda_memory_fraction=0.9)
    # free 10 GiB of 16: the process may fill 14.4 GiB in all, so 16 * 0.1 = 1.6 GiB stay free.
    assert cuda_kv_budget(10 * GIB, 16 * GIB, 1000, settings) == int(10 * GIB - 0.1 * 16 * GIB) + 1000
    assert cuda_kv_budget(1 * GIB, 16 * GIB, 1000, settings) == 1000  # nothing left beyond the probe
    capped = KVMemorySettings(kv_cache_memory=GIB, cuda_memory_fraction=0.9)
    assert cuda_kv_budget(10 * GIB, 16 * GIB, 1000, capped) == GIB


def test_settings_are_validated() -> None:
    with pytest.raises(ConfigError, match="cuda_memory_fraction"):
        KVMemorySettings(cuda_memory_fraction=0.0)
    with pytest.raises(ConfigError, match="kv_cache_memory"):
        KVMemorySettings(kv_cache_memory=0)


def test_default_limits_follow_tgi_with_chunking() -> None:
    # The cache holds 99 usable blocks (block 0 is reserved): 1584 tokens, under 2048 positions.
    assert default_limits(100, 16, 2048, None, None) == (1583, 1584)
    assert default_limits(100, 16, 512, None, None) == (511, 512)
    assert default_limits(100, 16, 512, None, 300) == (299, 300)
    assert default_limits(100, 16, 512, 100, 300) == (100, 300)
    with pytest.raises(ConfigError, match="max_input_tokens \\(300\\) must be >= 1 and < max_total_tokens"):
        default_limits(100, 16, 512, 300, 300)


def test_probe_blocks_start_after_the_reserved_block() -> None:
    probe, blocks_needed = assign_probe_blocks(probe_batch([20, 16, 1]), 16)
    assert [r.blocks for r in probe.requests] == [(1, 2), (3,), (4,)]
    assert [r.id for r in probe.requests] == [0, 1, 2]
    assert blocks_needed == 5


def test_bytes_per_block_formula(tiny_model_dir: Path) -> None:
    runtime = ShardRuntime.load(tiny_model_dir, "float32", "cpu", DistContext.single(), block_size=16)
    assert runtime.model.kv_bytes_per_block(16) == TINY_BYTES_PER_BLOCK_F32
    assert runtime.model.kv_bytes_per_block(16, torch.bfloat16) == TINY_BYTES_PER_BLOCK_F32 // 2


def test_warmup_sizes_the_cache_and_the_runtime_serves_after_it(tiny_model_dir: Path) -> None:
    budget = TINY_BYTES_PER_BLOCK_F32 * 100 + 123  # 100 blocks and change
    runtime = ShardRuntime.load(
        tiny_model_dir, "float32", "cpu", DistContext.single(), block_size=16, kv_cache_memory=budget
    )
    info = runtime.info()
    assert (info.dtype, info.device_type, info.block_size, info.model_type) == ("float32", "cpu", 16, "llama")
    assert info.support_chunking and info.world_size == 1
    assert info.layer_windows == (0, 0)  # the tiny llama's two layers attend to the whole context
    runtime.health()  # works before warmup: block 0 exists from the start
    # Before warmup only block 0 exists, so a router batch is refused, not written out of bounds.
    with pytest.raises(InvalidRequestError, match="block ids"):
        runtime.prefill(Batch(id=1, requests=(make_request(BlockPool(), 1, [5, 6, 7]),)))

    result = runtime.warmup(WarmupRequest(batch=probe_batch([40, 30, 10]), max_prefill_tokens=64))
    assert result.max_supported_total_tokens == 100 * 16
    assert (result.max_input_tokens, result.max_total_tokens) == (99 * 16 - 1, 99 * 16)
    assert runtime.runner.kv_cache.num_blocks == 100
    assert runtime.runner.max_prefill_tokens == 64

    limited = runtime.warmup(
        WarmupRequest(batch=probe_batch([8]), max_prefill_tokens=32, max_input_tokens=100, max_total_tokens=200)
    )
    assert (limited.max_input_tokens, limited.max_total_tokens) == (100, 200)

    pool = BlockPool()
    generations, batch, timings = runtime.prefill(Batch(id=1, requests=(make_request(pool, 1, [5, 6, 7], max_new_tokens=2),)))
    assert len(generations) == 1 and batch is not None
    assert timings.total_ns >= timings.forward_ns + timings.decode_ns and timings.concat_ns is None
    new = Batch(id=2, requests=(make_request(pool, 2, [9, 10], max_new_tokens=3),))
    generations, batch, timings = runtime.prefill(new, cached=batch)
    assert [g.request_id for g in generations] == [1, 2] and timings.concat_ns is not None
    assert generations[0].generated_text is not None  # request 1 reached its 2 tokens
    assert batch is not None
    generations, batch, _ = runtime.decode([batch.filter([2])])
    assert [g.request_id for g in generations] == [2] and batch is not None
    runtime.health()


def test_a_budget_below_two_blocks_fails_and_leaves_the_shard_healthy(tiny_model_dir: Path) -> None:
    runtime = ShardRuntime.load(
        tiny_model_dir, "float32", "cpu", DistContext.single(), block_size=16,
        kv_cache_memory=TINY_BYTES_PER_BLOCK_F32 * 2 - 1,
    )
    with pytest.raises(DeviceError, match="holds 1 blocks of 8192 bytes; at least 2 are needed"):
        runtime.warmup(WarmupRequest(batch=probe_batch([10]), max_prefill_tokens=16))
    assert runtime.runner.kv_cache.num_blocks == 1
    runtime.health()
    with pytest.raises(InvalidRequestError, match="token ids must be in 0 .. 511"):
        bad = Batch(id=0, requests=(dataclasses.replace(probe_batch([4]).requests[0], input_ids=(1, 512)),))
        runtime.warmup(WarmupRequest(batch=bad, max_prefill_tokens=16))
    runtime.health()


def test_info_reports_each_layers_sliding_window(make_tiny_model: Callable[..., Path]) -> None:
    model_dir = make_tiny_model("gemma3_text", num_layers=4, sliding_window=6)  # sliding_window_pattern 2
    runtime = ShardRuntime.load(model_dir, "float32", "cpu", DistContext.single(), block_size=16)
    assert runtime.info().layer_windows == (6, 0, 6, 0)


def test_warmup_splits_the_budget_between_two_layer_groups(make_tiny_model: Callable[..., Path]) -> None:
    """Gemma 3 at 5 local : 1 global with a window of 16 (tgictl/kv_groups.py): the local layers' blocks are the
    window's share of the global positions for requests of max_total_tokens, never fewer than one such request;
    the same bytes hold several times the positions of one cache for every layer."""
    model_dir = make_tiny_model("gemma3_text", num_layers=6, sliding_window_pattern=6, sliding_window=16)
    layer_block = TINY_BYTES_PER_BLOCK_F32 // 2  # one layer's K and V of a block (2 KV heads of 16)
    budget = 6 * layer_block * 100  # 100 blocks of every layer
    runtime = ShardRuntime.load(model_dir, "float32", "cpu", DistContext.single(), block_size=16,
                                kv_cache_memory=budget)
    result = runtime.warmup(WarmupRequest(batch=probe_batch([20]), max_prefill_tokens=32, max_total_tokens=512))
    global_blocks, local_blocks = result.max_supported_total_tokens // 16, result.local_blocks
    cache = runtime.runner.kv_cache
    assert cache.groups is not None and (cache.groups.global_blocks, cache.groups.local_blocks) == (
        global_blocks, local_blocks)
    keep = 16 + 2 * 16  # the window and the release margin, of 512 positions
    assert local_blocks - 1 == max(-(-(global_blocks - 1) * keep // 512), 512 // 16)
    assert global_blocks * layer_block + local_blocks * 5 * layer_block <= budget
    assert global_blocks > 2 * 100  # positions the same bytes hold, against 100 blocks for every layer
    assert cache.nbytes <= budget
    assert (result.max_input_tokens, result.max_total_tokens) == (511, 512)
    runtime.health()
