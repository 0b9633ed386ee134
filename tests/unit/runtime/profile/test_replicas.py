"""`tgictl profile --replicas N`: each replica's budgets on its share of the cores, and what N replicas
hold together checked against the RAM (hardware described, not discovered, as in test_budgets)."""

from __future__ import annotations

from tests.unit.runtime.profile.test_budgets import GIB, SMOLLM2, cpu_hardware
from tgictl.runtime.profile.budgets import BudgetSettings, compute_budgets
from tgictl.runtime.profile.model_shape import model_shape
from tgictl.runtime.profile.replicas import replica_budgets, replica_hardware


def test_a_replica_sees_its_cores_and_its_share_of_the_matmul_rate() -> None:
    host = cpu_hardware(f32=1e11, bf16=2e11)
    one = replica_hardware(host, (0,))
    assert one.cpu.cores == 1 and [m.flops_per_s for m in one.cpu_matmul] == [0.25e11, 0.5e11]
    assert one.cpu.available_memory_bytes == host.cpu.available_memory_bytes  # each sizes its KV from it
    shape, settings = model_shape(SMOLLM2), BudgetSettings(dtype="float32")
    assert (compute_budgets(shape, one, settings, None).device_flops.value
            == compute_budgets(shape, host, settings, None).device_flops.value / 4)


def test_every_replica_gets_its_budgets_and_together_they_must_fit(monkeypatch: object) -> None:
    import tgictl.runtime.profile.replicas as replicas

    monkeypatch.setattr(replicas, "usable_cpus", lambda: (0, 1, 2, 3))  # type: ignore[attr-defined]
    monkeypatch.setattr(replicas, "numa_nodes", lambda: [])  # type: ignore[attr-defined]
    shape, host = model_shape(SMOLLM2), cpu_hardware()
    rows, problems = replica_budgets(shape, host, BudgetSettings(dtype="float32", kv_cache_memory_bytes=GIB),
                                     2, (), None, None)
    assert [(r["replica"], r["cpus"]) for r in rows] == [(0, "0-1"), (1, "2-3")]
    assert rows[0]["budgets"]["kv_cache_memory_bytes_per_shard"]["value"] == GIB and problems == []
    # Four replicas of 3 GiB of KV each cannot fit in 8 GiB.
    rows, problems = replica_budgets(shape, host, BudgetSettings(dtype="float32", kv_cache_memory_bytes=3 * GIB),
                                     4, (), None, None)
    assert len(rows) == 4 and len(problems) == 1 and "4 replicas hold" in problems[0]
    assert "more than the 8.0 GiB available" in problems[0]
