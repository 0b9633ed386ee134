"""`tgictl profile --measure`: load the model in this process as a single shard, run the warmup probe
the router would send, and report what the shard measured, to print beside the estimates.

The probe is the router's own (router/limits.warmup_request) and the warmup is the shard's own
(ShardRuntime.warmup), so the measured KV blocks and token limits are exactly what `tgictl launch
--num-shard 1` would get with the same flags on this host at this moment. Only one shard: a
tensor-parallel measurement would need the launcher's process group, not one process.
"""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tgictl.config import RouterConfig
from tgictl.errors import ConfigError
from tgictl.kv_cache_dtype import DEFAULT_KV_CACHE_DTYPE
from tgictl.quantization import QuantizeSpec
from tgictl.runtime.profile.budgets import Budgets
from tgictl.runtime.router.scheduling.limits import warmup_request


@dataclass(frozen=True)
class MeasureSettings:
    """What the in-process shard is loaded with: the estimate's own choices, so both describe one setup."""

    model_dir: Path
    dtype: str
    device: str  # "cpu" or "cuda:0"
    block_size: int
    kv_cache_memory_bytes: int | None  # the shard's --kv-cache-memory (None: its default rule)
    cuda_memory_fraction: float  # already multiplied by the warmup wiggle room, as the shard takes it
    max_batch_prefill_tokens: int  # tokens in the probe batch
    max_input_tokens: int | None
    max_total_tokens: int | None
    quantize: QuantizeSpec | None = None  # --quantize, as the shard takes it
    kv_cache_dtype: str = DEFAULT_KV_CACHE_DTYPE  # --kv-cache-dtype, as the shard takes it

    def __post_init__(self) -> None:
        if self.max_batch_prefill_tokens < 1:
            raise ConfigError(
                f"max_batch_prefill_tokens must be >= 1 to run the warmup probe, got {self.max_batch_prefill_tokens}"
            )


@dataclass(frozen=True)
class Measurement:
    load_seconds: float  # weights from disk onto the device
    warmup_seconds: float  # the whole warmup: probe step, KV sizing and allocation
    kv_blocks: int  # block 0 (health probes) included, as in the estimate
    max_batch_total_tokens: int
    max_input_tokens: int
    max_total_tokens: int
    probe_prefill_tokens: int
    # A second run of the probe batch on the sized cache (the first one, inside warmup, also pays for
    # one-time allocations); None when the sized cache cannot hold the probe's blocks a second time.
    probe_forward_seconds: float | None
    probe_skipped_because: str
    peak_rss_bytes: int  # this process: the model, the probe, the KV cache and whatever ran before
    peak_device_bytes: int | None  # torch's CUDA allocator peak; None on CPU


