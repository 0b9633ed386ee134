"""The waiting queue and `next_batch`: which entries the next Prefill takes, with their KV blocks.

Follows TGI v3's State::next_batch (backends/v3/src/queue.rs) in its walk: entries in queue order, the
first one that does not fit stops it (no skipping, so no starvation). What differs (docs/architecture.md,
"Scheduling"):
- the order: by arrival (`fcfs`, TGI's), or by the request's `priority` and then arrival (`priority`,
  vLLM's: lower runs first). A round or resumption keeps its first arrival, so under `fcfs` a preempted
  request or a continuation round goes before every request that never ran (they all arrived later);
- under `priority`, one Prefill admits requests of one priority only: the step that computes a
  higher-priority prompt (and gives its first token) is not lengthened by lower-priority prompts;
- the blocks: an entry is admitted with blocks for its prompt and its next step only (less what the
  radix cache holds), while `reserve` blocks (the watermark) stay free or evictable for the running
  requests to grow into; the rest come as it generates (scheduler.py).
Allocations of entries pushed back are freed as never computed, so they are never published to the prefix
cache (docs/architecture.md, "Decisions": Publish only computed KV).
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from tgictl.config import SchedulingPolicy
from tgictl.errors import ValidationError
from tgictl.proto.messages import Batch, Request, StoppingParams
from tgictl.runtime.router.kv.block_allocator import BlockAllocation, KvAllocator, blocks_for
from tgictl.runtime.router.request import ErrorEvent
from tgictl.runtime.router.scheduling.entry import Entry


@dataclass(frozen=True)
class NextBatch:
    batch: Batch
    entries: dict[int, Entry]  # by request id, in batch order


# Called when the queue's head does not fit: may free blocks (preempt a request the head outranks) and
# returns whether it did, so the head is tried again.
MakeRoom = Callable[[Entry], bool]


class Queue:
    """Plain object living on the router's event loop: append from handlers, take from the batcher."""

    def __init__(
        self, allocator: KvAllocator, *, block_size: int, policy: SchedulingPolicy = SchedulingPolicy.FCFS
    ) -> None:
        self._allocator = allocator
        self._block_size = block_size
        self.policy = policy
        self._entries: list[Entry] = []  # in queue order (see rank)
        self._keys: list[tuple[int, int]] = []  # rank of each entry, for bisect
        self._next_id = 0
        self._next_arrival = 0
        self._next_batch_id = 0
        self.dropped = 0  # entries whose client left while they waited (a metric)

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[Entry]:
        """The queued entries, in order (a copy)."""
        return list(self._entries)

    def rank(self, entry: Entry) -> tuple[int, int]:
        """Queue order: smaller runs first. The scheduler preempts the running request of the largest."""
        return (entry.priority if self.policy is SchedulingPolicy.PRIORITY else 0, entry.arrival)

    def append(self, entry: Entry) -> int:
        """Queue `entry` in its place (a new one gets its arrival now; a round or resumption keeps its own).
        Each round gets a fresh id: the shard knows every round as a request of its own."""
        entry.id = self._next_id
        self._next_id += 1
        if entry.arrival < 0:
            entry.arrival = self._next_arrival
            self._next_arrival += 1
        key = self.rank(entry)
        at = bisect.bisect_right(self._keys, key)
        self._keys.insert(at, key)
        self._entries.insert(at, entry)
        return entry.id

    def _pop_head(self) -> Entry:
        del self._keys[0]
        return self._entries.pop(0)

    def _push_head(self, entry: Entry) -> None:
        self._keys.insert(0, self.rank(entry))
        self._entries.insert(0, entry)

    def head(self) -> Entry | None:
        return self._entries[0] if self._entries else None

    def drop_cancelled(self) -> list[Entry]:
        """Remove entries whose clients left; returns them so the caller can account for them."""
        gone = [e for e in self._entries if e.is_cancelled()]
        if gone:
            kept = [(k, e) for k, e in zip(self._keys, self._entries) if not e.is_cancelled()]
            self._keys = [k for k, _ in kept]
            self._entries = [e for _, e in kept]
            self.dropped += len(gone)
        return gone

    def next_batch(
        self, max_size: int | None, prefill_budget: int, *, ahead: int = 1, reserve: int = 0,
        make_room: MakeRoom = lambda entry: False, group_tokens: int | None = None,
    ) -> NextBatch | None:
        """Entries for the next Prefill, in queue order, while their blocks fit the allocator (keeping
        `reserve` blocks available) and their prompts the prefill budget (the last one may be cut into a
        chunk); under `priority`, only entries of the head's priority. Each gets blocks for its prompt plus
        `ahead` tokens (the positions its first steps write: the look-ahead step's, drafts), at most its
        whole budget. `group_tokens` (None: no such limit): a request after the first joins only while the
        prompt tokens to compute stay within it, so a burst of short prompts starts in several steps and
        the first of them get their first token early; one long prompt still fills the budget."""
        if prefill_budget <= 0 or not self._entries:
            return None
        if max_size is not None and max_size <= 0:
            return None
        # Budgets are counted in whole blocks, as the allocator hands them out.
        prefill_budget = math.ceil(prefill_budget / self._block_size) * self._block_size

        taken: list[tuple[Entry, BlockAllocation, int, int | None]] = []
        prefill_tokens = 0
        while self._entries:
            entry = self._pop_head()
            if entry.is_cancelled():
                self.dropped += 1
                continue
            if self._never_fits(entry):
                continue
            if taken and self.policy is SchedulingPolicy.PRIORITY and entry.priority != taken[0][0].priority:
                # One priority per Prefill: lower-priority prompts would lengthen the step that gives the
                # higher-priority requests their first token; they join at the next step.
                self._push_head(entry)
                break
            allocation = self._allocate(entry, ahead, reserve)
            while allocation is None and make_room(entry):
                allocation = self._allocate(entry, ahead, reserve)
            if allocation is None:
                self._push_head(entry)
                break
            prefix_len = allocation.prefix_len
            postfix = entry.round.input_length - prefix_len
            if taken and group_tokens is not None and prefill_tokens + postfix > group_tokens:
                self._allocator.free(allocation, None)
                self._push_head(entry)
                break
            chunk_len: int | None = None
            if prefill_tokens + postfix > prefill_budget:
                remaining = prefill_budget - prefill_tokens
                if remaining > 0:
                    chunk_len = remaining
                    taken.append((entry, allocation, prefix_len, chunk_len))
                else:
                    self._allocator.free(allocation, None)
                    self._push_head(entry)
                break
            prefill_tokens += postfix
            taken.append((entry, allocation, prefix_len, None))
            if max_size is not None and len(taken) >= max_size:
                break

        if not taken:
            return None
        return self._build(taken)

    def _never_fits(self, entry: Entry) -> bool:
        """Not even an empty cache could hold its whole budget: waiting (or preempting others) would never
        end, so it fails now with a 422."""
        request = entry.round
        # The last generated token is sampled but never fed back, so it needs no KV slot.
        tokens = entry.max_context_len
        if blocks_for(tokens, self._block_size) <= self._allocator.total_blocks:
            return False
        entry.send(ErrorEvent(ValidationError(
            f"the request needs {tokens} KV slots (input {request.input_length} + max_new_tokens "
            f"{request.max_new_tokens} - 1) but the cache holds {self._allocator.total_blocks} "
            f"blocks of {self._block_size}"
        )))
        return True

    def _allocate(self, entry: Entry, ahead: int, reserve: int) -> BlockAllocation | None:
        request = entry.round
        # Prompt logprobs need every prompt position recomputed, so such a request takes no prefix.
        # The last prompt position is always computed (its logits give the first token), so it is
        # left out of the lookup: it then lands in a block of this request's own, never in a cached
        # block that other requests read while it is written.
        key = None if request.decoder_input_details else request.input_ids[:-1]
        tokens = min(request.input_length + ahead, entry.max_context_len)
        # Keyed by adapter: KV computed under one adapter is never another's (docs/architecture.md, "Multi-LoRA").
        return self._allocator.allocate(tokens, key, request.adapter_index, reserve)

    def _build(self, taken: list[tuple[Entry, BlockAllocation, int, int | None]]) -> NextBatch:
        now = time.monotonic()
        requests: list[Request] = []
        entries: dict[int, Entry] = {}
        for entry, allocation, cache_len, chunk_len in taken:
            request = entry.round
            if entry.batch_time is None:  # the first round's: queue and inference times span all rounds
                entry.batch_time = now
                entry.cached_tokens = cache_len  # what the client's prompt found cached (usage, details)
            entry.allocation = allocation
            entries[entry.id] = entry
            requests.append(
                Request(
                    id=entry.id,
                    input_ids=request.input_ids,
                    sampling=request.sampling,
                    stopping=StoppingParams(
                        max_new_tokens=request.max_new_tokens, ignore_eos=request.ignore_eos
                    ),
                    blocks=allocation.blocks,
                    cache_len=cache_len,
                    chunk_len=chunk_len,
                    prefill_logprobs=request.decoder_input_details,
                    top_n_tokens=request.top_n_tokens,
                    adapter_index=request.adapter_index,
                )
            )
        batch = Batch(
            id=self._next_batch_id,
            requests=tuple(requests),
            max_tokens=sum(len(r.blocks) for r in requests) * self._block_size,
            max_blocks=max(len(r.blocks) for r in requests),
        )
        self._next_batch_id += 1
        return NextBatch(batch=batch, entries=entries)
