"""Verifying drafts in the forward that computes them (docs/architecture.md, "Speculative decoding").

A row with k drafts scores k + 1 positions. Position i is chosen exactly as the plain path would choose
the row's (generated + i)-th token: the same sampling rules, the same seeded random draw (its step is
generated + i), penalties counting the drafts before it as if they had been accepted. A draft is
accepted while it equals the token so chosen; the first mismatch is replaced by the chosen token and
ends the run, and when every draft matches the position after the last one adds a bonus token.

Because every kept token is the token the plain path would have produced, output is identical with and
without speculation, greedy or seeded sampling alike. For sampling this is rejection sampling for
one-hot drafts: the draft is accepted with the target probability p(d) (the chance the draw lands on
it), and on rejection the token comes from p with d removed, renormalised (the draw conditioned on not
landing on d), so each request's distribution is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from tgictl.runtime.shard.sampling.sampler import NextTokenChooser, TokenHistory


@dataclass(frozen=True)
class Expansion:
    """The chooser's view of a step with drafts: one entry per scored position (E of them)."""

    chooser: NextTokenChooser
    history: TokenHistory
    steps: Tensor  # [E] int64: each position's sampling step
    row_of: Tensor  # [E] int64: the batch row of each position
    starts: list[int]  # [B] each row's first position


def expand(
    chooser: NextTokenChooser,
    history: TokenHistory,
    generated: Sequence[int],
    drafts: Sequence[Sequence[int]],
    device: torch.device,
) -> Expansion:
    """Per row b, 1 + len(drafts[b]) positions; `generated[b]` is the row's sampling step."""
    row_of_host = [b for b, draft in enumerate(drafts) for _ in range(1 + len(draft))]
    starts: list[int] = []
    steps: list[int] = []
    for b, draft in enumerate(drafts):
        starts.append(len(steps))
        steps.extend(range(generated[b], generated[b] + 1 + len(draft)))
    row_of = torch.tensor(row_of_host, dtype=torch.int64, device=device)
    return Expansion(
        chooser=chooser.filter(row_of_host),
        history=_expanded_history(history, drafts, row_of, device),
        steps=torch.tensor(steps, dtype=torch.int64, device=device),
        row_of=row_of,
        starts=starts,
    )


def _expanded_history(
    history: TokenHistory, drafts: Sequence[Sequence[int]], row_of: Tensor, device: torch.device
) -> TokenHistory:
    """Counts per position: the row's counts plus the drafts before that position."""
    size = int(row_of.numel())
    if history.counts is None:
        return TokenHistory(None, size, history.vocab_size, device)
    counts = history.counts.index_select(0, row_of)
    rows: list[int] = []
    ids: list[int] = []
    position = 0
    for draft in drafts:
        for i in range(1, len(draft) + 1):  # position i of the row counts draft[:i]
            rows.extend([position + i] * i)
            ids.extend(draft[:i])
        position += 1 + len(draft)
    if rows:
        index = (torch.tensor(rows, device=device), torch.tensor(ids, device=device))
        counts.index_put_(index, torch.ones(len(rows), device=device), accumulate=True)
    return TokenHistory(counts, size, history.vocab_size, device)


def accepted_length(chosen: Sequence[int], draft: Sequence[int]) -> int:
    """How many leading drafts equal the tokens chosen at their positions."""
    n = 0
    while n < len(draft) and chosen[n] == draft[n]:
        n += 1
    return n
