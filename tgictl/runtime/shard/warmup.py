"""Warmup: a probe forward at the largest prefill, then size the KV cache from the memory left.

Mirrors TGI's `warmup` (TGI's FlashCausalLM.warmup). The probe runs the full step (sampling, top-n, prompt
logprobs) on a cache sized for the probe alone, so a `max_prefill_tokens` that does not fit fails
here, at startup, instead of under load. Then the cache gets every block the memory budget allows:

- CUDA: `free - (1 - memory_fraction) * total`, measured while the probe cache is still allocated
  (its blocks are added back, as TGI does);
- CPU: a cap, `kv_cache_memory` bytes, defaulting to min(25% of available RAM, 4 GiB) so the
  machine stays usable; an explicit cap larger than the available RAM is refused.

bytes per block = block_size x kv_heads_per_rank x layers x 2 (K and V) x bytes per head: head_dim x dtype bytes
(the model's dtype), head_dim + 2 (int8 values and their bf16 scale) or head_dim (fp8) with --kv-cache-dtype.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tgictl.errors import ConfigError, DeviceError
from tgictl.kv_cache_dtype import DEFAULT_KV_CACHE_DTYPE, check_kv_cache_dtype
from tgictl.kv_groups import GroupShape, split_blocks
from tgictl.proto.messages import (
    Batch,
    Request,
    StoppingParams,
    WarmupRequest,
    WarmupResult,
)
from tgictl.runtime.host import discover_cpu
from tgictl.runtime.shard.batch import ShardBatch
from tgictl.runtime.shard.kv_cache import KVCache
from tgictl.runtime.shard.step import ModelRunner

GIB = 1 << 30
CPU_DEFAULT_FRACTION = 0.25  # of the available RAM, when no kv_cache_memory is given
CPU_DEFAULT_CAP = 4 * GIB


@dataclass(frozen=True)
class KVMemorySettings:
    """How much memory the KV cache may take. Validated here so a bad value fails before the probe."""

    kv_cache_memory: int | None = None  # bytes; CPU: the budget (default above); CUDA: an extra cap
    cuda_memory_fraction: float = 0.9  # share of the GPU's total memory this process may fill
    kv_cache_dtype: str = DEFAULT_KV_CACHE_DTYPE  # the cache's format (--kv-cache-dtype): bytes per block follow

    def __post_init__(self) -> None:
        check_kv_cache_dtype(self.kv_cache_dtype)
        if self.kv_cache_memory is not None and self.kv_cache_memory < 1:
            raise ConfigError(f"kv_cache_memory must be >= 1 byte, got {self.kv_cache_memory}")
        if not 0.0 < self.cuda_memory_fraction <= 1.0:
            raise ConfigError(f"cuda_memory_fraction must be in (0, 1], got {self.cuda_memory_fraction}")


def cpu_kv_budget(available_bytes: int, kv_cache_memory: int | None) -> int:
    """Bytes the CPU KV cache may take (the module docstring's rule)."""
    if kv_cache_memory is None:
        return min(int(available_bytes * CPU_DEFAULT_FRACTION), CPU_DEFAULT_CAP)
    if kv_cache_memory > available_bytes:
        raise ConfigError(
            f"kv_cache_memory ({kv_cache_memory} bytes) exceeds the available RAM ({available_bytes} bytes)"
        )
    return kv_cache_memory


def cuda_kv_budget(free_bytes: int, total_bytes: int, probe_cache_bytes: int, settings: KVMemorySettings) -> int:
    """Bytes the CUDA KV cache may take; free memory is measured with the probe cache still allocated."""
    budget = max(0, int(free_bytes - (1.0 - settings.cuda_memory_fraction) * total_bytes)) + probe_cache_bytes
    return budget if settings.kv_cache_memory is None else min(budget, settings.kv_cache_memory)


def default_limits(
    num_blocks: int,
    block_size: int,
    max_position_embeddings: int,
    max_input_tokens: int | None,
    max_total_tokens: int | None,
) -> tuple[int, int]:
    """(max_input_tokens, max_total_tokens), filling unset ones as TGI does with chunking (7.3 step 6).

    max_total_tokens defaults to what one request can hold: the cache minus the reserved block 0,
    bounded by the model's positions; max_input_tokens to max_total_tokens - 1.
    """
    if max_total_tokens is None:
        max_total_tokens = min((num_blocks - 1) * block_size, max_position_embeddings)
    if max_input_tokens is None:
        max_input_tokens = max_total_tokens - 1
    if not 1 <= max_input_tokens < max_total_tokens:
        raise ConfigError(
            f"max_input_tokens ({max_input_tokens}) must be >= 1 and < max_total_tokens ({max_total_tokens})"
        )
    return max_input_tokens, max_total_tokens


def assign_probe_blocks(batch: Batch, block_size: int) -> tuple[Batch, int]:
    """The probe batch with blocks the shard chose itself, and the blocks the probe cache needs.

    Blocks start at 1 (block 0 is reserved for health probes). The probe runs one step, so each
    request covers its prompt only (max_new_tokens 1); ids are renumbered because the router sends
    every probe request with id 0 (TGI's grpc_client.rs `warmup`).
    """
    requests: list[Request] = []
    next_block = 1
    for index, request in enumerate(batch.requests):
        count = math.ceil(len(request.input_ids) / block_size)
        blocks = tuple(range(next_block, next_block + count))
        next_block += count
        requests.append(
            dataclasses.replace(
                request,
                id=index,
                blocks=blocks,
                cache_len=0,
                chunk_len=None,
                stopping=StoppingParams(max_new_tokens=1, ignore_eos=True),
            )
        )
    return dataclasses.replace(batch, requests=tuple(requests)), next_block


def _out_of_memory(exc: BaseException) -> bool:
    # The CPU allocator reports failure as a plain RuntimeError ("can't allocate memory").
    return not isinstance(exc, RuntimeError) or isinstance(exc, torch.OutOfMemoryError) or "allocate" in str(exc)


def _release(runner: ModelRunner) -> None:
    """Drop the runner's cache so its memory can be measured as free or reused."""
    runner.kv_cache = None  # type: ignore[assignment]
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def warmup(
    runner: ModelRunner,
    request: WarmupRequest,
    *,
    settings: KVMemorySettings,
    make_cache: Callable[[int, int | None], KVCache],
    bytes_per_block: int,
    max_position_embeddings: int,
    local_group: GroupShape | None = None,
) -> WarmupResult:
    """Probe, size and re-allocate `runner`'s KV cache; `make_cache(num_blocks, local_blocks)` allocates one.
    With `local_group` (a model mixing global and sliding-window layers) the budget is split between the two
    layer groups (tgictl/kv_groups.py, split_blocks), for requests as long as max_total_tokens (or the longest the
    budget holds when every layer keeps every position).

    On any failure the runner is left with a one-block cache (block 0: health probes keep working).
    """
    if request.max_prefill_tokens < 1:
        raise ConfigError(f"max_prefill_tokens must be >= 1, got {request.max_prefill_tokens}")
    runner.set_max_prefill_tokens(request.max_prefill_tokens)
    try:
        probe_blocks = _probe(runner, request.batch, make_cache)
        budget = _budget(runner, settings, probe_blocks * bytes_per_block)
        num_blocks = budget // bytes_per_block
        if num_blocks < 2:
            raise DeviceError(
                f"the KV cache budget of {budget} bytes holds {num_blocks} blocks of {bytes_per_block} bytes; "
                "at least 2 are needed (block 0 is reserved): raise kv_cache_memory or free memory"
            )
        local_blocks = None
        if local_group is not None:
            longest = min(request.max_total_tokens or max_position_embeddings, (num_blocks - 1) * runner.block_size)
            num_blocks, local_blocks = split_blocks(budget, local_group, runner.block_size, longest)
        max_input, max_total = default_limits(
            min(num_blocks, local_blocks or num_blocks), runner.block_size, max_position_embeddings,
            request.max_input_tokens, request.max_total_tokens,
        )
        try:
            runner.kv_cache = make_cache(num_blocks, local_blocks)
        except (torch.OutOfMemoryError, MemoryError, RuntimeError) as exc:
            if not _out_of_memory(exc):
                raise
            raise DeviceError(f"cannot allocate a KV cache of {num_blocks} blocks ({budget} bytes): {exc}") from exc
    except BaseException:
        if runner.kv_cache is None:
            runner.kv_cache = make_cache(1, None)
        raise
    return WarmupResult(
        max_supported_total_tokens=num_blocks * runner.block_size,
        max_input_tokens=max_input,
        max_total_tokens=max_total,
        local_blocks=local_blocks or 0,
    )


def _probe(runner: ModelRunner, batch: Batch, make_cache: Callable[[int, int | None], KVCache]) -> int:
    """One full step of the probe batch on a cache of exactly its blocks; returns that block count."""
    probe, probe_blocks = assign_probe_blocks(batch, runner.block_size)
    _release(runner)
    try:
        runner.kv_cache = make_cache(probe_blocks, None)  # every layer in the same blocks: the ids are plain
        shard_batch = ShardBatch.from_batch(
            probe,
            block_size=runner.block_size,
            num_blocks=probe_blocks,
            vocab_size=runner.vocab_size,
            device=runner.device,
        )
        runner.generate_token(shard_batch)
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as exc:
        if not _out_of_memory(exc):
            raise
        prefill_tokens = sum(len(r.input_ids) for r in probe.requests)
        raise DeviceError(
            f"Not enough memory to handle {prefill_tokens} prefill tokens. "
            f"You need to decrease `--max-batch-prefill-tokens` ({exc})"
        ) from exc
    return probe_blocks


def _budget(runner: ModelRunner, settings: KVMemorySettings, probe_cache_bytes: int) -> int:
    """Bytes the KV cache may take; leaves the runner without a cache."""
    if runner.device.type == "cuda":
        # Measured with the probe cache still allocated: its bytes count as available (TGI).
        free, total = torch.cuda.mem_get_info(runner.device)
        _release(runner)
        return cuda_kv_budget(free, total, probe_cache_bytes, settings)
    _release(runner)
    return cpu_kv_budget(discover_cpu().available_memory_bytes, settings.kv_cache_memory)
