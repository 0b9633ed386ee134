"""Which cores each replica gets: the cpulist syntax, NUMA nodes first, even runs otherwise, and the
user's --replica-cpus checked with errors that name the flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from tgictl.errors import ConfigError
from tgictl.runtime.launcher.replica_cpus import format_cpu_list, numa_nodes, parse_cpu_list, plan_replica_cpus


def test_cpu_lists_round_trip() -> None:
    assert parse_cpu_list("0-3,8, 10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert format_cpu_list((11, 0, 1, 2, 3, 8, 10)) == "0-3,8,10-11"
    for bad in ("", "a-b", "3-1", "1,,2"):
        with pytest.raises(ConfigError, match="--replica-cpus"):
            parse_cpu_list(bad)


def test_one_numa_node_per_replica_when_the_counts_match() -> None:
    nodes = [tuple(range(0, 8)), tuple(range(8, 16))]
    assert plan_replica_cpus(2, range(16), nodes) == (tuple(range(8)), tuple(range(8, 16)))
    # Four replicas on two nodes: two runs per node, none straddling the nodes.
    assert plan_replica_cpus(4, range(16), nodes) == ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15))


def test_even_runs_of_the_usable_cores_otherwise() -> None:
    assert plan_replica_cpus(2, (0, 1), [(0, 1)]) == ((0,), (1,))
    assert plan_replica_cpus(3, range(8), []) == ((0, 1, 2), (3, 4, 5), (6, 7))
    # Three replicas on two nodes cannot be a node each: the usable cores in order.
    assert plan_replica_cpus(3, range(6), [(0, 1, 2), (3, 4, 5)]) == ((0, 1), (2, 3), (4, 5))
    # Only the cores this process may use count (a container's or taskset's mask).
    assert plan_replica_cpus(2, (2, 3, 6, 7), [(0, 1, 2, 3), (4, 5, 6, 7)]) == ((2, 3), (6, 7))
    with pytest.raises(ConfigError, match="--replicas 3 needs a core per replica; 2 are usable"):
        plan_replica_cpus(3, (0, 1), [])


def test_chosen_sets_are_checked_against_the_host_and_each_other() -> None:
    assert plan_replica_cpus(2, range(4), [], ("0-1", "2,3")) == ((0, 1), (2, 3))
    with pytest.raises(ConfigError, match="given 1 times for --replicas 2"):
        plan_replica_cpus(2, range(4), [], ("0-1",))
    with pytest.raises(ConfigError, match="--replica-cpus 2-5: cores 4-5 are not usable here"):
        plan_replica_cpus(2, range(4), [], ("0-1", "2-5"))
    with pytest.raises(ConfigError, match="--replica-cpus 1-2: cores 1 are given to another replica too"):
        plan_replica_cpus(2, range(4), [], ("0-1", "1-2"))


def test_numa_nodes_are_read_from_sysfs(tmp_path: Path) -> None:
    for node, cpus in ((1, "4-7"), (0, "0-3"), (10, "")):
        (tmp_path / f"node{node}").mkdir()
        (tmp_path / f"node{node}" / "cpulist").write_text(cpus + "\n")
    assert numa_nodes(tmp_path) == [(0, 1, 2, 3), (4, 5, 6, 7)]  # node order; a node without cores left out
    assert numa_nodes(tmp_path / "missing") == []
