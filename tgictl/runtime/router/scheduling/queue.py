"""The waiting queue and `next_batch`: which entries the next Prefill takes, with their KV blocks.

Follows TGI v3's State::next_batch (backends/v3/src/queue.rs): strict FIFO, blocks allocated when an
entry is taken, for input + max_new_tokens; the first entry that does not fit stops the walk (no
skipping, so no starvation). Allocations of entries pushed back are freed as never computed, so they
are never published to the prefix cache (docs/architecture.md, "Decisions": Publish only computed KV).
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass

from tgictl.errors import ValidationError
from tgictl.proto.messages import Batch, Request, StoppingParams
from tgictl.runtime.router.kv.block_allocator import BlockAllocation, KvAllocator, blocks_for
from tgictl.runtime.router.request import ErrorEvent
from tgictl.runtime.router.scheduling.entry import Entry


@dataclass(frozen=True)
class NextBatch:
    batch: Batch
    entries: dict[int, Entry]  # by request id, in batch order


class Queue:
    """Plain object living on the router's event loop: append from handlers, take from the batcher."""

    def __init__(self, allocator: KvAllocator, *, block_size: int) -> None:
        self._allocator = allocator
        self._block_size = block_size
        self._entries: deque[Entry] = deque()
        self._next_id = 0
        self._next_batch_id = 0
        self.dropped = 0  # entries whose client left while they waited (a metric)

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[Entry]:
        """The queued entries, in order (a copy)."""
        return list(self._entries)

    def append(self, entry: Entry, *, first: bool = False) -> int:
        """Queue `entry` at the end, or at the head (`first`: a continuation round of a request that
        was already running goes before requests that never ran). Each round gets a fresh id: the
        shard knows every round as a request of its own."""
        entry.id = self._next_id
        self._next_id += 1
        if first:
            self._entries.appendleft(entry)
        else:
            self._entries.append(entry)
        return entry.id

    def drop_cancelled(self) -> list[Entry]:
        """Remove entries whose clients left; returns them so the caller can account for them."""
        gone = [e for e in self._entries if e.is_cancelled()]
        if gone:
            self._entries = deque(e for e in self._entries if not e.is_cancelled())
            self.dropped += len(gone)
        return gone

    def next_batch(self, max_size: int | None, prefill_budget: int) -> NextBatch | None:
        """Entries for the next Prefill, in FIFO order, while their blocks fit the allocator and their
        prompts the prefill budget (the last one may be cut into a chunk)."""
        if prefill_budget <= 0 or not self._entries:
            return None
        if max_size is not None and max_size <= 0:
            return None
        # Budgets are counted in whole blocks, as the allocator hands them out.
        prefill_budget = math.ceil(prefill_budget / self._block_size) * self._block_size

        taken: list[tuple[Entry, BlockAllocation, int, int | None]] = []
        prefill_tokens = 0
        while self._entries:
            entry = self._entries.popleft()
            if entry.is_cancelled():
                self.dropped += 1
                continue
            request = entry.round
            # The last generated token is sampled but never fed back, so it needs no KV slot.
            tokens = request.input_length + request.max_new_tokens - 1
            # Prompt logprobs need every prompt position recomputed, so such a request takes no prefix.
            # The last prompt position is always computed (its logits give the first token), so it is
            # left out of the lookup: it then lands in a block of this request's own, never in a cached
            # block that other requests read while it is written.
            key = None if request.decoder_input_details else request.input_ids[:-1]
            if blocks_for(tokens, self._block_size) > self._allocator.total_blocks:
                # Not even an empty cache could hold it: waiting would wedge the FIFO for everyone behind.
                entry.send(ErrorEvent(ValidationError(
                    f"the request needs {tokens} KV slots (input {request.input_length} + max_new_tokens "
                    f"{request.max_new_tokens} - 1) but the cache holds {self._allocator.total_blocks} "
                    f"blocks of {self._block_size}"
                )))
                continue
            # Keyed by adapter: KV computed under one adapter is never another's (docs/architecture.md, "Multi-LoRA").
            allocation = self._allocator.allocate(tokens, key, request.adapter_index)
            if allocation is None:
                self._entries.appendleft(entry)
                break
            prefix_len = allocation.prefix_len
            postfix = request.input_length - prefix_len
            chunk_len: int | None = None
            if prefill_tokens + postfix > prefill_budget:
                remaining = prefill_budget - prefill_tokens
                if remaining > 0:
                    chunk_len = remaining
                    taken.append((entry, allocation, prefix_len, chunk_len))
                else:
                    self._allocator.free(allocation, None)
                    self._entries.appendleft(entry)
                break
            prefill_tokens += postfix
            taken.append((entry, allocation, prefix_len, None))
            if max_size is not None and len(taken) >= max_size:
                break

        if not taken:
            return None
        return self._build(taken)

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
                    slots=allocation.slots,
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
            max_tokens=sum(len(r.slots) for r in requests),
            max_blocks=max(len(r.blocks) for r in requests),
        )
        self._next_batch_id += 1
        return NextBatch(batch=batch, entries=entries)

