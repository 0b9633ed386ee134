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
    def __init__(self, stop_sequences: Sequence[str]) -> None:
        self._stops = tuple(s for s in stop_sequences if s)
        self._pending = ""

    def feed(self, text: str) -> StopCheck:
        """Add newly decoded text; return what may be emitted and whether a stop string matched."""
        if not self._stops:
            return StopCheck(emit=text, matched=None)
        self._pending += text
        first_index, first_stop = -1, None
        for stop in self._stops:
            index = self._pending.find(stop)
            if index != -1 and (first_index == -1 or index < first_index):
                first_index, first_stop = index, stop
        if first_stop is not None:
            emit = self._pending[:first_index]
            self._pending = ""
            return StopCheck(emit=emit, matched=first_stop)
        hold = self._held_back_length()
        cut = len(self._pending) - hold
        emit, self._pending = self._pending[:cut], self._pending[cut:]
        return StopCheck(emit=emit, matched=None)

    def _held_back_length(self) -> int:
        """Length of the longest suffix of the pending text that begins some stop string."""
        longest = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(self._pending)), longest, -1):
                if self._pending.endswith(stop[:k]):
                    longest = k
                    break
        return longest

    def flush(self) -> str:
        """At the end of a generation nothing can complete a stop string: release what was held."""
        text, self._pending = self._pending, ""
        return text