def peak_rss_bytes() -> int:
    """The process's peak resident set; ru_maxrss is in KiB on Linux and in bytes on macOS."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def _probe_token(model_dir: Path, vocab_size: int) -> int:
    # The router's choice, so the probe is the batch the router would send (needs tokenizer.json).
    from tgictl.runtime.router.service import probe_token as router_probe_token
    from tgictl.runtime.router.text.tokenizer import RouterTokenizer

    return router_probe_token(RouterTokenizer(model_dir), vocab_size)


def measure(settings: MeasureSettings) -> Measurement:
    """Load, warm up, time the probe; the model is dropped when this returns."""
    # torch and the shard runtime load only here: `tgictl profile` without --measure stays light.
    import torch

    from tgictl.runtime.shard.dist import DistContext
    from tgictl.runtime.shard.runtime import ShardRuntime
    from tgictl.runtime.shard.warmup import assign_probe_blocks

    start = time.perf_counter()
    runtime = ShardRuntime.load(
        settings.model_dir, settings.dtype, settings.device, DistContext.single(), settings.block_size,
        settings.kv_cache_memory_bytes, settings.cuda_memory_fraction, quantize=settings.quantize,
        kv_cache_dtype=settings.kv_cache_dtype,
    )
    load_seconds = time.perf_counter() - start
    info = runtime.info()
    router = RouterConfig(
        master_shard_uds_path="",  # unused: the shard runs in this process, not behind a socket
        tokenizer_name=str(settings.model_dir),
        max_input_tokens=settings.max_input_tokens,
        max_total_tokens=settings.max_total_tokens,
    )
    request = warmup_request(
        router, info, _probe_token(settings.model_dir, info.vocab_size), settings.max_batch_prefill_tokens
    )
    start = time.perf_counter()
    result = runtime.warmup(request)
    warmup_seconds = time.perf_counter() - start

    probe, probe_blocks = assign_probe_blocks(request.batch, settings.block_size)
    num_blocks = result.max_supported_total_tokens // settings.block_size
    forward_seconds, skipped = None, ""
    if probe_blocks <= num_blocks:
        _, _, timings = runtime.prefill(probe)
        forward_seconds = timings.forward_ns / 1e9
    else:
        skipped = f"the sized cache ({num_blocks} blocks) cannot hold the probe's {probe_blocks} blocks again"
    on_cuda = runtime.device.type == "cuda"
    return Measurement(
        load_seconds=load_seconds,
        warmup_seconds=warmup_seconds,
        kv_blocks=num_blocks,
        max_batch_total_tokens=result.max_supported_total_tokens,
        max_input_tokens=result.max_input_tokens,
        max_total_tokens=result.max_total_tokens,
        probe_prefill_tokens=sum(len(r.input_ids) for r in probe.requests),
        probe_forward_seconds=forward_seconds,
        probe_skipped_because=skipped,
        peak_rss_bytes=peak_rss_bytes(),
        peak_device_bytes=int(torch.cuda.max_memory_allocated(runtime.device)) if on_cuda else None,
    )


def compare(measurement: Measurement, budgets: Budgets) -> dict[str, dict[str, Any]]:
    """{figure: {"estimate", "measured", "source"}}: the estimate is None for what only a run can tell."""
    m = measurement
    tokens_per_s = (
        m.probe_prefill_tokens / m.probe_forward_seconds if m.probe_forward_seconds else None
    )
    forward_source = (
        f"forward of the {m.probe_prefill_tokens}-token probe batch, run again after warmup"
        if m.probe_forward_seconds is not None else f"not run: {m.probe_skipped_because}"
    )
    rows: list[tuple[str, Any, Any, str]] = [
        ("kv_blocks", budgets.kv_blocks.value, m.kv_blocks, "shard warmup: KV budget // bytes per block"),
        ("max_batch_total_tokens", budgets.max_batch_total_tokens.value, m.max_batch_total_tokens,
         "shard warmup: max_supported_total_tokens"),
        ("max_total_tokens", budgets.max_total_tokens.value, m.max_total_tokens, "shard warmup"),
        ("max_input_tokens", budgets.max_input_tokens.value, m.max_input_tokens, "shard warmup"),
        ("max_batch_prefill_tokens", budgets.max_batch_prefill_tokens.value, m.probe_prefill_tokens,
         "tokens in the router's warmup batch"),
        ("load_seconds", None, m.load_seconds, "ShardRuntime.load, weights onto the device"),
        ("warmup_seconds", None, m.warmup_seconds, "ShardRuntime.warmup: probe step, KV sizing and allocation"),
        ("probe_forward_seconds", None, m.probe_forward_seconds, forward_source),
        ("prefill_tokens_per_s", None, tokens_per_s, "probe tokens / probe_forward_seconds"),
        ("peak_rss_bytes", None, m.peak_rss_bytes, "getrusage ru_maxrss of this process"),
        ("peak_device_bytes", None, m.peak_device_bytes,
         "torch.cuda.max_memory_allocated" if m.peak_device_bytes is not None else "no CUDA device"),
    ]
    return {name: {"estimate": estimate, "measured": measured, "source": source}
            for name, estimate, measured, source in rows}
