"""The shard's OpenMP threads: their count within a CPU limit; which CPUs each rank's threads are bound to
(physical cores before SMT siblings, disjoint slices per rank, none when oversubscribed), the switches that leave
them unbound, and a real binding in a child process whose threads' affinity masks are read back from /proc."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tgictl.env import Env
from tgictl.runtime.shard.cpu_threads import (
    bind_compute_threads,
    binding_cpus,
    core_ids,
    cores_first,
    physical_cores,
    threads_within_limit,
)


@pytest.mark.parametrize(("threads", "limit", "world", "expected"), [
    (64, None, 1, 64),  # no limit: torch's count stands
    (64, 4, 1, 4),  # a 4-core pod on a 64-core node
    (64, 4, 2, 2),  # two ranks share the limit
    (2, 4, 1, 2),  # never more threads than asked
    (8, 1, 4, 1),  # at least one
])
def test_threads_within_limit(threads: int, limit: int | None, world: int, expected: int) -> None:
    assert threads_within_limit(threads, limit, world) == expected


def _topology(root: Path, cpu: int, package: int, core: int) -> None:
    topology = root / f"cpu{cpu}" / "topology"
    topology.mkdir(parents=True)
    (topology / "physical_package_id").write_text(f"{package}\n")
    (topology / "core_id").write_text(f"{core}\n")


def test_core_ids_read_sysfs_and_skip_unreadable_cpus(tmp_path: Path) -> None:
    _topology(tmp_path, 0, 0, 0)
    _topology(tmp_path, 1, 0, 4)
    (tmp_path / "cpu2" / "topology").mkdir(parents=True)  # no files: a CPU whose topology is unknown
    assert core_ids([0, 1, 2], tmp_path) == {0: (0, 0), 1: (0, 4)}


def test_cores_first_puts_smt_siblings_last() -> None:
    # Siblings adjacent (0,1 one core; 2,3 another), as some hosts number them.
    adjacent = {0: (0, 0), 1: (0, 0), 2: (0, 1), 3: (0, 1)}
    assert cores_first([3, 2, 1, 0], adjacent) == (0, 2, 1, 3)
    # Siblings a half apart (0,2 one core; 1,3 another), Linux's usual numbering; two packages with equal core ids.
    split = {0: (0, 0), 1: (1, 0), 2: (0, 0), 3: (1, 0)}
    assert cores_first([0, 1, 2, 3], split) == (0, 1, 2, 3)
    # A CPU without topology counts as a core of its own.
    assert cores_first([5, 6], {5: (0, 0)}) == (5, 6)


def test_physical_cores_count_siblings_once() -> None:
    assert physical_cores([0, 1, 2, 3], {0: (0, 0), 1: (0, 0), 2: (0, 1), 3: (0, 1)}) == 2
    assert physical_cores([0, 1, 2], {0: (0, 0), 1: (1, 0)}) == 3  # packages differ; cpu2 unknown: its own core


# Four CPUs in cores_first's order 0,2,1,3 (0 and 2 one per physical core, 1 and 3 their SMT siblings): 2 cores.
@pytest.mark.parametrize(("threads", "rank", "world", "expected"), [
    (2, 0, 1, (0, 2)),
    (1, 0, 2, (0,)),
    (1, 1, 2, (2,)),
    (2, 1, 2, (1, 3)),  # the second rank takes the siblings once the cores are shared out
    (4, 0, 1, (0, 2, 1, 3)),
    (3, 0, 2, None),  # 6 threads on 4 CPUs: they would share cores anyway
    (5, 0, 1, None),
    (0, 0, 1, None),
    (1, 0, 1, None),  # one thread, two cores: the cores are shared with work this process cannot see
])
def test_binding_cpus_gives_each_rank_its_own_slice(threads: int, rank: int, world: int,
                                                   expected: tuple[int, ...] | None) -> None:
    assert binding_cpus((0, 2, 1, 3), 2, threads, rank, world) == expected


@pytest.mark.parametrize(("threads", "world", "bound"), [
    (4, 1, False),  # OMP_NUM_THREADS=4 (or a 4-core CFS quota) on 16 cores: another server may be told the same
    (16, 1, True),
    (5, 3, True),  # tensor parallel: 16 cores // 3 ranks, one core left over
    (4, 3, False),
])
def test_fewer_threads_than_cores_stay_unbound(threads: int, world: int, bound: bool) -> None:
    assert (binding_cpus(tuple(range(16)), 16, threads, 0, world) is not None) is bound


@pytest.mark.parametrize("environ", [{"TGICTL_BIND_THREADS": "0"}, {"OMP_PROC_BIND": "close"},
                                     {"GOMP_CPU_AFFINITY": "0-1"}, {"OMP_PLACES": "cores"}])
def test_the_switch_and_a_users_placement_leave_threads_unbound(environ: dict[str, str]) -> None:
    assert bind_compute_threads(Env.from_environ({"HOME": "/h", **environ}), 0, 1) is None


_CHILD = """
import json, os, threading
import torch
from tgictl.env import read_env
from tgictl.runtime.shard.cpu_threads import bind_compute_threads
result = {}
def device_thread():  # the shard binds from its device thread; the process's other threads stay free
    result["cpus"] = bind_compute_threads(read_env(), 0, 1)
    x = torch.randn(256, 256)
    (x @ x).sum()  # a region of the bound team: its threads exist now
    result["device"] = sorted(os.sched_getaffinity(0))
    # Read while this thread lives: libgomp ends its team's pool threads when it exits.
    result["threads"] = [sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")]
thread = threading.Thread(target=device_thread)
thread.start()
thread.join()
result["main"] = sorted(os.sched_getaffinity(0))
print(json.dumps(result))
"""


def test_a_real_binding_pins_the_team_and_nothing_else() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    threads = physical_cores(allowed, core_ids(allowed))  # one per core: the count that gets bound
    environ = {k: v for k, v in os.environ.items() if k not in ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY",
                                                                 "TGICTL_BIND_THREADS")}
    out = subprocess.run([sys.executable, "-c", _CHILD], env={**environ, "OMP_NUM_THREADS": str(threads)},
                         capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    cpus = result["cpus"]
    assert cpus is not None and len(cpus) == threads and len(set(cpus)) == threads
    assert set(cpus) <= set(allowed)
    assert result["device"] == [cpus[0]]  # the master: the thread that bound its team
    assert result["main"] == allowed  # the main thread (the shard's event loop) is left alone
    for cpu in cpus:  # each of the team's threads on its own CPU
        assert [cpu] in result["threads"]
