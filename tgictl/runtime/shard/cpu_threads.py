"""The shard's OpenMP threads: no more than its CPU limit allows, each on a core of its own, so that a shared
machine slows the shard, not stops it.

How many: OMP_NUM_THREADS where set (the launcher sets it for tensor-parallel shards), else torch's default
(the machine's cores) capped by the cgroup CPU limit (host.cgroup_cpu_limit: a Kubernetes pod's `limits.cpu`):
threads beyond the quota burn it spinning at barriers, and then every thread of the pod stalls until the next
period.

Why bound: a decode step is hundreds of OpenMP parallel regions (torch's ops and the C kernels), each ending
in a barrier where a thread that finished spins (libgomp: ~300,000 spins, a few milliseconds) for the others.
Left to the scheduler, the shard's threads share the cores with whatever else runs. When another process takes
a core, a spinning thread holds the core the late thread could run on, and every region waits about a
scheduler time slice: SmolLM2-135M on 2 cores, one client, with one busy-looping process beside it decoded 2.3
tok/s against 67 quiet (docs/benchmarks.md, "Sharing the cores"). With one thread bound per core, the other
process shares one core with one thread, which still runs about half the time: 28.7 against 71, the share vLLM
CPU keeps with its own binding (VLLM_CPU_OMP_THREADS_BIND). OMP_WAIT_POLICY=passive (sleep, never spin) kept
53 tok/s loaded but served 52 quiet instead of 77, as every region then wakes a sleeping thread; a shorter spin
alone (GOMP_SPINCOUNT=10000, unbound) lost on both sides (64 quiet, 10 loaded). Bound, a spin of 30,000 keeps the
quiet speed and most of the rate when every core is shared (env.SHARD_SPIN_COUNT, which the shard sets before
torch loads libgomp).

How: one parallel region of the device thread (csrc/thread_binding.c) in which thread i pins itself to the
i-th CPU of this rank's share; libgomp keeps the same pool threads for every later region of that thread, and
only the compute threads are bound (the event loop and gRPC's threads still run anywhere). The share is one CPU
per physical core first (SMT siblings last), and each rank of a tensor-parallel group on one host takes its own
slice. No binding where the threads outnumber the CPUs (they would share cores anyway), nor where they are
fewer than the cores this process may run on: then the cores are shared with work it cannot see (a CFS quota on a
wider cpuset, several servers on one host each told OMP_NUM_THREADS), and binding every such process to the first
cores would stack them there while the rest idle. Nor where the user placed the threads (OMP_PROC_BIND,
OMP_PLACES, GOMP_CPU_AFFINITY), with TGICTL_BIND_THREADS=0, or without the compiled kernels.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from tgictl.env import Env
from tgictl.kernels.native import load_native_kernels
from tgictl.runtime.host import cgroup_cpu_limit

log = logging.getLogger("tgictl.shard")

_SYSFS_CPUS = Path("/sys/devices/system/cpu")


def core_ids(cpus: Sequence[int], sysfs: Path = _SYSFS_CPUS) -> dict[int, tuple[int, int]]:
    """Each CPU's physical core as (package, core) from sysfs; CPUs whose topology is unreadable are left out."""
    cores = {}
    for cpu in cpus:
        topology = sysfs / f"cpu{cpu}" / "topology"
        try:
            cores[cpu] = (int((topology / "physical_package_id").read_text()), int((topology / "core_id").read_text()))
        except (OSError, ValueError):
            continue
    return cores


def cores_first(cpus: Sequence[int], cores: Mapping[int, tuple[int, int]]) -> tuple[int, ...]:
    """`cpus` in ascending order with one CPU per physical core first, then the SMT siblings: threads bound in
    this order get a core each before any two share one. A CPU of unknown core counts as a core of its own."""
    first: list[int] = []
    siblings: list[int] = []
    seen: set[tuple[int, int]] = set()
    for cpu in sorted(cpus):
        core = cores.get(cpu)
        if core is not None and core in seen:
            siblings.append(cpu)
            continue
        if core is not None:
            seen.add(core)
        first.append(cpu)
    return (*first, *siblings)


def physical_cores(cpus: Sequence[int], cores: Mapping[int, tuple[int, int]]) -> int:
    """How many physical cores `cpus` span (a CPU of unknown core counts as a core of its own)."""
    return len({cores.get(cpu, (-1, -1 - cpu)) for cpu in cpus})


def binding_cpus(ordered: Sequence[int], core_count: int, threads: int, rank: int,
                 world_size: int) -> tuple[int, ...] | None:
    """The CPUs (one per thread) of rank `rank`'s `threads` threads, from `ordered` (cores_first's order, spanning
    `core_count` physical cores), the ranks of one host taking consecutive slices. None where the ranks' threads
    outnumber the CPUs, or where a rank's threads are fewer than its share of the cores (the module says why)."""
    if threads < 1 or world_size < 1 or threads * world_size > len(ordered) or threads < core_count // world_size:
        return None
    start = (rank % world_size) * threads
    return tuple(ordered[start:start + threads])


def threads_within_limit(threads: int, limit: int | None, world_size: int) -> int:
    """Threads per rank: `threads`, but no more than the ranks' share of a CPU limit of `limit` cores."""
    return threads if limit is None else max(1, min(threads, limit // max(1, world_size)))


def configure_cpu_threads(env: Env, rank: int, world_size: int) -> tuple[int, ...] | None:
    """Fit the thread count to the CPU limit (unless OMP_NUM_THREADS says otherwise), then bind the threads;
    call it on the device thread before loading. Returns the CPUs bound (bind_compute_threads)."""
    if env.omp_num_threads is None:
        threads = threads_within_limit(torch.get_num_threads(), cgroup_cpu_limit(), world_size)
        if threads != torch.get_num_threads():
            log.info("rank %d: %d OpenMP thread(s), within the cgroup's CPU limit", rank, threads)
            torch.set_num_threads(threads)
    return bind_compute_threads(env, rank, world_size)


def bind_compute_threads(env: Env, rank: int, world_size: int) -> tuple[int, ...] | None:
    """Bind this thread's OpenMP team (call it on the device thread, before loading); the CPUs bound, or None
    where the threads stay unbound (the module's docstring says when)."""
    if not env.bind_threads or env.user_thread_affinity:
        return None
    native = load_native_kernels()
    if native is None:
        return None
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return None
    threads = torch.get_num_threads()
    cores = core_ids(allowed)
    core_count = physical_cores(allowed, cores)
    cpus = binding_cpus(cores_first(allowed, cores), core_count, threads, rank, world_size)
    if cpus is None:
        log.info("OpenMP threads left unbound: %d thread(s) per rank for %d rank(s) on %d CPU(s) of %d core(s)",
                 threads, world_size, len(allowed), core_count)
        return None
    bind = native.library.tgictl_bind_omp_threads
    bind.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    bind.restype = ctypes.c_int
    failed = bind((ctypes.c_int * len(cpus))(*cpus), len(cpus))
    if failed != 0:
        log.warning("could not bind every OpenMP thread to CPUs %s (%s)", cpus,
                    "the team came out smaller: none bound" if failed < 0 else f"{failed} refused")
        return None
    log.info("rank %d: %d OpenMP thread(s) bound to CPU(s) %s", rank, threads, ",".join(map(str, cpus)))
    return cpus
