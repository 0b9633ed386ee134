"""`tgictl profile --replicas N`: the budgets each replica of `tgictl launch --replicas N` gets. A replica
runs on its own cores (runtime/launcher/replica_cpus.py plans them exactly as the launcher does), so its
compute figures are its share of the host's (the measured matmul rate scaled by its share of the
cores); memory is not split, because every replica's shards size their KV cache from what is available
when they start, as one replica's do. What N replicas hold together is checked against the RAM."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tgictl.runtime.launcher.replica_cpus import format_cpu_list, numa_nodes, plan_replica_cpus, usable_cpus
from tgictl.runtime.profile.budgets import Budgets, BudgetSettings, compute_budgets
from tgictl.runtime.profile.model_shape import ModelShape
from tgictl.runtime.profile.hardware import Hardware


def replica_hardware(hardware: Hardware, cpus: Sequence[int]) -> Hardware:
    """The host as one replica pinned to `cpus` sees it."""
    share = len(cpus) / max(hardware.cpu.cores, 1)
    return replace(
        hardware,
        cpu=replace(hardware.cpu, cores=len(cpus)),
        cpu_matmul=tuple(replace(m, flops_per_s=m.flops_per_s * share) for m in hardware.cpu_matmul),
    )


def replica_budgets(
    shape: ModelShape, hardware: Hardware, settings: BudgetSettings, replicas: int, chosen: Sequence[str],
    tokenizer_max_length: int | None, gguf_bytes: int | None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """[{"replica", "cpus", "budgets"}] per replica, and the problems of all of them together."""
    sets = plan_replica_cpus(replicas, usable_cpus(), numa_nodes(), chosen)
    rows, problems = [], []
    held = 0
    for index, cpus in enumerate(sets):
        budgets: Budgets = compute_budgets(shape, replica_hardware(hardware, cpus), settings, tokenizer_max_length,
                                           gguf_bytes)
        rows.append({"replica": index, "cpus": format_cpu_list(cpus), "budgets": budgets.to_dict()})
        per_shard = int(budgets.weight_bytes_per_shard.value or 0) + int(budgets.kv_cache_memory_bytes_per_shard.value or 0)  # type: ignore[arg-type]
        held += per_shard * settings.num_shard
        problems += [f"replica {index}: {p}" for p in budgets.problems]
    available = hardware.cpu.available_memory_bytes
    if not hardware.gpus and held > available:
        problems.append(f"{replicas} replicas hold {held / 2**30:.1f} GiB of weights and KV cache together, more "
                        f"than the {available / 2**30:.1f} GiB available: give --kv-cache-memory")
    return rows, problems
