"""Device discovery: the FLOPs table on real NVML names, NVML through a stand-in library object,
/proc/meminfo parsing, and the CPU matmul measurement (with an injected clock for exact figures)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tgictl.errors import ConfigError
from tgictl.runtime.profile.hardware import (
    GpuDevice,
    GpuDiscovery,
    discover_gpus,
    lookup_card_flops,
    measure_matmul_flops,
    normalise_card_name,
)

GIB = 1 << 30


def test_normalise_card_name_follows_tgi_spelling() -> None:
    assert normalise_card_name("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert normalise_card_name("  NVIDIA  GeForce RTX 4090 ") == "nvidia-geforce-rtx-4090"


@pytest.mark.parametrize(
    ("nvml_name", "card", "tflops"),
    [
        # TGI's table (reference §4.3), exactly.
        ("NVIDIA GeForce RTX 4090", "nvidia-4090", 82),
        ("Tesla T4", "nvidia-t4", 65),
        ("NVIDIA L4", "nvidia-l4", 121),
        ("NVIDIA L40", "nvidia-l40", 181),
        ("NVIDIA L40S", "nvidia-l40s", 363),
        ("NVIDIA A10G", "nvidia-a10g", 125),
        ("NVIDIA A40", "nvidia-a40", 149),
        ("NVIDIA A100-SXM4-80GB", "nvidia-a100", 312),
        ("NVIDIA A100-SXM4-40GB", "nvidia-a100", 312),
        ("NVIDIA A100 80GB PCIe", "nvidia-a100", 312),
        ("NVIDIA H100 80GB HBM3", "nvidia-h100", 900),
        ("NVIDIA H100 NVL", "nvidia-h100", 900),
        ("NVIDIA H200", "nvidia-h200", 989),
        # Newer or unlisted cards, from NVIDIA datasheets (sources in hardware.py).
        ("NVIDIA B200", "nvidia-b200", 2250),
        ("NVIDIA GeForce RTX 5090", "nvidia-rtx-5090", 209.5),
        ("NVIDIA H20", "nvidia-h20", 148),
        ("NVIDIA L20", "nvidia-l20", 119.5),
        ("NVIDIA RTX A6000", "nvidia-rtx-a6000", 154.8),
        ("NVIDIA RTX 6000 Ada Generation", "nvidia-rtx-6000-ada", 364.2),
        ("NVIDIA H100 PCIe", "nvidia-h100-pcie", 756),
        ("NVIDIA H200 NVL", "nvidia-h200-nvl", 835),
        ("NVIDIA A10", "nvidia-a10", 125),
    ],
)
def test_flops_lookup_on_nvml_names(nvml_name: str, card: str, tflops: float) -> None:
    found = lookup_card_flops(nvml_name)
    assert found is not None
    assert found.card == card
    assert found.dense_16bit_flops == tflops * 1e12
    assert found.source


@pytest.mark.parametrize(
    "nvml_name",
    # Near misses must not borrow a neighbour's figure: a cut-down 4090, a pre-tensor-core card.
    ["NVIDIA GeForce RTX 4090 D", "NVIDIA GeForce GTX 1080", "NVIDIA L4X", "AMD Instinct MI300X", ""],
)
def test_unknown_cards_have_no_flops(nvml_name: str) -> None:
    assert lookup_card_flops(nvml_name) is None


@dataclass
class _Memory:
    total: int
    free: int
    used: int


class FakeNvml:
    """Stands in for the pynvml module: the same function names, a fixed device list."""

    def __init__(self, devices: list[tuple[object, int, int]], fail_init: bool = False,
                 fail_memory: bool = False) -> None:
        self.devices = devices
        self.fail_init = fail_init
        self.fail_memory = fail_memory
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise RuntimeError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> object:
        return self.devices[handle][0]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Memory:
        if self.fail_memory:
            raise RuntimeError("GPU is lost")
        _, total, free = self.devices[handle]
        return _Memory(total=total, free=free, used=total - free)


def test_discover_gpus_reads_every_device() -> None:
    # Old nvidia-ml-py returned names as bytes; both spellings must come out as text.
    nvml = FakeNvml([("NVIDIA H100 80GB HBM3", 80 * GIB, 79 * GIB), (b"NVIDIA L4", 24 * GIB, 20 * GIB)])
    found = discover_gpus(nvml)
    assert found == GpuDiscovery(
        devices=(
            GpuDevice(index=0, name="NVIDIA H100 80GB HBM3", total_memory_bytes=80 * GIB, free_memory_bytes=79 * GIB),
            GpuDevice(index=1, name="NVIDIA L4", total_memory_bytes=24 * GIB, free_memory_bytes=20 * GIB),
        ),
        note="",
    )
    assert nvml.shutdowns == 1


def test_discover_gpus_follows_cuda_visibility() -> None:
    nvml = FakeNvml([("NVIDIA L4", GIB, GIB), ("NVIDIA A10G", 2 * GIB, GIB), ("NVIDIA L40S", 3 * GIB, GIB)])
    # CUDA_VISIBLE_DEVICES=2,0 → CUDA device 0 is NVML device 2; "2,5,0" stops at the missing 5
    assert [d.index for d in discover_gpus(nvml, visible=[2, 0]).devices] == [2, 0]
    assert [d.name for d in discover_gpus(nvml, visible=[2, 5, 0]).devices] == ["NVIDIA L40S"]
    assert discover_gpus(nvml, visible=[]) == GpuDiscovery(devices=(), note="NVML found no GPU")


def test_discover_gpus_without_driver_is_empty_with_reason() -> None:
    found = discover_gpus(FakeNvml([], fail_init=True))
    assert found == GpuDiscovery(devices=(), note="NVML unavailable: Driver Not Loaded")


def test_discover_gpus_query_failure_keeps_no_partial_list() -> None:
    nvml = FakeNvml([("NVIDIA L4", GIB, GIB)], fail_memory=True)
    assert discover_gpus(nvml) == GpuDiscovery(devices=(), note="NVML query failed: GPU is lost")
    assert nvml.shutdowns == 1


def test_discover_gpus_with_zero_devices() -> None:
    assert discover_gpus(FakeNvml([])) == GpuDiscovery(devices=(), note="NVML found no GPU")


def test_discover_gpus_on_this_host_never_raises() -> None:
    found = discover_gpus()
    # A CPU-only host explains itself; a GPU host lists consistent devices.
    if found.devices:
        assert all(0 <= d.free_memory_bytes <= d.total_memory_bytes for d in found.devices)
    else:
        assert found.note


def _clock(ticks: list[float]) -> Iterator[float]:
    yield from ticks


def test_measure_matmul_flops_arithmetic_with_injected_clock() -> None:
    ticks = _clock([10.0, 10.1, 10.2])
    # start 10.0; after product 1: 0.1 s (< 0.15, go on); after product 2: 0.2 s → stop.
    measured = measure_matmul_flops("float32", size=64, seconds=0.15, clock=lambda: next(ticks), repeats=1)
    assert measured.iterations == 2
    assert measured.seconds == pytest.approx(0.2)
    assert measured.flops_per_s == pytest.approx(2 * 64**3 * 2 / 0.2)  # 2·n³ FLOP per product


def test_measure_matmul_flops_takes_the_median_of_its_repeats() -> None:
    # Three timings of 2 products each: 0.2 s, 1.0 s (the cores were busy), 0.4 s → the median 0.4 s.
    ticks = _clock([0.0, 0.1, 0.2, 1.0, 1.1, 2.0, 3.0, 3.1, 3.4])
    measured = measure_matmul_flops("float32", size=64, seconds=0.15, clock=lambda: next(ticks), repeats=3)
    assert measured.iterations == 6
    assert measured.flops_per_s == pytest.approx(2 * 64**3 * 2 / 0.4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_measure_matmul_flops_really_runs(dtype: str) -> None:
    measured = measure_matmul_flops(dtype, size=128, seconds=0.05)
    assert measured.dtype == dtype
    assert measured.iterations >= 1 and measured.seconds >= 0.05
    assert measured.flops_per_s > 1e6  # even a slow, shared core does a million FLOP/s


def test_measure_matmul_flops_rejects_other_dtypes() -> None:
    with pytest.raises(ConfigError, match="float16"):
        measure_matmul_flops("float16")
