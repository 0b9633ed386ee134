"""Per-row token counts that the repetition, frequency and presence penalties read.

Penalties count the prompt AND the generated tokens (TGI's repetition penalty covers both). The
counts are a dense [batch, vocab] float32 tensor: one scatter per step keeps them current, the
penalties become elementwise passes with no gather, and float32 holds counts exactly up to 2**24.
Only rows that actually contain a token are counted, so padding never becomes a phantom token 0
(TGI pads rows with id 0 and penalises it: a quirk we do not copy).

The tensor costs as much memory as one logits tensor, so it is only materialised when some row of
the batch needs a penalty (`needed`). A request's need never changes during its life, so when an
unmaterialised history is concatenated with a materialised one its rows get zero counts: those rows
have neutral penalties and their counts are never read.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from tgictl.errors import GenerationError, InvalidRequestError


class TokenHistory:
    """Token counts per batch row; `counts` is None when no row of the batch needs penalties."""

    def __init__(self, counts: Tensor | None, size: int, vocab_size: int, device: torch.device) -> None:
        self.counts = counts  # [size, vocab_size] float32, or None (not materialised)
        self.size = size
        self.vocab_size = vocab_size
        self.device = device
        # [size] int64 row indices for append's scatter, built once per history object.
        self._rows = torch.arange(size, device=device) if counts is not None else None

    @property
    def materialised(self) -> bool:
        return self.counts is not None

    @classmethod
    def from_sequences(
        cls,
        sequences: Sequence[Sequence[int]],
        vocab_size: int,
        device: torch.device | str,
        needed: bool,
    ) -> TokenHistory:
        """Counts of each row's prompt ids; a cheap placeholder when `needed` is False."""
        device = torch.device(device)
        size = len(sequences)
        if not needed:
            return cls(None, size, vocab_size, device)
        flat_ids = [token for sequence in sequences for token in sequence]
        if flat_ids and (min(flat_ids) < 0 or max(flat_ids) >= vocab_size):
            bad = next(t for t in flat_ids if t < 0 or t >= vocab_size)
            raise InvalidRequestError(f"input_ids: token id {bad} is outside the vocabulary [0, {vocab_size})")
        counts = torch.zeros(size, vocab_size, dtype=torch.float32, device=device)
        if flat_ids:
            lengths = torch.tensor([len(s) for s in sequences], device=device)
            rows = torch.repeat_interleave(torch.arange(size, device=device), lengths)  # [total]
            ids = torch.tensor(flat_ids, dtype=torch.int64, device=device)  # [total]
            ones = torch.ones(len(flat_ids), dtype=torch.float32, device=device)
            counts.index_put_((rows, ids), ones, accumulate=True)
        return cls(counts, size, vocab_size, device)

    def append(self, next_ids: Tensor) -> None:
        """Count one new token per row. next_ids: [size] int64."""
        if next_ids.shape != (self.size,):
            raise GenerationError(f"TokenHistory.append: expected {self.size} ids, got shape {tuple(next_ids.shape)}")
        if self.counts is None or self._rows is None:
            return
        ids = next_ids.to(device=self.device, dtype=torch.int64)
        # One id per row, so (row, id) pairs are distinct and a plain indexed add is exact.
        self.counts[self._rows, ids] += 1.0

    def filter(self, keep: Sequence[int]) -> TokenHistory:
        """The rows `keep` (batch row indices), in that order."""
        if any(i < 0 or i >= self.size for i in keep):
            raise GenerationError(f"TokenHistory.filter: row indices must lie in [0, {self.size})")
        if self.counts is None:
            return TokenHistory(None, len(keep), self.vocab_size, self.device)
        index = torch.tensor(list(keep), dtype=torch.int64, device=self.device)
        return TokenHistory(self.counts.index_select(0, index), len(keep), self.vocab_size, self.device)

    @classmethod
    def concatenate(cls, histories: Sequence[TokenHistory]) -> TokenHistory:
        """Rows of every history, in order. Materialised if any part is."""
        if not histories:
            raise GenerationError("TokenHistory.concatenate: needs at least one history")
        first = histories[0]
        for history in histories[1:]:
            if history.vocab_size != first.vocab_size or history.device != first.device:
                raise GenerationError(
                    "TokenHistory.concatenate: histories differ in vocab_size or device "
                    f"({first.vocab_size}, {first.device}) vs ({history.vocab_size}, {history.device})"
                )
        size = sum(h.size for h in histories)
        if all(h.counts is None for h in histories):
            return cls(None, size, first.vocab_size, first.device)
        parts = [
            h.counts
            if h.counts is not None
            else torch.zeros(h.size, first.vocab_size, dtype=torch.float32, device=first.device)
            for h in histories
        ]
        return cls(torch.cat(parts, dim=0), size, first.vocab_size, first.device)
