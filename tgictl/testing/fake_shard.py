"""A fake shard client for scheduling tests: it fabricates generations instead of running a model,
but keeps batch state exactly as the real shard does (ids, chunked prompts with later chunks sized
within the router's prefill budget by the same rule, CachedBatch's max_tokens in whole blocks and
current_tokens as the next forward's tokens, filter, concatenation, blocks granted as requests grow: a
step whose rows' blocks cannot hold it is refused, and a multi-step Decode stops before it), so the
batcher's protocol use is checked (tests/unit/testing/test_fake_shard.py compares it with the real runtime). Token i of request
r is `first_token + (r * 31 + i) % span`.

FakeServiceClient also answers the start-up and health calls, so a RouterService (and its HTTP app)
runs in-process without a model: the tokens are FakeShard's arithmetic, everything else is real
(unit tests, and scripts/bench_stream_path.py, which measures the router's own cost per token)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tgictl.errors import GenerationError, InvalidRequestError
from tgictl.proto.messages import (
    Batch,
    BlockGrant,
    CachedBatch,
    FinishReason,
    GeneratedText,
    Generation,
    Info,
    LoadAdapterRequest,
    Request,
    StepResult,
    Timings,
    Tokens,
    WarmupRequest,
    WarmupResult,
)
from tgictl.proto.step_merge import merge_generations
from tgictl.runtime.router.adapters import AdapterError
from tgictl.runtime.shard.chunking import next_chunk_lengths


@dataclass
class _Live:
    request: Request
    prompt_done: int  # prompt tokens processed (cache_len counts as done)
    chunk_len: int  # tokens the next forward computes (1 once decoding)
    blocks: int  # blocks held: the request's and the granted ones
    generated: int = 0

    @classmethod
    def start(cls, request: Request) -> _Live:
        remaining = len(request.input_ids) - request.cache_len
        return cls(request, request.cache_len, request.chunk_len or remaining, len(request.blocks))

    def fits_next_step(self, block_size: int) -> bool:
        """As the real row: its next forward writes up to the position of its last token."""
        return len(self.request.input_ids) + self.generated <= self.blocks * block_size


@dataclass
class FakeShard:
    first_token: int
    span: int
    eos_token: int | None = None
    block_size: int = 16
    max_prefill_tokens: int | None = None  # the router's budget for later chunks (as Prefill sets it)
    fail_next: set[str] = field(default_factory=set)  # "prefill" / "decode": fail that call once
    # request id -> tokens it generates before it fails alone, as the real shard ends a request whose grammar
    # fails (Generation.error; it leaves the batch, the others go on)
    fail_requests: dict[int, int] = field(default_factory=dict)
    batches: dict[int, list[_Live]] = field(default_factory=dict)
    calls: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    decode_steps: list[int] = field(default_factory=list)  # the steps every Decode asked for
    grants: list[BlockGrant] = field(default_factory=list)  # every grant, in order
    step_forward_ns: int = 0  # the forward time every step reports (Timings.forward_ns, summed per call)
    forwards: int = 0
    peak_batch_size: int = 0  # the most requests one forward carried
    cache_lens: list[int] = field(default_factory=list)  # of every prefilled request, in order
    # When set: the tokens every request generates, by position after its first round's prompt of
    # `script_prompt_len` tokens (so continuation rounds, whose prompts grow, carry on the same text).
    script: tuple[int, ...] = ()
    script_prompt_len: int = 0

    def token(self, request_id: int, index: int) -> int:
        return self.first_token + (request_id * 31 + index) % self.span

    async def prefill(
        self, batch: Batch, cached: CachedBatch | None, max_prefill_tokens: int | None = None,
        grants: Sequence[BlockGrant] = (),
    ) -> StepResult:
        await asyncio.sleep(0)  # an RPC yields to the event loop, as gRPC does
        self.calls.append(("prefill", tuple(r.id for r in batch.requests)))
        self._maybe_fail("prefill")
        if max_prefill_tokens is not None:
            self.max_prefill_tokens = max_prefill_tokens
        for r in batch.requests:
            if len(r.blocks) * self.block_size < len(r.input_ids):
                raise InvalidRequestError(f"request {r.id}: its blocks cannot hold its prompt")
        self.cache_lens += [r.cache_len for r in batch.requests]
        lives = [_Live.start(r) for r in batch.requests]
        if cached is not None:
            self._grant([cached.id], grants)
            lives = self._take([cached.id]) + lives
        return self._step(batch.id, lives)

    async def decode(self, batches: Sequence[CachedBatch], steps: int = 1, grants: Sequence[BlockGrant] = ()) -> StepResult:
        await asyncio.sleep(0)
        self.calls.append(("decode", tuple(b.id for b in batches)))
        self.decode_steps.append(steps)
        self._maybe_fail("decode")
        self._grant([b.id for b in batches], grants)
        result = self._step(batches[0].id, self._take([b.id for b in batches]))
        for _ in range(steps - 1):  # as the shard answers DecodeRequest.steps (proto/step_merge.py)
            if result.batch is None or not all(live.fits_next_step(self.block_size) for live in self.batches[result.batch.id]):
                break
            more = self._step(result.batch.id, self._take([result.batch.id]))
            forward_ns = result.timings.forward_ns + more.timings.forward_ns
            result = StepResult(tuple(merge_generations(result.generations, more.generations)), more.batch,
                                Timings(forward_ns=forward_ns))
        return result

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

    def _grant(self, batch_ids: Sequence[int], grants: Sequence[BlockGrant]) -> None:
        lives = {live.request.id: live for batch_id in batch_ids for live in self.batches[batch_id]}
        for grant in grants:
            if grant.request_id not in lives:
                raise InvalidRequestError(f"a grant names request {grant.request_id}, which is not in the batch")
        for grant in grants:
            self.grants.append(grant)
            lives[grant.request_id].blocks += len(grant.blocks)

    def _take(self, batch_ids: Sequence[int]) -> list[_Live]:
        """The batches' rows, consumed only when every row's blocks hold its next step (as the real shard)."""
        lives = [live for batch_id in batch_ids for live in self.batches[batch_id]]
        for live in lives:
            if not live.fits_next_step(self.block_size):
                raise InvalidRequestError(f"request {live.request.id}: its next step writes past its blocks")
        for batch_id in batch_ids:
            del self.batches[batch_id]
        return lives

    def _maybe_fail(self, method: str) -> None:
        if method in self.fail_next:
            self.fail_next.discard(method)
            raise GenerationError(f"injected {method} failure")

    def _step(self, batch_id: int, lives: list[_Live]) -> StepResult:
        self.forwards += 1
        self.peak_batch_size = max(self.peak_batch_size, len(lives))
        generations = []
        running = []
        for live in lives:
            request = live.request
            prompt_len = len(request.input_ids)
            if live.prompt_done < prompt_len:
                live.prompt_done = min(prompt_len, live.prompt_done + live.chunk_len)
                if live.prompt_done < prompt_len:
                    running.append(live)
                    continue  # still prefilling: no token yet
            if self.fail_requests.get(request.id) == live.generated:
                generations.append(Generation(request.id, Tokens(), error=f"request {request.id} failed alone"))
                continue
            if self.script:
                token = self.script[len(request.input_ids) - self.script_prompt_len + live.generated]
            else:
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
            return StepResult(tuple(generations), None, Timings(forward_ns=self.step_forward_ns))
        progress = [(len(live.request.input_ids), live.prompt_done) for live in running]
        for live, length in zip(running, next_chunk_lengths(progress, self.max_prefill_tokens)):
            live.chunk_len = length
        self.batches[batch_id] = running
        return StepResult(tuple(generations), self._cached(batch_id), Timings(forward_ns=self.step_forward_ns))

    def _cached(self, batch_id: int) -> CachedBatch:
        lives = self.batches[batch_id]
        return CachedBatch(
            id=batch_id,
            request_ids=tuple(live.request.id for live in lives),
            max_tokens=sum(live.blocks for live in lives) * self.block_size,
            current_tokens=sum(live.chunk_len for live in lives),
        )


def fake_info(block_size: int = 16, prefix_caching: bool = True, chunking: bool = True) -> Info:
    return Info(
        dtype="float32", device_type="cpu", block_size=block_size, support_chunking=chunking,
        use_prefix_caching=prefix_caching, attention_impl="reference", model_type="llama", vocab_size=512,
        num_layers=2, max_position_embeddings=2048, eos_token_ids=(2,), world_size=1,
    )


@dataclass
class FakeServiceClient:
    """FakeShard plus Info / Warmup / Health / close, recording what the router asked."""

    shard: FakeShard = field(default_factory=lambda: FakeShard(first_token=40, span=200))
    info_reply: Info = field(default_factory=fake_info)
    supported_tokens: int = 4096
    step_delay_s: float = 0.0  # slows every Prefill/Decode, so tests can act mid-generation
    healthy: bool = True  # False: the Health RPC and the probe forward fail
    probes_fail: bool = False  # True: only the probe forward fails (the ranks are alive)
    warmups: list[WarmupRequest] = field(default_factory=list)
    probes: list[Batch] = field(default_factory=list)
    adapter_calls: list[tuple[str, int]] = field(default_factory=list)  # ("load" | "unload", adapter_index)
    closed: bool = False

    async def info(self) -> Info:
        return self.info_reply

    async def warmup(self, request: WarmupRequest) -> WarmupResult:
        self.warmups.append(request)
        total = request.max_total_tokens or min(self.supported_tokens, 2048)
        return WarmupResult(self.supported_tokens, request.max_input_tokens or total - 1, total)

    async def health(self) -> None:
        if not self.healthy:
            raise GenerationError("shard unhealthy")

    async def prefill(
        self, batch: Batch, cached: CachedBatch | None, max_prefill_tokens: int | None = None,
        grants: Sequence[BlockGrant] = (),
    ) -> StepResult:
        if batch.id == 2**64 - 1:  # the health probe
            self.probes.append(batch)
            if not self.healthy or self.probes_fail:
                raise GenerationError("probe failed")
            return await self.shard.prefill(batch, None)
        await asyncio.sleep(self.step_delay_s)
        return await self.shard.prefill(batch, cached, max_prefill_tokens, grants)

    async def decode(self, batches: Sequence[CachedBatch], steps: int = 1, grants: Sequence[BlockGrant] = ()) -> StepResult:
        await asyncio.sleep(self.step_delay_s)
        return await self.shard.decode(batches, steps, grants)

    async def filter_batch(self, batch_id: int, request_ids: Sequence[int]) -> CachedBatch:
        return await self.shard.filter_batch(batch_id, request_ids)

    async def clear_cache(self, batch_id: int | None) -> None:
        await self.shard.clear_cache(batch_id)

    async def load_adapter(self, request: LoadAdapterRequest) -> None:
        """Refuses a path that is not a directory, as the real shard refuses one it cannot read."""
        self.adapter_calls.append(("load", request.adapter_index))
        if not Path(request.path).is_dir():
            raise AdapterError(f"LoRA adapter {request.name!r}: {request.path} is not a directory")

    async def unload_adapter(self, adapter_index: int) -> None:
        self.adapter_calls.append(("unload", adapter_index))

    async def close(self) -> None:
        self.closed = True
