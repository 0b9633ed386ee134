"""Tensor parallelism: the factors split as their layer is, so the ranks' deltas put together (outputs
concatenated for a column-parallel layer, partial outputs summed for a row-parallel one) are the
unsplit delta."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.lora_adapters import write_random_adapter
from tgictl.kernels.lora import group_tokens
from tgictl.runtime.shard.lora.attach import read_adapters
from tgictl.runtime.shard.lora.delta import build_delta
from tgictl.runtime.shard.model_config import ModelConfig
from tgictl.runtime.shard.weights import split_range

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list:
    root = tmp_path_factory.mktemp("split")
    dirs = [
        ("a", write_random_adapter(tiny_model_dir, root / "a", rank=4, seed=1)),
        ("b", write_random_adapter(tiny_model_dir, root / "b", rank=8, targets=("gate_proj", "down_proj"), seed=2)),
    ]
    return read_adapters(dirs, ModelConfig.from_dir(tiny_model_dir), torch.float32)


def _delta(adapters: list, parts: list, split_inputs: bool, x: torch.Tensor, out: int) -> torch.Tensor:
    delta = build_delta(adapters, 1, parts, split_inputs=split_inputs, device=CPU)
    assert delta is not None
    groups = group_tokens([0, 1, -1, 1, 0], len(adapters), CPU)
    assert groups is not None
    return delta.add_to(x, torch.zeros(x.shape[0], out), groups)


@pytest.mark.parametrize("world_size", [2, 3])
def test_column_split_concatenates_and_row_split_sums(adapters: list, world_size: int) -> None:
    inter, hidden = 128, 64
    x = torch.randn(5, hidden)
    full = _delta(adapters, [("gate_proj", 0, inter), ("up_proj", 0, inter)], False, x, 2 * inter)
    pieces = []
    for rank in range(world_size):
        start, stop = split_range(inter, rank, world_size)
        part = _delta(adapters, [("gate_proj", start, stop), ("up_proj", start, stop)], False, x, 2 * (stop - start))
        pieces.append(part.chunk(2, dim=1))
    gate = torch.cat([p[0] for p in pieces], dim=1)
    up = torch.cat([p[1] for p in pieces], dim=1)
    torch.testing.assert_close(torch.cat([gate, up], dim=1), full)

    h = torch.randn(5, inter)
    full_down = _delta(adapters, [("down_proj", 0, inter)], True, h, hidden)
    summed = torch.zeros_like(full_down)
    for rank in range(world_size):
        start, stop = split_range(inter, rank, world_size)
        summed += _delta(adapters, [("down_proj", start, stop)], True, h[:, start:stop], hidden)
    torch.testing.assert_close(summed, full_down)
    assert full_down[2].abs().sum() == 0  # the base row gets no delta
