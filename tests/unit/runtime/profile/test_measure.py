"""runtime/profile/measure.py in-process on the tiny model: the shard's warmup figures for a known budget, the
probe not repeated when the sized cache cannot hold it, and the side-by-side rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from tgictl.errors import ConfigError
from tgictl.runtime.host import CpuHost
from tgictl.runtime.model_files.resolve import load_model_config
from tgictl.runtime.profile.budgets import BudgetSettings, compute_budgets
from tgictl.runtime.profile.model_shape import model_shape
from tgictl.runtime.profile.hardware import Hardware
from tgictl.runtime.profile.measure import (
    Measurement,
    MeasureSettings,
    compare,
    measure,
)

BLOCK_BYTES = 8192  # tiny llama, float32: 16 tokens · 2 (K,V) · 2 layers · 2 kv heads · 16 · 4 bytes


def settings(model_dir: Path, **overrides: object) -> MeasureSettings:
    values: dict[str, object] = dict(
        model_dir=model_dir, dtype="float32", device="cpu", block_size=16, kv_cache_memory_bytes=16 * BLOCK_BYTES,
        cuda_memory_fraction=0.9, max_batch_prefill_tokens=64, max_input_tokens=None, max_total_tokens=None,
    )
    return MeasureSettings(**(values | overrides))  # type: ignore[arg-type]


def test_measure_reports_the_shards_warmup(tiny_model_dir: Path) -> None:
    got = measure(settings(tiny_model_dir, max_input_tokens=20, max_total_tokens=100))
    assert got.kv_blocks == 16  # the budget is exactly 16 blocks
    assert got.max_batch_total_tokens == 256
    assert (got.max_input_tokens, got.max_total_tokens) == (20, 100)  # given, so kept
    assert got.probe_prefill_tokens == 64  # requests of at most max_input_tokens: 20 + 20 + 20 + 4
    # 4 requests need 2 + 2 + 2 + 1 blocks after block 0: the 16-block cache holds them again
    assert got.probe_forward_seconds is not None and got.probe_forward_seconds > 0
    assert got.probe_skipped_because == ""
    assert got.peak_device_bytes is None and got.peak_rss_bytes > 0


def test_probe_not_repeated_when_the_sized_cache_cannot_hold_it(tiny_model_dir: Path) -> None:
    # 256 probe tokens are 16 blocks after block 0: 17 needed, the budget gives 16
    got = measure(settings(tiny_model_dir, max_batch_prefill_tokens=256))
    assert (got.kv_blocks, got.max_total_tokens, got.max_input_tokens) == (16, 240, 239)  # 15 blocks · 16
    assert got.probe_forward_seconds is None
    assert got.probe_skipped_because == "the sized cache (16 blocks) cannot hold the probe's 17 blocks again"


def test_settings_need_a_probe(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="max_batch_prefill_tokens must be >= 1 to run the warmup probe, got 0"):
        settings(tiny_model_dir, max_batch_prefill_tokens=0)


def test_compare_puts_estimate_and_measurement_side_by_side(tiny_model_dir: Path) -> None:
    shape = model_shape(load_model_config(tiny_model_dir))
    hardware = Hardware(gpus=(), gpu_note="test", cpu=CpuHost(2, 8 << 30, 8 << 30), cpu_matmul=())
    budgets = compute_budgets(shape, hardware, BudgetSettings(kv_cache_memory_bytes=16 * BLOCK_BYTES,
                                                              max_batch_prefill_tokens=64))
    measured = Measurement(
        load_seconds=0.5, warmup_seconds=1.0, kv_blocks=16, max_batch_total_tokens=256, max_input_tokens=239,
        max_total_tokens=240, probe_prefill_tokens=64, probe_forward_seconds=0.25, probe_skipped_because="",
        peak_rss_bytes=123, peak_device_bytes=None,
    )
    rows = compare(measured, budgets)
    pairs = {name: (row["estimate"], row["measured"]) for name, row in rows.items()}
    assert pairs == {
        "kv_blocks": (16, 16),
        "max_batch_total_tokens": (256, 256),
        "max_total_tokens": (240, 240),
        "max_input_tokens": (239, 239),
        "max_batch_prefill_tokens": (64, 64),
        "load_seconds": (None, 0.5),
        "warmup_seconds": (None, 1.0),
        "probe_forward_seconds": (None, 0.25),
        "prefill_tokens_per_s": (None, 256.0),  # 64 tokens / 0.25 s
        "peak_rss_bytes": (None, 123),
        "peak_device_bytes": (None, None),
    }
    assert rows["peak_device_bytes"]["source"] == "no CUDA device"
