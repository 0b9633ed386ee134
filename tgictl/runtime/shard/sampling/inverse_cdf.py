"""Inverse-CDF sampling: turn one uniform number per row into a token id.

The token drawn is the first whose cumulative probability exceeds u * total. A float64 cumsum over
the whole vocabulary is the slow part on CPU (a sequential scan after a float32 -> float64 copy:
~10x a softmax at [32, 49152]), so the search is two-level: vectorised float32 sums of blocks of
BLOCK tokens, a float64 cumsum over the blocks to find the block, then a float64 cumsum inside that
one block. Each block sum errs by ~1e-7 of the block's own mass, so no token's probability is
distorted by more than that relative amount.

Zero-probability tokens are never drawn: a strict ">" search skips them, and when rounding puts the
target at (or past) the end of the cumulative sum the result is clamped to the last token that
carries mass rather than to the end of the vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

BLOCK = 256


def _last_with_mass(cumulative: Tensor) -> Tensor:
    """[R, 1] index of the first entry reaching the row's total: the last one carrying mass."""
    return torch.searchsorted(cumulative, cumulative[:, -1:].contiguous(), right=False)


def draw(probs: Tensor, uniform: Tensor) -> Tensor:
    """probs: [R, V] float32 rows summing to ~1 (zeros allowed); uniform: [R] float64 in [0, 1).
    Returns [R] int64 token ids."""
    rows, vocab = probs.shape
    blocks = -(-vocab // BLOCK)
    if blocks * BLOCK != vocab:
        probs = F.pad(probs, (0, blocks * BLOCK - vocab))  # zeros: never drawn
    grid = probs.view(rows, blocks, BLOCK)
    block_cumulative = grid.sum(dim=-1).to(torch.float64).cumsum(dim=-1)  # [R, blocks]
    target = uniform.unsqueeze(1) * block_cumulative[:, -1:]  # [R, 1] in [0, total]
    block = torch.minimum(
        torch.searchsorted(block_cumulative, target, right=True), _last_with_mass(block_cumulative)
    )  # [R, 1]
    before = torch.where(
        block > 0, block_cumulative.gather(1, (block - 1).clamp(min=0)), torch.zeros_like(target)
    )  # [R, 1] mass of the blocks before
    block_mass = block_cumulative.gather(1, block) - before  # [R, 1] > 0 unless the row is all zero
    inner = grid[torch.arange(rows, device=probs.device), block.squeeze(1)]  # [R, BLOCK]
    inner_cumulative = inner.to(torch.float64).cumsum(dim=-1)
    # The remainder as a fraction of the block, rescaled to the block's own float64 sum, so the
    # two levels' different roundings cannot push it past the block's end.
    fraction = ((target - before) / block_mass).nan_to_num(0.0).clamp(0.0, 1.0)
    offset = torch.minimum(
        torch.searchsorted(inner_cumulative, fraction * inner_cumulative[:, -1:], right=True),
        _last_with_mass(inner_cumulative),
    )  # [R, 1]
    return (block * BLOCK + offset).squeeze(1).clamp(max=vocab - 1)
