"""The host as the shard and profile see it: RAM, usable cores, native bf16, the default dtype."""

import os
from pathlib import Path

import pytest
import torch

from tgictl.runtime.host import (
    CpuHost,
    cgroup_cpu_limit,
    cpu_has_native_bf16,
    default_serving_dtype,
    discover_cpu,
    parse_meminfo,
    usable_cores,
)
from tgictl.runtime.shard.runtime import default_dtype

MEMINFO = """MemTotal:       16384000 kB
MemFree:         1000000 kB
MemAvailable:    8192000 kB
Buffers:          100000 kB
Cached:          4000000 kB
HugePages_Total:       0
"""


def test_parse_meminfo() -> None:
    assert parse_meminfo(MEMINFO) == (16384000 * 1024, 8192000 * 1024)


def test_parse_meminfo_without_memavailable_uses_free_plus_cached() -> None:
    old_kernel = MEMINFO.replace("MemAvailable:    8192000 kB\n", "")
    assert parse_meminfo(old_kernel) == (16384000 * 1024, (1000000 + 4000000) * 1024)


def test_parse_meminfo_needs_memtotal() -> None:
    with pytest.raises(ValueError):
        parse_meminfo("MemFree: 12 kB\n")


def test_discover_cpu_from_meminfo_file(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO)
    host = discover_cpu(meminfo)
    assert host.total_memory_bytes == 16384000 * 1024
    assert host.available_memory_bytes == 8192000 * 1024
    assert host.cores == usable_cores()


def test_usable_cores_follow_the_affinity_mask() -> None:
    mask = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(mask)})  # as `taskset -c N` starts a process
        assert usable_cores() == 1
    finally:
        os.sched_setaffinity(0, mask)
    limit = cgroup_cpu_limit()  # a CI container's CPU limit caps it too
    assert usable_cores() == (len(mask) if limit is None else min(len(mask), limit))


def test_discover_cpu_falls_back_to_sysconf(tmp_path: Path) -> None:
    host = discover_cpu(tmp_path / "missing")
    assert isinstance(host, CpuHost)
    assert 0 < host.available_memory_bytes <= host.total_memory_bytes


FLAGS = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw {extra}\nbogomips\t: 4000\n"


def test_native_bf16_is_read_from_the_cpu_flags(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(FLAGS.format(extra="avx512_bf16 avx512_vnni"))
    assert cpu_has_native_bf16(cpuinfo) is True
    assert discover_cpu(cpuinfo_path=cpuinfo).native_bf16 is True
    cpuinfo.write_text(FLAGS.format(extra="amx_tile amx_bf16"))
    assert cpu_has_native_bf16(cpuinfo) is True
    cpuinfo.write_text(FLAGS.format(extra="avx512_vnni"))  # bf16 only emulated: float32 is as fast
    assert cpu_has_native_bf16(cpuinfo) is False
    assert discover_cpu(cpuinfo_path=cpuinfo).native_bf16 is False
    assert cpu_has_native_bf16(tmp_path / "missing") is False


def test_serving_dtype_per_device() -> None:
    assert default_serving_dtype(on_gpu=True, native_bf16=False)[0] == "bfloat16"
    assert default_serving_dtype(on_gpu=False, native_bf16=True)[0] == "bfloat16"
    assert default_serving_dtype(on_gpu=False, native_bf16=False)[0] == "float32"
    assert default_dtype(torch.device("cuda")) == "bfloat16"
    # the shard on this CPU follows the same rule as profile's estimate
    expected = "bfloat16" if cpu_has_native_bf16() else "float32"
    assert default_dtype(torch.device("cpu")) == expected


@pytest.mark.parametrize(("files", "limit"), [
    ({"cpu.max": "max 100000\n"}, None),  # cgroup v2, no limit
    ({"cpu.max": "400000 100000\n"}, 4),  # limits.cpu: "4"
    ({"cpu.max": "250000 100000\n"}, 2),  # 2.5 cores: two threads keep busy within it
    ({"cpu.max": "50000 100000\n"}, 1),  # half a core: still one thread
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),  # cgroup v1, no limit
    ({"cpu,cpuacct/cpu.cfs_quota_us": "300000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, 3),
    ({"cpu.max": "garbage\n"}, None),
    ({}, None),  # no cgroup filesystem
])
def test_cgroup_cpu_limit(tmp_path: Path, files: dict[str, str], limit: int | None) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_limit(tmp_path) == limit
