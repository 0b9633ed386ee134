"""The waiting queue and `next_batch`: which entries the next Prefill takes, with their KV blocks.

Follows TGI v3's State::next_batch (reference section 5.3): strict FIFO, blocks allocated when an
entry is taken, for input + max_new_tokens; the first entry that does not fit stops the walk (no
skipping, so no starvation). Allocations of entries pushed back are freed as never computed, so they
are never published to the prefix cache (DESIGN decision 4).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tgictl.proto.messages import Batch, Request, StoppingParams
from tgictl.runtime.router.block_allocator import BlockAllocation, KvAllocator
from tgictl.runtime.router.request import StreamEvent, ValidatedRequest


@dataclass(eq=False)
class Entry:
    """One request from the moment it is queued until it ends. Owned by the batching task."""

    request: ValidatedRequest
    send: Callable[[StreamEvent], None]  # delivers an event to the client's stream
    is_cancelled: Callable[[], bool]  # true once the client went away
    queue_time: float = field(default_factory=time.monotonic)
    id: int = -1  # assigned by the queue
    batch_time: float | None = None
    allocation: BlockAllocation | None = None


@dataclass(frozen=True)
class NextBatch:
    batch: Batch
    entries: dict[int, Entry]  # by request id, in batch order


class Queue:
    """Plain object living on the router's event loop: append from handlers, take from the batcher."""

    def __init__(self, allocator: KvAllocator, *, block_size: int, support_chunking: bool) -> None:
        self._allocator = allocator
        self._block_size = block_size
        self._support_chunking = support_chunking
        self._entries: deque[Entry] = deque()
        self._next_id = 0
        self._next_batch_id = 0
        self.dropped = 0  # entries whose client left while they waited (a metric)

    def __len__(self) -> int:
        return len(self._entries)

    def append(self, entry: Entry) -> int:
        entry.id = self._next_id
        self._next_id += 1
        self._entries.append(entry)
        return entry.id

    def drop_cancelled(self) -> list[Entry]:
        """Remove entries whose clients left; returns them so the caller can account for them."""
        gone = [e for e in self._entries if e.is_cancelled()]
        if gone:
            self._entries = deque(e for e in self._entries if not e.is_cancelled())
            self.dropped += len(gone)
        return gone

    def remove(self, predicate: Callable[[Entry], bool]) -> list[Entry]:
        """Take every waiting entry that matches (shutdown, failures); they never got blocks."""
        taken = [e for e in self._entries if predicate(e)]
        self._entries = deque(e for e in self._entries if not predicate(e))
        return taken

    def next_batch(
        self,
        min_size: int | None,
        max_size: int | None,
        prefill_budget: int,
        token_budget: int,
    ) -> NextBatch | None:
        if prefill_budget <= 0 or token_budget <= 0 or not self._entries:
            return None
        if min_size is not None and len(self._entries) < min_size:
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
            request = entry.request
            # The last generated token is sampled but never fed back, so it needs no KV slot.
            tokens = request.input_length + request.max_new_tokens - 1
            # Prompt logprobs need every prompt position recomputed, so such a request takes no prefix.
            key = None if request.decoder_input_details else request.input_ids
            allocation = self._allocator.allocate(tokens, key)
            if allocation is None:
                self._entries.appendleft(entry)
                break
            prefix_len = allocation.prefix_len
            if prefix_len >= request.input_length:
                # A fully cached prompt still needs one token through the model to yield logits.
                prefix_len = request.input_length - 1
            postfix = request.input_length - prefix_len
            chunk_len: int | None = None
            if prefill_tokens + postfix > prefill_budget:
                remaining = prefill_budget - prefill_tokens
                if self._support_chunking and remaining > 0:
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
        if min_size is not None and len(taken) < min_size:
            for entry, allocation, _, _ in reversed(taken):
                self._allocator.free(allocation, None)
                self._entries.appendleft(entry)
            return None
        return self._build(taken)

    def _build(self, taken: list[tuple[Entry, BlockAllocation, int, int | None]]) -> NextBatch:
        now = time.monotonic()
        requests: list[Request] = []
        entries: dict[int, Entry] = {}
        for entry, allocation, cache_len, chunk_len in taken:
            request = entry.request
            entry.batch_time = now
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

