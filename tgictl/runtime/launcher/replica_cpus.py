"""Which cores each replica of `tgictl launch --replicas N` runs on (docs/replicas.md, "Cores").

A replica's shards and router are pinned to its own cores: replicas then never take each other's
cores mid-step (an OpenMP barrier waits for its slowest thread), and on a multi-socket host each stays
on one NUMA node's memory, which is why N replicas behind a gateway usually beat tensor parallelism
across sockets. The rule, from the cores this process may use (its affinity mask):

- `--replica-cpus` given: exactly those sets (one per replica, Linux cpulist syntax, no overlap).
- as many NUMA nodes (with usable cores) as replicas: one node each;
- otherwise: the usable cores in order, cut into N runs as even as possible, each run kept inside one
  node where the counts allow (runs are cut per node when N is a multiple of the node count).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from tgictl.errors import ConfigError

NODE_ROOT = Path("/sys/devices/system/node")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_cpu_list(text: str, flag: str = "--replica-cpus") -> tuple[int, ...]:
    """`0-3,8,10-11` -> (0, 1, 2, 3, 8, 10, 11): Linux's cpulist syntax, sorted, no duplicates."""
    cpus: set[int] = set()
    for part in text.replace(" ", "").split(","):
        match = _RANGE.match(part)
        if match is None:
            raise ConfigError(f"{flag} {text!r}: expected core lists such as 0-3 or 0,2,4-5")
        low, high = int(match.group(1)), int(match.group(2) or match.group(1))
        if high < low:
            raise ConfigError(f"{flag} {text!r}: range {part} runs backwards")
        cpus.update(range(low, high + 1))
    return tuple(sorted(cpus))


def format_cpu_list(cpus: Sequence[int]) -> str:
    """(0, 1, 2, 3, 8) -> "0-3,8"."""
    runs: list[str] = []
    ordered = sorted(cpus)
    start = prev = ordered[0] if ordered else 0
    for cpu in [*ordered[1:], None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(runs) if ordered else ""


def usable_cpus() -> tuple[int, ...]:
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux: no affinity, no pinning
        return tuple(range(os.cpu_count() or 1))


def numa_nodes(root: Path = NODE_ROOT) -> list[tuple[int, ...]]:
    """Each NUMA node's cores (sysfs), in node order; [] where the kernel does not say."""
    nodes = []
    for path in sorted(root.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        try:
            text = (path / "cpulist").read_text().strip()
        except OSError:
            continue
        if text:
            nodes.append(parse_cpu_list(text, flag=str(path / "cpulist")))
    return nodes


def _split(cpus: Sequence[int], parts: int) -> list[tuple[int, ...]]:
    base, extra = divmod(len(cpus), parts)
    out, start = [], 0
    for index in range(parts):
        size = base + (1 if index < extra else 0)
        out.append(tuple(cpus[start : start + size]))
        start += size
    return out


def plan_replica_cpus(
    replicas: int, usable: Sequence[int], nodes: Sequence[Sequence[int]], chosen: Sequence[str] = (),
) -> tuple[tuple[int, ...], ...]:
    """One core set per replica (see the module docstring); ConfigError names the flag when it cannot."""
    if chosen:
        if len(chosen) != replicas:
            raise ConfigError(f"--replica-cpus is given {len(chosen)} times for --replicas {replicas}: "
                              "give one core list per replica")
        sets = tuple(parse_cpu_list(text) for text in chosen)
        allowed = set(usable)
        for text, cpus in zip(chosen, sets):
            outside = sorted(set(cpus) - allowed)
            if outside:
                raise ConfigError(f"--replica-cpus {text}: cores {format_cpu_list(outside)} are not usable here "
                                  f"(usable: {format_cpu_list(usable)})")
        seen: set[int] = set()
        for text, cpus in zip(chosen, sets):
            if seen & set(cpus):
                raise ConfigError(f"--replica-cpus {text}: cores {format_cpu_list(sorted(seen & set(cpus)))} "
                                  "are given to another replica too")
            seen |= set(cpus)
        return sets
    if replicas > len(usable):
        raise ConfigError(f"--replicas {replicas} needs a core per replica; {len(usable)} are usable here")
    allowed = set(usable)
    live_nodes = [tuple(c for c in node if c in allowed) for node in nodes]
    live_nodes = [node for node in live_nodes if node]
    if len(live_nodes) > 1 and replicas % len(live_nodes) == 0:
        per_node = replicas // len(live_nodes)
        if all(len(node) >= per_node for node in live_nodes):
            return tuple(part for node in live_nodes for part in _split(node, per_node))
    return tuple(_split(list(usable), replicas))
