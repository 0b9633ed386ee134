"""Device discovery for budget derivation: NVIDIA GPUs through NVML, the dense 16-bit FLOPs of known
cards, and for hosts without a GPU the cores, RAM and a measured matmul rate.

Discovery functions return plain frozen dataclasses; the budget arithmetic (runtime/profile/budgets.py) takes
them as input, so tests can hand it any device list. Nothing here touches CUDA: NVML reads the driver's
view without creating a CUDA context, which keeps `tgictl profile` cheap and safe next to a running server.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import takewhile
from typing import Any

from tgictl.errors import ConfigError
from tgictl.runtime.host import CpuHost, discover_cpu

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as NVML reports it (NVML index order, which ignores CUDA_VISIBLE_DEVICES)."""

    index: int
    name: str  # NVML name, e.g. "NVIDIA H100 80GB HBM3"
    total_memory_bytes: int
    free_memory_bytes: int


@dataclass(frozen=True)
class GpuDiscovery:
    devices: tuple[GpuDevice, ...]
    note: str  # why the list is empty (NVML missing, no driver), or "" when NVML answered


@dataclass(frozen=True)
class MatmulMeasurement:
    dtype: str  # "float32" or "bfloat16"
    flops_per_s: float
    size: int  # square matrices [size, size] @ [size, size]
    iterations: int
    seconds: float


@dataclass(frozen=True)
class CardFlops:
    card: str  # normalised card name (TGI's spelling where TGI lists the card)
    dense_16bit_flops: float  # FLOP/s, dense (no sparsity), fp16/bf16 tensor math
    source: str


# --- FLOPs table -------------------------------------------------------------------------------------
# Matched on the NVML name normalised as TGI does (lower case, spaces → "-"). Patterns are anchored so
# that "l4" does not match "l40", "a10" not "a100", "h20" not "h200", "rtx-4090" not "rtx-4090-d".
# The first group follows TGI's launcher table (reference §4.3) exactly, including its quirks (the RTX
# 4090 figure is the non-tensor FP16 rate; the H100 SXM figure is below NVIDIA's 989 dense).
# The second group is ours: dense fp16/bf16 tensor figures (FP32 accumulate) from NVIDIA's datasheets
# and architecture whitepapers, halving the "with sparsity" figures where only those are printed.
_TGI = "TGI launcher FLOPs table (reference §4.3)"
_FLOPS_TABLE: tuple[tuple[str, str, float, str], ...] = (
    # (regex on normalised name, card, TFLOP/s, source)
    (r"(^|-)rtx-4090$", "nvidia-4090", 82, _TGI),
    (r"(^|-)t4$", "nvidia-t4", 65, _TGI),
    (r"(^|-)l4$", "nvidia-l4", 121, _TGI),
    (r"(^|-)l40$", "nvidia-l40", 181, _TGI),
    (r"(^|-)l40s$", "nvidia-l40s", 363, _TGI),
    (r"(^|-)a10g$", "nvidia-a10g", 125, _TGI),
    (r"(^|-)a40$", "nvidia-a40", 149, _TGI),
    (r"(^|-)a100-sxm4-(80|40)gb$", "nvidia-a100", 312, _TGI),
    (r"(^|-)a100-80gb-pcie$", "nvidia-a100", 312, _TGI),
    (r"(^|-)h100-(80gb-hbm3|nvl)$", "nvidia-h100", 900, _TGI),
    (r"(^|-)h200$", "nvidia-h200", 989, _TGI),
    # Ours. A100 PCIe 40GB: A100 datasheet, 312 TFLOPS BF16 dense for every form factor.
    (r"(^|-)a100-pcie-40gb$", "nvidia-a100-pcie-40gb", 312, "NVIDIA A100 datasheet: 312 BF16 dense"),
    (r"(^|-)h100-pcie$", "nvidia-h100-pcie", 756, "NVIDIA H100 datasheet: 1513 BF16 sparse / 2"),
    (r"(^|-)h200-nvl$", "nvidia-h200-nvl", 835, "NVIDIA H200 datasheet: 1671 BF16 sparse / 2"),
    (r"(^|-)h20$", "nvidia-h20", 148, "NVIDIA H20 product brief: 148 BF16 dense"),
    (r"(^|-)b200$", "nvidia-b200", 2250, "NVIDIA HGX B200 datasheet: 36 PF BF16 sparse / 8 GPUs / 2"),
    (r"(^|-)gb200$", "nvidia-gb200", 2500, "NVIDIA GB200 NVL72 datasheet: 360 PF BF16 sparse / 72 / 2"),
    (r"(^|-)rtx-5090$", "nvidia-rtx-5090", 209.5,
     "NVIDIA RTX Blackwell whitepaper: 209.5 FP16 tensor, FP32 accumulate, dense"),
    (r"(^|-)a10$", "nvidia-a10", 125, "NVIDIA A10 datasheet: 125 BF16 dense"),
    (r"(^|-)a30$", "nvidia-a30", 165, "NVIDIA A30 datasheet: 165 BF16 dense"),
    (r"(^|-)l20$", "nvidia-l20", 119.5, "NVIDIA L20 product brief: 119.5 FP16 dense"),
    (r"(^|-)rtx-a6000$", "nvidia-rtx-a6000", 154.8, "NVIDIA RTX A6000 datasheet: 309.7 tensor sparse / 2"),
    (r"(^|-)rtx-6000-ada-generation$", "nvidia-rtx-6000-ada", 364.2,
     "NVIDIA Ada whitepaper: 364.2 FP16 tensor, FP32 accumulate, dense"),
)


