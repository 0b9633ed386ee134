"""The next decode step of a stored batch, computed before the router asks for it (docs/architecture.md,
"Look-ahead decoding").

Why: between two steps the shard used to wait while its answer crossed gRPC, the router turned it into
text and events, and the next Decode came back: on 2 cores the device thread sat idle 12-16% of the time
(one client: ~2 of every ~12 ms per token; 32 clients: the router-observed step 1.15x the shard's own).
Right after a Decode or Prefill job stores a batch whose rows all decode, the servicer posts `run` as the
next device job, so the step runs during that round trip, and the Decode that asks for it finds it done.

Everything here runs on the servicer's one device thread, in RPC order, so no lock is needed and every
rank of a tensor-parallel group runs the same steps in the same order. What the router sends next decides
what the kept step becomes:
- Decode of the batch: the kept output is the answer (other batches in the same call are stepped and
  appended).
- FilterBatch: the kept output loses the removed rows' generations, its next batch their rows.
- Prefill with the batch as the cached one: the kept output for its rows, then the new batch alone, the
  two concatenated (the same tokens as one mixed forward, in a separate forward).
- ClearCache of it (or of all) and Warmup drop it.
K/V: the step writes each row's pending token into that row's next slot, inside the router's allocation
for the row (a batch runs ahead only while every row's blocks hold the step: `ShardBatch.fits_next_step`). A row the router stops meanwhile frees its blocks only after this job was queued, so a later
owner of the slot writes it in a later job, and the position is past the tokens the router publishes to its
prefix cache.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from tgictl.errors import InvalidRequestError
from tgictl.proto.messages import CachedBatch, Timings
from tgictl.runtime.shard.batch import ShardBatch
from tgictl.runtime.shard.batch_store import BatchStore
from tgictl.runtime.shard.runtime import ShardRuntime, StepOutput


@dataclasses.dataclass
class _Kept:
    batch_id: int
    request_ids: tuple[int, ...]  # the batch's rows before the step, in order (only rank 0 has generations)
    kv_tokens: dict[int, int]  # each of those rows' KV capacity (its blocks' tokens), for CachedBatch.max_tokens
    output: StepOutput | None  # None when the step failed
    error: Exception | None = None


def merge_outputs(first: StepOutput, second: StepOutput, batch_id: int) -> StepOutput:
    """Two steps' outputs as one: generations in order, next batches concatenated under `batch_id`."""
    batches = [b for b in (first[1], second[1]) if b is not None]
    merged = ShardBatch.concatenate(batches) if batches else None
    if merged is not None:
        merged.id = batch_id
    a, b = first[2], second[2]
    timings = Timings(a.forward_ns + b.forward_ns, a.decode_ns + b.decode_ns, a.total_ns + b.total_ns)
    return [*first[0], *second[0]], merged, timings


class StepAhead:
    """The one kept step (or none). `enabled` False: `eligible` is always False and nothing is kept."""

    def __init__(self, runtime: ShardRuntime, store: BatchStore, enabled: bool = True) -> None:
        self._runtime = runtime
        self._store = store
        self.enabled = enabled
        self._kept: _Kept | None = None
        self.steps_run = 0  # for tests and scripts: how many steps ran ahead
        self.steps_used = 0  # of them, answered a Decode or Prefill

    def eligible(self, batch: ShardBatch | None) -> bool:
        """Whether to step `batch` ahead: every row decodes (no prompt chunk still to compute) and its blocks
        hold the step (otherwise the router's next call brings the blocks first)."""
        return self.enabled and self._kept is None and batch is not None and batch.size > 0 \
            and not any(row.prefilling for row in batch.rows) and batch.fits_next_step()

    def holds(self, batch_id: int) -> bool:
        return self._kept is not None and self._kept.batch_id == batch_id

    def run(self, batch_id: int, before_step: Callable[[str], None]) -> None:
        """Step the stored batch `batch_id` and keep the output (a failure is kept and raised to its taker,
        and re-raised here for the caller's fatal-error reporting)."""
        if self._kept is not None or batch_id not in self._store:
            return
        batch = self._store.get(batch_id)
        request_ids = batch.request_ids
        kv_tokens = {row.request.id: row.capacity for row in batch.rows}
        try:
            before_step("Decode")
            output = self._runtime.decode([batch])
        except Exception as err:
            self._kept = _Kept(batch_id, request_ids, kv_tokens, None, err)
            raise
        self._store.replace([batch_id], output[1])
        self._kept = _Kept(batch_id, request_ids, kv_tokens, output)
        self.steps_run += 1

    def take(self, batch_id: int) -> StepOutput | None:
        """The kept step of `batch_id` (None when none is kept for it); raises the kept failure."""
        if not self.holds(batch_id):
            return None
        kept, self._kept = self._kept, None
        assert kept is not None  # holds() checked it
        if kept.error is not None:
            raise kept.error
        assert kept.output is not None
        self.steps_used += 1
        return kept.output

    def decode(self, batch_ids: Sequence[int], step: Callable[[Sequence[int]], StepOutput]) -> StepOutput | None:
        """A Decode of `batch_ids` served from the kept step (the other batches stepped by `step`), or None
        when no kept step belongs to them."""
        kept_id = next((i for i in batch_ids if self.holds(i)), None)
        if kept_id is None:
            return None
        if len(set(batch_ids)) != len(batch_ids):
            raise InvalidRequestError(f"batch ids must not repeat, got {list(batch_ids)}")
        others = [i for i in batch_ids if i != kept_id]
        if others:
            self._store.get_many(others)  # every id checked before the kept step is used
        output = self.take(kept_id)
        assert output is not None
        if not others:
            return output
        return merge_outputs(output, step(others), kept_id)

    def filter(self, batch_id: int, request_ids: Sequence[int]) -> CachedBatch | None:
        """FilterBatch on the kept step of `batch_id` (None when none is kept for it): the batch as the router
        sees it, its rows before the kept step, in batch order."""
        if not self.holds(batch_id):
            return None
        assert self._kept is not None
        if self._kept.error is not None:
            self.take(batch_id)  # raises
        assert self._kept.output is not None
        generations, next_batch, timings = self._kept.output
        before = self._kept.request_ids
        wanted = set(request_ids)
        if not request_ids or not wanted <= set(before):
            missing = sorted(wanted - set(before))
            raise InvalidRequestError(f"batch {batch_id}: filter needs ids of the batch, missing {missing}")
        running = [rid for rid in (next_batch.request_ids if next_batch is not None else ()) if rid in wanted]
        filtered = next_batch.filter(running) if next_batch is not None and running else None
        self._store.replace([batch_id], filtered)
        self._kept.output = ([g for g in generations if g.request_id in wanted], filtered, timings)
        kept_ids = tuple(rid for rid in before if rid in wanted)
        max_tokens = sum(self._kept.kv_tokens[rid] for rid in kept_ids)
        return CachedBatch(id=batch_id, request_ids=kept_ids, max_tokens=max_tokens, current_tokens=len(kept_ids))

    def ended(self, batch_id: int) -> frozenset[int]:
        """Requests of `batch_id` that finished in the kept step: the router has not seen that yet."""
        if not self.holds(batch_id):
            return frozenset()
        assert self._kept is not None
        running = self._store.get(batch_id).request_ids if batch_id in self._store else ()
        return frozenset(self._kept.request_ids) - frozenset(running)

    def drop(self, batch_id: int | None) -> bool:
        """Forget the kept step of `batch_id` (None: whichever); whether one was kept."""
        if self._kept is None or (batch_id is not None and self._kept.batch_id != batch_id):
            return False
        self._kept = None
        return True
