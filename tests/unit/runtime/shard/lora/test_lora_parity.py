"""Each row's greedy tokens equal transformers + peft on the same weights (float32), with adapters of
different ranks, targets and scalings and the base model mixed in one batch: prefilled together, and
joining a running batch (prefill chunks beside decode rows)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.lora_adapters import ALL_PROJECTIONS, peft_greedy, write_random_adapter
from tests.unit.runtime.shard.shard_helpers import BlockPool, Outputs, make_request, run_to_end, step
from tgictl.proto.messages import Batch
from tgictl.runtime.shard.batch import ShardBatch
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.kv_cache import KVCache
from tgictl.runtime.shard.lora.attach import attach_adapters, read_adapters
from tgictl.runtime.shard.models.registry import load_model
from tgictl.runtime.shard.step import ModelRunner

CPU = torch.device("cpu")
NEW_TOKENS = 10
# name -> (rank, alpha, targets, rsLoRA)
ADAPTERS = {
    "all7": (8, 16.0, ALL_PROJECTIONS, False),
    "qv-down-rs": (4, 8.0, ("q_proj", "v_proj", "down_proj"), True),
    "o-mlp": (16, 8.0, ("o_proj", "gate_proj", "up_proj"), False),
}
PROMPTS = ([5, 17, 33, 9, 250, 71, 12], [300, 2, 2, 41], [7] * 19 + [99], [64, 65, 66, 67, 68, 69], [128, 3])


@pytest.fixture(scope="module")
def adapter_dirs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        name: write_random_adapter(
            tiny_model_dir, root / name, rank=rank, alpha=alpha, targets=targets, use_rslora=rs, seed=i
        )
        for i, (name, (rank, alpha, targets, rs)) in enumerate(ADAPTERS.items())
    }


@pytest.fixture(scope="module")
def runner(tiny_model_dir: Path, adapter_dirs: dict[str, Path]) -> ModelRunner:
    dist = DistContext.single()
    model = load_model(tiny_model_dir, dtype=torch.float32, device=CPU, dist=dist)
    attach_adapters(model, read_adapters(list(adapter_dirs.items()), model.config, torch.float32), CPU)
    cache = KVCache.for_model(model.config, world_size=1, num_blocks=64, block_size=16, dtype=torch.float32, device=CPU)
    return ModelRunner(model, cache, block_size=16, dist=dist, device=CPU, num_adapters=len(adapter_dirs))


# (prompt, adapter_index): every adapter and the base model, one adapter twice
ROWS = [(0, 1), (1, 0), (2, 2), (3, 3), (4, 1), (0, 0), (0, 3)]


@pytest.fixture(scope="module")
def expected(tiny_model_dir: Path, adapter_dirs: dict[str, Path]) -> dict[tuple[int, int], list[int]]:
    dirs = [None, *adapter_dirs.values()]
    return {(p, k): peft_greedy(tiny_model_dir, dirs[k], PROMPTS[p], NEW_TOKENS) for p, k in set(ROWS)}


def _batch(runner: ModelRunner, batch_id: int, pool: BlockPool, rows: list[tuple[int, int, int]]) -> ShardBatch:
    requests = tuple(
        _with_adapter(make_request(pool, rid, PROMPTS[p], max_new_tokens=NEW_TOKENS), k) for rid, p, k in rows
    )
    return ShardBatch.from_batch(
        Batch(id=batch_id, requests=requests), block_size=16, num_blocks=runner.kv_cache.num_blocks,
        vocab_size=runner.vocab_size, device=CPU, num_adapters=runner.num_adapters,
    )


def _with_adapter(request, adapter_index: int):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    return replace(request, adapter_index=adapter_index)


def test_the_adapters_change_the_output(expected: dict[tuple[int, int], list[int]]) -> None:
    # Otherwise the parity below would hold for a shard that ignores adapters.
    assert len({tuple(expected[(0, k)]) for k in (0, 1, 3)}) == 3


def test_mixed_batch_matches_peft_row_by_row(runner: ModelRunner, expected: dict) -> None:
    outputs = Outputs()
    rows = [(rid, p, k) for rid, (p, k) in enumerate(ROWS)]
    run_to_end(runner, _batch(runner, 1, BlockPool(), rows), outputs)
    for rid, p, k in rows:
        assert outputs.ids(rid) == expected[(p, k)], f"row {rid}: prompt {p}, adapter {k}"


def test_rows_joining_a_running_batch_match_peft(runner: ModelRunner, expected: dict) -> None:
    pool, outputs = BlockPool(), Outputs()
    first = [(10, 2, 2), (11, 1, 0)]
    later = [(12, 0, 1), (13, 3, 3), (14, 4, 1), (15, 0, 0)]
    batch = _batch(runner, 2, pool, first)
    for _ in range(3):
        batch = step(runner, batch, outputs)
        assert batch is not None
    batch = ShardBatch.concatenate([batch, _batch(runner, 3, pool, later)])
    run_to_end(runner, batch, outputs)
    for rid, p, k in first + later:
        assert outputs.ids(rid) == expected[(p, k)], f"row {rid}: prompt {p}, adapter {k}"
