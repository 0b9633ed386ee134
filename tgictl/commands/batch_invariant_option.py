"""The `--batch-invariant` flag that `shard` and `launch` share (kernels/batch_invariance.py)."""

from __future__ import annotations

import typer

BATCH_INVARIANT_OPTION: bool = typer.Option(
    False, "--batch-invariant",
    help="Make every row's result independent of the batch it is in (linears in fixed 32-row calls), so "
    "greedy outputs are identical alone and in any batch, in bf16 too. Costs ~1.8x the decode step at one "
    "client and ~1.6x a prompt's prefill; ~1.0x at batch 32.",
)
