"""Stop strings, matched on decoded text so they work across token boundaries.

Text that might be the start of a stop string is held back until it is known not to be, so a client
never receives part of a stop string it will then have to take back (OpenAI strips stop strings; TGI
keeps them: the caller chooses with `matched`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StopCheck:
    emit: str  # text that is now safe to show
    matched: str | None  # the stop string that ended the generation, if any


class StopSequenceMatcher:
    """Stop strings are matched on the text with special tokens, as TGI does (so `<|im_end|>` can be one),
    but only visible text is ever emitted: each piece is fed with whether the client may see it."""

    def __init__(self, stop_sequences: Sequence[str]) -> None:
        self._stops = tuple(s for s in stop_sequences if s)
        self._pending: list[tuple[str, bool]] = []  # (text, visible) not yet released, in order

    def feed(self, text: str, visible: bool = True) -> StopCheck:
        """Add newly decoded text; return what may be emitted and whether a stop string matched."""
        if not self._stops:
            return StopCheck(emit=text if visible else "", matched=None)
        self._pending.append((text, visible))
        joined = "".join(piece for piece, _ in self._pending)
        first_index, first_stop = -1, None
        for stop in self._stops:
            index = joined.find(stop)
            if index != -1 and (first_index == -1 or index < first_index):
                first_index, first_stop = index, stop
        if first_stop is not None:
            emit = self._take(first_index)
            self._pending = []
            return StopCheck(emit=emit, matched=first_stop)
        return StopCheck(emit=self._take(len(joined) - self._held_back_length(joined)), matched=None)

    def _take(self, count: int) -> str:
        """Release the first `count` characters of the pending text; returns their visible part."""
        emit: list[str] = []
        while count > 0 and self._pending:
            piece, visible = self._pending[0]
            if len(piece) <= count:
                self._pending.pop(0)
                taken = piece
            else:
                taken, self._pending[0] = piece[:count], (piece[count:], visible)
            count -= len(taken)
            if visible:
                emit.append(taken)
        return "".join(emit)

    def _held_back_length(self, pending: str) -> int:
        """Length of the longest suffix of the pending text that begins some stop string."""
        longest = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(pending)), longest, -1):
                if pending.endswith(stop[:k]):
                    longest = k
                    break
        return longest

    def flush(self) -> str:
        """At the end of a generation nothing can complete a stop string: release what was held."""
        return self._take(sum(len(piece) for piece, _ in self._pending))
