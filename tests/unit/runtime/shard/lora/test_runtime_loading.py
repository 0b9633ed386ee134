"""Adapters loaded and unloaded while the shard serves (LoadAdapter / UnloadAdapter): the stacks they leave
are exactly those of the same adapters attached at start-up (ranks re-padded, new slots appended), an
unloaded slot is zeros and takes another adapter, and the rows of a running batch keep their tokens, equal to
transformers + peft, while adapters come and go beside them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.lora_adapters import peft_greedy, write_random_adapter
from tests.unit.runtime.shard.shard_helpers import BlockPool, Outputs, make_request, run_to_end, step
from tgictl.proto.messages import Batch
from tgictl.runtime.shard.batch import ShardBatch
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.kv_cache import KVCache
from tgictl.runtime.shard.lora.adapter_files import LoraAdapter
from tgictl.runtime.shard.lora.attach import attach_adapters, read_adapters, set_adapter_slot
from tgictl.runtime.shard.models.registry import load_model
from tgictl.runtime.shard.step import ModelRunner

CPU = torch.device("cpu")
NEW_TOKENS = 8
PROMPTS = ([5, 17, 33, 9, 250, 71, 12], [300, 2, 2, 41])
# name -> (rank, targets)
SPECS = {"small": (4, ("q_proj", "v_proj")), "big": (16, ("o_proj", "gate_proj", "down_proj")),
         "all": (8, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))}


@pytest.fixture(scope="module")
def dirs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runtime-adapters")
    return {name: write_random_adapter(tiny_model_dir, root / name, rank=rank, targets=targets, seed=i + 20)
            for i, (name, (rank, targets)) in enumerate(SPECS.items())}


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, dirs: dict[str, Path]) -> dict[str, LoraAdapter]:
    model = load_model(tiny_model_dir, dtype=torch.float32, device=CPU, dist=DistContext.single())
    return {a.name: a for a in read_adapters(list(dirs.items()), model.config, torch.float32)}


def _model(model_dir: Path) -> nn.Module:
    return load_model(model_dir, dtype=torch.float32, device=CPU, dist=DistContext.single())


def _stacks(model: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {name: (m.lora.a.detach().clone(), m.lora.b.detach().clone())
            for name, m in model.named_modules() if getattr(m, "lora", None) is not None}


def _same(left: dict, right: dict) -> bool:
    return left.keys() == right.keys() and all(
        torch.equal(left[k][0], right[k][0]) and torch.equal(left[k][1], right[k][1]) for k in left)


def test_loading_while_serving_builds_the_start_up_stacks(tiny_model_dir: Path, adapters: dict[str, LoraAdapter]) -> None:
    at_start = _model(tiny_model_dir)
    attach_adapters(at_start, [adapters["small"], adapters["big"], adapters["all"]], CPU)
    loaded = _model(tiny_model_dir)
    attach_adapters(loaded, [adapters["small"]], CPU)
    set_adapter_slot(loaded, 2, 1, adapters["big"], CPU)  # a larger rank, linears the first left alone
    set_adapter_slot(loaded, 3, 2, adapters["all"], CPU)
    assert _same(_stacks(loaded), _stacks(at_start))
    nothing = _model(tiny_model_dir)  # no adapter at start-up either
    for slot, name in enumerate(("small", "big", "all")):
        set_adapter_slot(nothing, slot + 1, slot, adapters[name], CPU)
    assert _same(_stacks(nothing), _stacks(at_start))


def test_an_unloaded_slot_is_zeros_and_takes_another_adapter(tiny_model_dir: Path, adapters: dict[str, LoraAdapter]) -> None:
    model = _model(tiny_model_dir)
    attach_adapters(model, [adapters["small"], adapters["big"]], CPU)
    set_adapter_slot(model, 2, 0, None, CPU)
    for a, b in _stacks(model).values():
        assert not a[0].any() and not b[0].any()
    set_adapter_slot(model, 2, 0, adapters["all"], CPU)
    expected = _model(tiny_model_dir)
    attach_adapters(expected, [adapters["all"], adapters["big"]], CPU)
    assert _same(_stacks(model), _stacks(expected))


def _batch(runner: ModelRunner, batch_id: int, pool: BlockPool, rows: list[tuple[int, int, int]]) -> ShardBatch:
    requests = tuple(replace(make_request(pool, rid, PROMPTS[p], max_new_tokens=NEW_TOKENS), adapter_index=k)
                     for rid, p, k in rows)
    return ShardBatch.from_batch(Batch(id=batch_id, requests=requests), block_size=16,
                                 num_blocks=runner.kv_cache.num_blocks, vocab_size=runner.vocab_size, device=CPU,
                                 num_adapters=runner.num_adapters)


def test_rows_in_flight_keep_their_adapter_while_others_load_and_unload(
    tiny_model_dir: Path, dirs: dict[str, Path], adapters: dict[str, LoraAdapter]
) -> None:
    dist = DistContext.single()
    model = load_model(tiny_model_dir, dtype=torch.float32, device=CPU, dist=dist)
    attach_adapters(model, [adapters["small"]], CPU)
    cache = KVCache.for_model(model.config, world_size=1, num_blocks=64, block_size=16, dtype=torch.float32, device=CPU)
    runner = ModelRunner(model, cache, block_size=16, dist=dist, device=CPU, num_adapters=1)
    pool, outputs = BlockPool(), Outputs()
    batch = _batch(runner, 1, pool, [(1, 0, 1), (2, 1, 0)])  # "small" and the base model
    for _ in range(3):
        batch = step(runner, batch, outputs)
        assert batch is not None
    set_adapter_slot(model, 2, 1, adapters["big"], CPU)  # loaded between two steps of the running batch
    runner.num_adapters = 2
    batch = ShardBatch.concatenate([batch, _batch(runner, 2, pool, [(3, 0, 2)])])
    for _ in range(2):
        batch = step(runner, batch, outputs)
        assert batch is not None
    # Row 3 leaves the batch (the router unloads an adapter only once no request uses it), then "big" goes
    # and "all" takes its slot.
    set_adapter_slot(model, 2, 1, None, CPU)
    set_adapter_slot(model, 2, 1, adapters["all"], CPU)
    batch = ShardBatch.concatenate([batch.filter([1, 2]), _batch(runner, 3, pool, [(4, 1, 2)])])
    run_to_end(runner, batch, outputs)
    expect = {1: (0, dirs["small"]), 2: (1, None), 4: (1, dirs["all"])}
    for rid, (p, adapter) in expect.items():
        assert outputs.ids(rid) == peft_greedy(tiny_model_dir, adapter, PROMPTS[p], NEW_TOKENS), rid
    # Row 3 ran under "big" for two steps (its prefill's token and one more) before it left the batch.
    assert outputs.ids(3) == peft_greedy(tiny_model_dir, dirs["big"], PROMPTS[0], 2)
