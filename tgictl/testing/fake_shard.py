"""A fake shard client for scheduling tests: it fabricates generations instead of running a model,
but keeps real batch state (ids, chunked prompts, filter, concatenation) so the batcher's protocol use
is checked. Token i of request r is `first_token + (r * 31 + i) % span`."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from tgictl.errors import GenerationError
from tgictl.proto.messages import (
    Batch,
    CachedBatch,
    FinishReason,
    GeneratedText,
    Generation,
    Request,
    StepResult,
    Tokens,
)


@dataclass
class _Live:
    request: Request
    prompt_done: int  # prompt tokens processed (cache_len counts as done)
    generated: int = 0


@dataclass
class FakeShard:
    first_token: int
    span: int
    eos_token: int | None = None
    fail_next: set[str] = field(default_factory=set)  # "prefill" / "decode": fail that call once
    batches: dict[int, list[_Live]] = field(default_factory=dict)
    calls: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    forwards: int = 0

    def token(self, request_id: int, index: int) -> int:
        return self.first_token + (request_id * 31 + index) % self.span

    async def prefill(self, batch: Batch, cached: CachedBatch | None) -> StepResult:
        await asyncio.sleep(0)  # an RPC yields to the event loop, as gRPC does
        self.calls.append(("prefill", tuple(r.id for r in batch.requests)))
        self._maybe_fail("prefill")
        lives = [_Live(r, r.cache_len) for r in batch.requests]
        if cached is not None:
            lives = self.batches.pop(cached.id) + lives
        return self._step(batch.id, lives, first_chunk=True)

    async def decode(self, batches: Sequence[CachedBatch]) -> StepResult:
        await asyncio.sleep(0)
        self.calls.append(("decode", tuple(b.id for b in batches)))
        self._maybe_fail("decode")
        lives = [live for b in batches for live in self.batches.pop(b.id)]
        return self._step(batches[0].id, lives, first_chunk=False)

    async def filter_batch(self, batch_id: int, request_ids: Sequence[int]) -> CachedBatch:
        self.calls.append(("filter", tuple(request_ids)))
        keep = set(request_ids)
        self.batches[batch_id] = [live for live in self.batches[batch_id] if live.request.id in keep]
        return self._cached(batch_id)

    async def clear_cache(self, batch_id: int | None) -> None:
        self.calls.append(("clear", () if batch_id is None else (batch_id,)))
        if batch_id is None:
            self.batches.clear()
        else:
            self.batches.pop(batch_id, None)

    def _maybe_fail(self, method: str) -> None:
        if method in self.fail_next:
            self.fail_next.discard(method)
            raise GenerationError(f"injected {method} failure")

    def _step(self, batch_id: int, lives: list[_Live], first_chunk: bool) -> StepResult:
        self.forwards += 1
        generations = []
        running = []
        for live in lives:
            request = live.request
            prompt_len = len(request.input_ids)
            if live.prompt_done < prompt_len:
                chunk = request.chunk_len if (first_chunk and request.chunk_len) else prompt_len
                live.prompt_done = min(prompt_len, live.prompt_done + chunk)
                if live.prompt_done < prompt_len:
                    running.append(live)
                    continue  # still prefilling: no token yet
            token = self.token(request.id, live.generated)
            live.generated += 1
            finish = None
            if live.generated >= request.stopping.max_new_tokens:
                finish = FinishReason.LENGTH
            elif token == self.eos_token and not request.stopping.ignore_eos:
                finish = FinishReason.EOS_TOKEN
            done = None if finish is None else GeneratedText(live.generated, finish, None)
            generations.append(Generation(request.id, Tokens((token,), (-0.5,)), generated_text=done))
            if finish is None:
                running.append(live)
        if not running:
            return StepResult(tuple(generations), None)
        self.batches[batch_id] = running
        return StepResult(tuple(generations), self._cached(batch_id))

    def _cached(self, batch_id: int) -> CachedBatch:
        lives = self.batches[batch_id]
        current = sum(
            1 if live.prompt_done >= len(live.request.input_ids) else len(live.request.input_ids) - live.prompt_done
            for live in lives
        )
        return CachedBatch(
            id=batch_id,
            request_ids=tuple(live.request.id for live in lives),
            max_tokens=sum(len(live.request.slots) for live in lives),
            current_tokens=current,
        )
