"""The shard's cached batches between steps, keyed by the router's batch id (TGI's server.py TextGenerationService cache).

Only the servicer's single worker thread touches the store, so it needs no lock. Lookups that miss
raise BatchNotFoundError (gRPC NOT_FOUND): the router asked for a batch this shard does not hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tgictl.errors import BatchNotFoundError, InvalidRequestError
from tgictl.runtime.shard.batch import ShardBatch


class BatchStore:
    def __init__(self) -> None:
        self._batches: dict[int, ShardBatch] = {}

    def __len__(self) -> int:
        return len(self._batches)

    def __contains__(self, batch_id: int) -> bool:
        return batch_id in self._batches

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(self._batches)

    def get(self, batch_id: int) -> ShardBatch:
        try:
            return self._batches[batch_id]
        except KeyError:
            raise BatchNotFoundError(f"Batch ID {batch_id} not found in cache.") from None

    def get_many(self, batch_ids: Sequence[int]) -> list[ShardBatch]:
        """The listed batches, in order; checks every id before returning any (all or nothing)."""
        if not batch_ids:
            raise InvalidRequestError("at least one cached batch is required")
        if len(set(batch_ids)) != len(batch_ids):
            raise InvalidRequestError(f"batch ids must not repeat, got {list(batch_ids)}")
        return [self.get(batch_id) for batch_id in batch_ids]

    def replace(self, consumed: Iterable[int], result: ShardBatch | None) -> None:
        """Drop the consumed batches, then cache `result` (None: every request finished) under its id."""
        for batch_id in consumed:
            self._batches.pop(batch_id, None)
        if result is not None:
            self._batches[result.id] = result

    def remove(self, batch_id: int) -> None:
        self.get(batch_id)  # unknown ids are NOT_FOUND, as in FilterBatch and Decode
        del self._batches[batch_id]

    def clear(self) -> None:
        self._batches.clear()
