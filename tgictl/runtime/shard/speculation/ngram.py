"""Draft tokens from the request's own text: prompt lookup (docs/architecture.md, "Speculative decoding").

Text that repeats its input (editing, summarising, extracting, refactoring code) continues the way an
earlier occurrence of its last few tokens continued. `NgramIndex` keeps, for every n-gram size, where
the continuation of that n-gram's most recent occurrence starts, updated incrementally as the row grows
(O(sizes) per token), so a proposal is a few dictionary lookups whatever the context length.
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    """Most recent continuation of every n-gram of `sizes` tokens seen in one row's tokens."""

    def __init__(self, min_size: int, max_size: int) -> None:
        if not 1 <= min_size <= max_size:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min <= max, got {min_size}..{max_size}")
        self.sizes = tuple(range(max_size, min_size - 1, -1))  # longest first: the longest match wins
        self._continuations: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
        self._next_end = 1  # the next n-gram end (exclusive) to record

    def _record(self, ids: Sequence[int]) -> None:
        """Record every n-gram whose continuation exists: ends 1 .. len(ids) - 1. The row's own suffix
        (end len(ids)) is left out, so a lookup of it finds an earlier occurrence."""
        for end in range(self._next_end, len(ids)):
            for n, table in self._continuations.items():
                if end >= n:
                    table[tuple(ids[end - n : end])] = end
        self._next_end = max(self._next_end, len(ids))

    def propose(self, ids: Sequence[int], limit: int) -> list[int]:
        """Up to `limit` tokens that followed the most recent earlier occurrence of the longest suffix of
        `ids` found; empty when no suffix of a configured size occurred before."""
        self._record(ids)
        if limit < 1:
            return []
        for n in self.sizes:
            if len(ids) <= n:
                continue
            start = self._continuations[n].get(tuple(ids[len(ids) - n :]))
            if start is not None:
                return list(ids[start : start + limit])
        return []
