"""Batch-invariant matmuls (`--batch-invariant`): a row's result does not depend on the other rows.

Why it is needed: the matmul libraries pick their kernels, blockings and reduction orders by the row
count, so the same token computed in a batch of 1, 9 or 40 rows can differ in its last bits (measured
on this project's CPUs: oneDNN's bf16 LM-head product changes at 33 rows, tail rows of 9 or 34 take
other kernels, and tgictl's own matrix-vector kernel runs up to 2 rows); in bf16 one ulp of a logit
is enough to flip a greedy choice, and the texts diverge from there. Within a call of a fixed row
count, though, every row is computed alike wherever it sits (tested).

So in this mode every linear runs in calls of exactly BLOCK_ROWS rows, the last one padded with
zeros: the kernel is the same for every batch, and so is each row's result. The cost (measured in
docs/commands.md, "Batch invariance"; scripts/perf_decode.py --compare-batch-invariant): 1.76x the decode step at one client
(32 rows computed for 1, and no matrix-vector kernel), ~1.6x a prompt's prefill (32-row calls
instead of one), 1.02x at a batch of 32. Hence a flag, not the default. The rest of a step is per row already: the norms, rotary and
SiLU kernels, decode attention (one task per sequence and KV head), the greedy choice and seeded
sampling. Not covered: a prompt longer than the prefill budget is split where the budget ends, which
depends on the batch, and a prefix-cache hit changes where a prompt's computation starts.

A process-wide switch, set once when a shard starts (like torch.use_deterministic_algorithms).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

# A multiple of the AMX tile (16 rows) and the decode batch size where the blocking costs nothing.
BLOCK_ROWS = 32

_enabled = False


def enable_batch_invariance(enabled: bool) -> None:
    global _enabled
    _enabled = enabled


def batch_invariant() -> bool:
    return _enabled


def in_row_blocks(matmul: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """matmul(x) [rows, ...] computed BLOCK_ROWS rows per call, the last block zero-padded."""
    rows = x.shape[0]
    if rows == BLOCK_ROWS:
        return matmul(x)
    padded = -(-rows // BLOCK_ROWS) * BLOCK_ROWS
    if padded != rows:
        x = torch.cat([x, x.new_zeros(padded - rows, *x.shape[1:])])
    blocks = [matmul(x[start : start + BLOCK_ROWS]) for start in range(0, padded, BLOCK_ROWS)]
    out = blocks[0] if len(blocks) == 1 else torch.cat(blocks)
    return out[:rows]
