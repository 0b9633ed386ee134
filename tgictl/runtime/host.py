"""What this host is, as both the shard and `tgictl profile` need it: usable cores, RAM, whether the CPU
does bf16 math natively, and from that the dtype a shard serves in by default (one rule, so that the
profile sizes what the shard will really allocate)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CpuHost:
    cores: int  # cores this process may run on (affinity), not the machine's total
    total_memory_bytes: int
    available_memory_bytes: int  # MemAvailable: what can be allocated without swapping
    native_bf16: bool = False  # AVX512-BF16 or AMX: bf16 matmuls run at about twice float32's speed


def parse_meminfo(text: str) -> tuple[int, int]:
    """(MemTotal, MemAvailable) in bytes from /proc/meminfo text; values there are in KiB. Kernels
    older than 3.14 lack MemAvailable: MemFree + Cached is the classic approximation."""
    fields: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[key.strip()] = int(parts[0]) * 1024
    if "MemTotal" not in fields:
        raise ValueError("no MemTotal line in meminfo")
    available = fields.get("MemAvailable", fields.get("MemFree", 0) + fields.get("Cached", 0))
    return fields["MemTotal"], available


def _memory_from_sysconf() -> tuple[int, int]:
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_PHYS_PAGES") * page, os.sysconf("SC_AVPHYS_PAGES") * page


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The whole cores a cgroup CPU limit lets this process keep busy (a Kubernetes pod's `limits.cpu`,
    `docker run --cpus`): quota over period, rounded down, at least 1; None without a limit or cgroup.
    cgroup v2's cpu.max ("max 100000" or "250000 100000"), else v1's cpu.cfs_quota_us (-1: none)."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else max(1, int(quota) // int(period))
    except (OSError, ValueError, ZeroDivisionError):
        pass
    for v1 in (root / "cpu", root / "cpu,cpuacct"):
        try:
            quota_us = int((v1 / "cpu.cfs_quota_us").read_text())
            period_us = int((v1 / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return None if quota_us <= 0 or period_us <= 0 else max(1, quota_us // period_us)
    return None


def usable_cores() -> int:
    """Cores this process may run on: its affinity mask, which a container or taskset narrows, and no more than
    its cgroup's CPU limit (threads beyond the quota spend it waiting for each other, then all stall)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    return cores if limit is None else min(cores, limit)


# /proc/cpuinfo flags of native bf16 dot products (AVX512-BF16, AMX). Without them oneDNN emulates
# bf16 matmuls, which are then no faster than float32.
_NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_has_native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    try:
        text = cpuinfo.read_text()
    except OSError:  # not Linux: no way to tell cheaply, so the always-exact choice
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            return not _NATIVE_BF16_FLAGS.isdisjoint(line.split(":", 1)[-1].split())
    return False


def default_serving_dtype(on_gpu: bool, native_bf16: bool) -> tuple[str, str]:
    """(dtype, why) a shard serves in when --dtype is not given; `tgictl profile` sizes with the same.

    bfloat16 on CUDA (float16's range overflows on some checkpoints) and on CPUs with native bf16 math;
    float32 elsewhere. Measured on SmolLM2-135M, 2 cores with AVX512-BF16 (scripts/perf_decode.py): a
    bf16 decode step at batch 32 and 256 cached tokens runs about 3x faster than float32, and prefill
    about 1.5x. Float32 stays available and is what the parity tests against transformers use.
    """
    if on_gpu:
        return "bfloat16", "bfloat16 on CUDA"
    if native_bf16:
        return "bfloat16", "bfloat16 on a CPU with native bf16 math (AVX512-BF16/AMX)"
    return "float32", "float32 on a CPU without native bf16 math"


def discover_cpu(meminfo_path: Path = Path("/proc/meminfo"), cpuinfo_path: Path = Path("/proc/cpuinfo")) -> CpuHost:
    """Usable cores, RAM (from /proc/meminfo, else sysconf) and native bf16 support of this host."""
    cores = usable_cores()
    try:
        total, available = parse_meminfo(meminfo_path.read_text())
    except (OSError, ValueError):
        total, available = _memory_from_sysconf()
    return CpuHost(cores=cores, total_memory_bytes=total, available_memory_bytes=available,
                   native_bf16=cpu_has_native_bf16(cpuinfo_path))