def normalise_card_name(nvml_name: str) -> str:
    """TGI's card spelling: "NVIDIA H100 80GB HBM3" → "nvidia-h100-80gb-hbm3"."""
    return "-".join(nvml_name.strip().lower().split())


def lookup_card_flops(nvml_name: str) -> CardFlops | None:
    """Dense 16-bit FLOP/s of a card by its NVML name; None for a card we have no figure for."""
    normalised = normalise_card_name(nvml_name)
    for pattern, card, tflops, source in _FLOPS_TABLE:
        if re.search(pattern, normalised):
            return CardFlops(card=card, dense_16bit_flops=tflops * 1e12, source=source)
    return None


# --- GPUs --------------------------------------------------------------------------------------------
def _text(value: Any) -> str:
    # nvidia-ml-py returned bytes before 11.5; accept both.
    return value.decode() if isinstance(value, bytes) else str(value)


def discover_gpus(nvml: Any | None = None, visible: Sequence[int] | None = None) -> GpuDiscovery:
    """List NVIDIA GPUs through NVML. `nvml` is the pynvml module (imported when None); any object with
    the same functions works, which is how tests describe hosts they do not have. Never raises: a host
    without the library or the driver simply has no GPUs, and `note` says why.

    NVML sees every GPU regardless of CUDA_VISIBLE_DEVICES; `visible` (NVML indices, in CUDA's order)
    narrows the list the way CUDA does: CUDA device i is NVML device visible[i], and the list ends at
    the first index that does not exist."""
    if nvml is None:
        try:
            import pynvml as nvml  # nvidia-ml-py
        except ImportError:
            return GpuDiscovery(devices=(), note="nvidia-ml-py is not installed")
    try:
        nvml.nvmlInit()
    except Exception as err:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ... all mean "no GPU here"
        return GpuDiscovery(devices=(), note=f"NVML unavailable: {err}")
    try:
        count = nvml.nvmlDeviceGetCount()
        indices = list(range(count)) if visible is None else list(takewhile(lambda i: 0 <= i < count, visible))
        devices = []
        for index in indices:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            devices.append(
                GpuDevice(
                    index=index,
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    total_memory_bytes=int(memory.total),
                    free_memory_bytes=int(memory.free),
                )
            )
    except Exception as err:  # a device that fails mid-query: report what NVML said, keep no partial list
        return GpuDiscovery(devices=(), note=f"NVML query failed: {err}")
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # shutdown failing after a successful query changes nothing we report
            pass
    note = "" if devices else "NVML found no GPU"
    return GpuDiscovery(devices=tuple(devices), note=note)


MATMUL_REPEATS = 5


def measure_matmul_flops(
    dtype: str, size: int = 512, seconds: float = 0.15, clock: Callable[[], float] = time.perf_counter,
    repeats: int = MATMUL_REPEATS,
) -> MatmulMeasurement:
    """Square matmuls on the CPU, `repeats` timings of about `seconds` each: a practical ceiling of what
    the model's GEMMs get with torch's current thread count. The median timing is the figure (one
    timing swings with whatever else the cores run). One warm-up product is excluded (it pays for
    allocation)."""
    import torch  # lazy: discovery of GPUs and RAM must not pay torch's import

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(dtype)
    if torch_dtype is None:
        raise ConfigError(f"matmul dtype must be float32 or bfloat16, got {dtype!r}")
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(torch_dtype)  # [size, size]
    b = torch.randn(size, size, generator=generator).to(torch_dtype)  # [size, size]
    torch.matmul(a, b)
    rates: list[float] = []
    total_iterations, total_seconds = 0, 0.0
    for _ in range(max(repeats, 1)):
        iterations = 0
        start = clock()
        elapsed = 0.0
        while iterations == 0 or elapsed < seconds:
            torch.matmul(a, b)
            iterations += 1
            elapsed = clock() - start
        rates.append(2.0 * size**3 * iterations / max(elapsed, 1e-9))
        total_iterations += iterations
        total_seconds += elapsed
    return MatmulMeasurement(dtype=dtype, flops_per_s=statistics.median(rates), size=size,
                             iterations=total_iterations, seconds=total_seconds)


@dataclass(frozen=True)
class Hardware:
    """Everything budgets need about the host. `cpu_matmul` is filled only when there is no GPU."""

    gpus: tuple[GpuDevice, ...]
    gpu_note: str
    cpu: CpuHost
    cpu_matmul: tuple[MatmulMeasurement, ...]


def discover_hardware(measure_seconds: float = 0.15, visible_gpus: Sequence[int] | None = None) -> Hardware:
    """GPUs through NVML; without any, the CPU host and its measured float32 and bfloat16 matmul rates."""
    gpus = discover_gpus(visible=visible_gpus)
    cpu = discover_cpu()
    matmul: tuple[MatmulMeasurement, ...] = ()
    if not gpus.devices:
        matmul = tuple(measure_matmul_flops(d, seconds=measure_seconds) for d in ("float32", "bfloat16"))
    return Hardware(gpus=gpus.devices, gpu_note=gpus.note, cpu=cpu, cpu_matmul=matmul)
