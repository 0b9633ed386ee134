"""When and how much a row drafts (docs/architecture.md, "Speculative decoding").

Verification is nearly free while a forward only streams the weights (one client, small batches) and
costs real compute once the batch is large, and a draft that is rejected was computed for nothing. So a
step drafts only while few rows decode (`max_batch`), and a row whose drafts keep being rejected
(acceptance below `min_acceptance` over its recent drafts) pauses for `pause_steps` steps before trying
again: free writing costs almost nothing, repetitive text keeps its gain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tgictl.config import SpeculationConfig
from tgictl.runtime.shard.speculation.ngram import NgramIndex

_WINDOW = 16  # drafted tokens after which the acceptance rate is judged (and the counts restart)


class Drafter(Protocol):
    """Where one row's drafts come from (n-gram lookup in serving; known continuations in tests)."""

    def propose(self, ids: Sequence[int], limit: int) -> list[int]: ...

    def record(self, drafted: int, accepted: int, config: SpeculationConfig) -> None: ...


@dataclass(eq=False, slots=True)
class RowDrafter:
    """One row's n-gram index and acceptance record."""

    index: NgramIndex
    drafted: int = 0  # in the current window
    accepted: int = 0
    paused: int = 0  # steps left without drafting

    @classmethod
    def create(cls, config: SpeculationConfig) -> RowDrafter:
        return cls(NgramIndex(config.ngram_min, config.ngram_max))

    def propose(self, ids: Sequence[int], limit: int) -> list[int]:
        if self.paused > 0:
            self.paused -= 1
            self.index.propose(ids, 0)  # keep the index current
            return []
        return self.index.propose(ids, limit)

    def record(self, drafted: int, accepted: int, config: SpeculationConfig) -> None:
        self.drafted += drafted
        self.accepted += accepted
        if self.drafted >= _WINDOW:
            if self.accepted < config.min_acceptance * self.drafted:
                self.paused = config.pause_steps
            self.drafted = self.accepted = 0


def batch_drafts(config: SpeculationConfig, decoding_rows: int) -> bool:
    """Whether a step with this many decoding rows drafts at all (large batches are compute-bound)."""
    return config.tokens > 0 and decoding_rows <= config.max_batch
