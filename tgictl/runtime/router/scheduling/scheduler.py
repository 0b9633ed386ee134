"""The scheduler: which requests the next step runs, which blocks each gets, whom a full cache preempts
(docs/architecture.md, "Scheduling"). Pure and synchronous: `schedule()` plans a step, `update()` takes
its result, so every rule is tested with plain calls; the batcher (batcher.py) runs the plan's RPCs.

Memory is spent as it is used (vLLM's way, block granular): a request is admitted with blocks for its
prompt and its first step, less what the radix cache holds, while a watermark of blocks stays available;
a running request gets a block when its next step crosses into one, and blocks for the steps the call
asks for (`ahead`), when the cache has them.

Preemption: when a running request cannot get the block its next step needs, the running request of
the lowest rank (`Queue.rank`: the lowest priority, then the latest arrival) gives its blocks back: it
leaves the shard's batch (FilterBatch), its computed KV is published to the radix cache, and it is
queued again as the rest of its round, so it resumes with the same tokens, seed and stream (entry.py).
Under `priority` a waiting request that outranks running ones by priority preempts them for its blocks
(`_make_room`), and starts even in a step that preempted for the running requests' blocks (where nothing
else starts: it would only preempt again).
No livelock: requests are secured from the highest rank down and a request is only ever preempted for
one of a higher rank, so the highest-ranked running request always progresses (its whole budget fits
the cache: the queue refuses what cannot), and a resumed request keeps its first arrival, so under fcfs
it is never preempted again for a request that arrived after it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from tgictl.config import SchedulingPolicy
from tgictl.errors import GenerationError, TgictlError, ValidationError
from tgictl.kv_groups import KvGroups
from tgictl.proto.messages import BlockGrant, CachedBatch, StepResult
from tgictl.runtime.router.kv.block_allocator import KvAllocator
from tgictl.runtime.router.request import ErrorEvent
from tgictl.runtime.router.scheduling.entry import Entry, RequestStatus, TokenTexts
from tgictl.runtime.router.scheduling.queue import NextBatch, Queue

log = logging.getLogger(__name__)

# Blocks admission leaves free or evictable for the running requests to grow into, as a fraction of the
# cache (vLLM's watermark); at least one block while anything runs.
ADMISSION_WATERMARK = 0.01


def release_window(layer_windows: Sequence[int], groups: KvGroups | None = None) -> int | None:
    """The window blocks may be released behind (Info.layer_windows: 0 is a layer without one): the narrowest,
    when every layer has one. A model with global layers too frees only with two layer groups (`groups`, the
    allocator's): then the local group's window, and `release` gives back only the local halves. Else the
    shared paged cache (one block holds a position for all layers) can free nothing; None."""
    if groups is not None:
        return groups.window
    if not layer_windows or min(layer_windows) == 0:
        return None
    return min(layer_windows)


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch_prefill_tokens: int
    max_batch_size: int | None = None
    # A Prefill takes a request after its first only while the prompt tokens stay within this (Queue.next_batch);
    # None: the budget alone (RouterConfig.prefill_group_tokens).
    prefill_group_tokens: int | None = None
    speculate: int = 0  # draft tokens a decoding row may verify per step (Info.speculate): blocks ahead for them
    # The narrowest sliding window when EVERY layer has one (Info.layer_windows), or the local group's with two
    # layer groups, else None: a decoding request's blocks that all (local) layers have left behind go back to
    # the pool (`_release_behind_window`).
    release_window: int | None = None


@dataclass(frozen=True)
class StepPlan:
    """One step: first filter the preempted requests out of the running batch, then a Prefill of
    `prefill` beside it, or a Decode of `steps` steps, carrying `grants` for the running requests."""

    preempted: tuple[int, ...]  # request ids of the running batch that leave it before the step
    prefill: NextBatch | None  # newly admitted requests; None: a Decode
    steps: int  # decode steps (1 with a prefill)
    grants: tuple[BlockGrant, ...]  # new blocks for requests of the running batch


class Scheduler:
    """Owns every in-flight request: the waiting queue and the running ones (by shard request id, in
    admission order). Not thread-safe: the batching task alone calls it."""

    def __init__(self, queue: Queue, allocator: KvAllocator, texts: TokenTexts, config: SchedulerConfig) -> None:
        self.queue = queue
        self._allocator = allocator
        self._texts = texts
        self._config = config
        self.running: dict[int, Entry] = {}
        self.preemptions = 0  # requests preempted so far (a metric)

    def add(self, entry: Entry) -> int:
        return self.queue.append(entry)

    # -- planning ------------------------------------------------------------------------------------

    def schedule(self, batch: CachedBatch | None, decode_steps: int) -> StepPlan | None:
        """The next step for the running `batch` (the shard's view: every running request), or None when
        nothing runs and nothing can start. `decode_steps`: the steps a Decode would ask for if no request
        waits (one while any does, so it joins after the next step)."""
        self.queue.drop_cancelled()
        lengths = {rid: len(entry.allocation.blocks) for rid, entry in self.running.items() if entry.allocation}
        preempted: list[int] = []
        self._release_behind_window()
        victims_priority = self._secure_running(preempted)
        # After a preemption the cache is full: admitting now (the preempted request first) would only
        # preempt again at the next step (vLLM skips the waiting queue then too), unless the head outranks
        # every request just preempted (`priority`): it would preempt them anyway, so it starts now.
        admitted = None
        if not preempted or self._head_outranks(victims_priority):
            admitted = self._admit(batch, preempted)
        steps = 1 if admitted is not None or len(self.queue) else max(decode_steps, 1)
        self._grant_ahead(steps)
        grants = tuple(
            BlockGrant(rid, entry.allocation.blocks[lengths[rid]:])
            for rid, entry in self.running.items()
            if entry.allocation is not None and rid in lengths and len(entry.allocation.blocks) > lengths[rid]
        )
        if admitted is not None:
            for rid, entry in admitted.entries.items():
                entry.start(self._texts)
                entry.status = RequestStatus.RUNNING
                self.running[rid] = entry
        if not self.running and not preempted:
            return None
        return StepPlan(tuple(preempted), admitted, steps, grants)

    def _head_outranks(self, victims_priority: int | None) -> bool:
        """Under `priority`: the queue's head has a strictly higher priority (a lower value) than every
        request this step preempted (`victims_priority`: the lowest value among them)."""
        head = self.queue.head()
        if self.queue.policy is not SchedulingPolicy.PRIORITY or head is None or victims_priority is None:
            return False
        return head.priority < victims_priority

    def _secure_running(self, preempted: list[int]) -> int | None:
        """Blocks for every running request's next step, from the highest rank down; when the cache has none
        left, the lowest-ranked running request is preempted (possibly the one that needs them). Returns the
        lowest priority value among those it preempted (None: none)."""
        best: int | None = None
        for entry in sorted(self.running.values(), key=self.queue.rank):
            while entry.status is RequestStatus.RUNNING and not self._grow(entry, entry.context_len):
                victim = max(self.running.values(), key=self.queue.rank)
                best = victim.priority if best is None else min(best, victim.priority)
                self._preempt(victim, preempted)
        return best

    def _release_behind_window(self) -> None:
        """When every layer (every local layer, with two layer groups) attends through a sliding window of at most
        `release_window` positions, a query at position q reads keys from q - window + 1 on: the blocks wholly
        before the next forward's first query's window, less one block of margin, are read by no such layer again
        (with two groups only their local halves go back). Only decoding requests (their prompt is
        in); a request that released blocks publishes nothing to the prefix cache (a continuation or a
        resumed request recomputes), see kv/block_allocator.py."""
        window = self._config.release_window
        if window is None:
            return
        block_size = self._allocator.block_size
        for entry in self.running.values():
            if entry.allocation is None or not entry.prompt_computed:
                continue
            behind = (entry.written_len - window) // block_size - 1  # whole blocks before the window, less one
            behind = min(behind, len(entry.allocation.blocks) - 1)
            if behind > entry.allocation.released:
                entry.allocation = self._allocator.release(entry.allocation, behind)

    def _admit(self, batch: CachedBatch | None, preempted: list[int]) -> NextBatch | None:
        config = self._config
        max_size = None if config.max_batch_size is None else config.max_batch_size - len(self.running)
        budget = config.max_batch_prefill_tokens - (batch.current_tokens if batch is not None else 0)
        # Nothing running: nothing to grow, and a watermark could keep the head out of an otherwise idle cache.
        reserve = max(1, int(self._allocator.total_blocks * ADMISSION_WATERMARK)) if self.running else 0
        return self.queue.next_batch(
            max_size, budget, ahead=1 + config.speculate, reserve=reserve,
            make_room=lambda head: self._make_room(head, preempted), group_tokens=config.prefill_group_tokens,
        )

    def _make_room(self, head: Entry, preempted: list[int]) -> bool:
        """Under the priority policy a waiting request that does not fit preempts a running one of strictly
        lower priority (the lowest-ranked first); under fcfs nobody runs ahead of its turn."""
        if self.queue.policy is not SchedulingPolicy.PRIORITY or not self.running:
            return False
        victim = max(self.running.values(), key=self.queue.rank)
        if victim.priority <= head.priority:
            return False
        self._preempt(victim, preempted)
        return True

    def _grant_ahead(self, steps: int) -> None:
        """Best effort, no preemption: blocks for the positions the call's steps, the shard's look-ahead step
        and drafts will write, so the shard need not stop short (it stops where a row's blocks end)."""
        ahead = steps + self._config.speculate
        for entry in sorted(self.running.values(), key=self.queue.rank):
            if not self._grow(entry, entry.context_len + ahead):
                return

    def _grow(self, entry: Entry, tokens: int) -> bool:
        assert entry.allocation is not None, "a running entry holds blocks"
        grown = self._allocator.grow(entry.allocation, min(tokens, entry.max_context_len))
        if grown is None:
            return False
        entry.allocation = grown
        return True

    def _preempt(self, entry: Entry, preempted: list[int]) -> None:
        """`entry` leaves the running batch: its computed KV is published, it queues again as the rest of its round."""
        assert entry.allocation is not None
        self._allocator.free(entry.allocation, entry.computed_tokens(resumes=True))
        entry.allocation = None
        del self.running[entry.id]
        preempted.append(entry.id)
        self.preemptions += 1
        if entry.is_cancelled():  # its client left: nothing to resume
            entry.status = RequestStatus.FINISHED
            return
        log.debug("preempted request %d (priority %d, %d tokens so far, preemption %d): no KV block left",
                  entry.id, entry.priority, len(entry.generated_ids), entry.preemptions + 1)
        entry.preempt()
        self.queue.append(entry)

    # -- results -------------------------------------------------------------------------------------

    def update(self, result: StepResult) -> tuple[CachedBatch | None, list[int]]:
        """Route a step's generations to their clients and end what finished; returns the shard's batch and
        the ids of it to keep (fewer when the router ended some: a stop string, a client that left)."""
        for generation in result.generations:
            entry = self.running.get(generation.request_id)
            if entry is None:
                continue  # already ended by the router (stop string, disconnect) in an earlier step
            if entry.is_cancelled():
                self.finish(entry)
                continue
            entry.on_generation(generation)
            if generation.error and not entry.finished:
                # The shard ended this request alone (its grammar failed) and goes on with the rest. Its
                # computed KV is sound, so it is published like any finished request's.
                entry.send(ErrorEvent(error=ValidationError(generation.error)))
                self.finish(entry)
            elif entry.finished or entry.continues:
                self.finish(entry)
        cached = result.batch
        on_shard = set(cached.request_ids) if cached is not None else set()
        lost = [rid for rid in self.running if rid not in on_shard]
        if lost:  # the shard holds no more state for them, yet they did not end: never leave them waiting
            self.fail(lost, GenerationError("the shard dropped the request"))
        if cached is None:
            return None, []
        for request_id in cached.request_ids:
            entry = self.running.get(request_id)
            if entry is not None and entry.is_cancelled():
                self.finish(entry)
        return cached, [rid for rid in cached.request_ids if rid in self.running]

    def finish(self, entry: Entry) -> None:
        """The entry leaves the running batch: its blocks are freed, computed tokens published; a
        continuation goes back to the queue as its next round."""
        if entry.allocation is not None:
            # Before leaving `running`: should free() raise, the batcher still fails this entry's stream.
            self._allocator.free(entry.allocation, entry.computed_tokens())
            entry.allocation = None
        self.running.pop(entry.id, None)
        if entry.continues and not entry.is_cancelled():
            entry.next_round()
            self.queue.append(entry)
        else:
            entry.status = RequestStatus.FINISHED

    def fail(self, request_ids: Sequence[int], err: TgictlError) -> None:
        """A step failed: exactly these requests fail. Their KV is not trusted: nothing is published."""
        error = err if isinstance(err, GenerationError) else GenerationError(str(err))
        for request_id in request_ids:
            entry = self.running.pop(request_id, None)
            if entry is None:
                continue
            entry.status = RequestStatus.FINISHED
            entry.send(ErrorEvent(error=error))
            if entry.allocation is not None:
                self._allocator.free(entry.allocation, None)
                entry.allocation = None
