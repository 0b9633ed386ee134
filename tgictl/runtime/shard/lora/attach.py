"""Load the adapters a shard serves and give every linear they target its LoRA delta.

The linears say which projections and which rows or columns of them this rank holds (layers/linear.py),
so the factors are split exactly as the base weights were (docs/architecture.md, "Multi-LoRA").
Adapter slot k (0-based, the order of --lora-adapters) is the wire's adapter_index k + 1.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import nn

from tgictl.runtime.shard.layers.linear import ColumnParallelLinear, RowParallelLinear
from tgictl.runtime.shard.lora.adapter_files import LoraAdapter, read_adapter
from tgictl.runtime.shard.lora.delta import ProjectionPart, build_delta, factor_dtype, update_delta
from tgictl.runtime.shard.model_config import ModelConfig

log = logging.getLogger(__name__)

_PREFIX = re.compile(r"^model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)$")


def read_adapters(
    sources: Sequence[tuple[str, Path]], base: ModelConfig, dtype: torch.dtype, device: torch.device = torch.device("cpu")
) -> list[LoraAdapter]:
    """Every (name, directory), read and checked; the first problem is a ConfigError. `dtype` and
    `device`: the model's (the factors are kept in factor_dtype of them)."""
    return [read_adapter(name, Path(path), base, factor_dtype(dtype, device)) for name, path in sources]


def _parts(prefixed: Sequence[tuple[str, int, int]]) -> tuple[int, list[ProjectionPart]] | None:
    """(layer, [(projection, first, stop)]) of a linear's recorded ranges; None for other linears."""
    layers, parts = set(), []
    for prefix, start, stop in prefixed:
        match = _PREFIX.match(prefix)
        if match is None:
            return None
        layers.add(int(match[1]))
        parts.append((match[2], start, stop))
    return (layers.pop(), parts) if len(layers) == 1 else None


def _lora_linears(model: nn.Module) -> Iterator[tuple[ColumnParallelLinear | RowParallelLinear, int, list[ProjectionPart], bool]]:
    """Every linear LoRA may target: (module, layer, its parts, whether its inputs are split)."""
    for module in model.modules():
        if isinstance(module, ColumnParallelLinear):
            found, split_inputs = _parts(module.parts), False
        elif isinstance(module, RowParallelLinear) and module.columns is not None:
            found, split_inputs = _parts([module.columns]), True
        else:
            continue
        if found is not None:
            yield module, found[0], found[1], split_inputs


def attach_adapters(model: nn.Module, adapters: Sequence[LoraAdapter], device: torch.device) -> int:
    """Give the model's targeted linears their deltas; returns the bytes the deltas hold."""
    total = 0
    for module, layer, parts, split_inputs in _lora_linears(model):
        delta = build_delta(adapters, layer, parts, split_inputs=split_inputs, device=device)
        if delta is not None:
            module.lora = delta
            total += delta.num_bytes
    if adapters:
        log.info(
            "LoRA adapters %s: %.1f MiB of factors as stored, %.1f MiB stacked on this rank",
            ", ".join(a.name for a in adapters), sum(a.num_bytes for a in adapters) / 2**20, total / 2**20,
        )
    return total


def set_adapter_slot(
    model: nn.Module, slots: int, slot: int, adapter: LoraAdapter | None, device: torch.device
) -> int:
    """Put `adapter` in slot `slot` (0-based; None empties it) of every linear, whose stacks become `slots`
    deep (an adapter loaded while serving: runtime.py). Returns the bytes every delta then holds."""
    total = 0
    for module, layer, parts, split_inputs in _lora_linears(model):
        delta = update_delta(module.lora, slots, slot, adapter, layer, parts, split_inputs=split_inputs, device=device)
        if delta is not None:
            module.lora = delta
            total += delta.num_bytes
    return total
