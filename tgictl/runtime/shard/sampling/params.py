"""Checking SamplingParams on the shard and turning them into per-row device tensors.

The router validates requests against the HTTP limits; the shard checks again what its own
arithmetic needs (a zero temperature would divide by zero, a negative top_k would index out of
range), because the gRPC contract is the only thing it may trust.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from tgictl.errors import InvalidRequestError
from tgictl.proto.messages import SamplingParams

_U64_MAX = 2**64 - 1


def needs_penalties(params: SamplingParams) -> bool:
    return (
        params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0 or params.presence_penalty != 0.0
    )


def validate(params: SamplingParams, row: int) -> None:
    """Raise InvalidRequestError naming the field and its limit."""

    def fail(field: str, limit: str) -> None:
        value = getattr(params, field)
        raise InvalidRequestError(f"sampling.{field} of request row {row} must be {limit}, got {value}")

    if not (math.isfinite(params.temperature) and params.temperature > 0.0):
        fail("temperature", "> 0")
    if params.top_k < 0:
        fail("top_k", ">= 0")
    if not 0.0 < params.top_p <= 1.0:
        fail("top_p", "in (0, 1]")
    if not 0.0 < params.typical_p <= 1.0:
        fail("typical_p", "in (0, 1]")
    if not 0.0 <= params.min_p < 1.0:
        fail("min_p", "in [0, 1)")
    if not (math.isfinite(params.repetition_penalty) and params.repetition_penalty > 0.0):
        fail("repetition_penalty", "> 0")
    if not math.isfinite(params.frequency_penalty):
        fail("frequency_penalty", "finite")
    if not math.isfinite(params.presence_penalty):
        fail("presence_penalty", "finite")
    if not 0 <= params.seed <= _U64_MAX:
        fail("seed", "a u64")


@dataclass(frozen=True, eq=False)
class RowSelection:
    """The rows of a batch one processor applies to, with that processor's parameter per row."""

    index: Tensor | None  # [R] int64 batch rows, ascending; None when every row is selected
    values: Tensor  # [R, 1] the parameter of each selected row
    host_rows: tuple[int, ...]  # the same rows on the host
    host_values: tuple[float, ...]  # the same values on the host (e.g. max top_k without a sync)


def select_rows(
    params: Sequence[SamplingParams],
    pick: Callable[[SamplingParams], float | None],
    device: torch.device,
    dtype: torch.dtype = torch.float32,
) -> RowSelection | None:
    """Rows where `pick` returns a value (None = neutral, skip), or None when there are none."""
    rows, values = [], []
    for row, p in enumerate(params):
        value = pick(p)
        if value is not None:
            rows.append(row)
            values.append(value)
    if not rows:
        return None
    index = None if len(rows) == len(params) else torch.tensor(rows, dtype=torch.int64, device=device)
    column = torch.tensor(values, dtype=dtype, device=device).unsqueeze(1)
    return RowSelection(index=index, values=column, host_rows=tuple(rows), host_values=tuple(values))
