"""OpenAI's routes (reference 2.5, 2.6): POST /v1/chat/completions and /v1/completions.

Every choice (n per prompt) is one request with its own permit, run concurrently. Streams interleave
the choices' chunks and end with `data: [DONE]`; errors after the first byte travel in-band as
`{"error": {...}}`. Finish reasons are OpenAI's only ("stop", "length"), and stop strings are not in
the text, streamed or not.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from tgictl import __version__
from tgictl.errors import TgictlError, ValidationError
from tgictl.runtime.router.generation import OPENAI_FINISH_REASONS, Outcome, collect_all
from tgictl.runtime.router.request import EndEvent, ErrorEvent, StreamEvent, TokenEvent, TokenInfo
from tgictl.runtime.router.responses import SSEResponse, TgiJSONResponse, sse, until_disconnect
from tgictl.runtime.router.schemas_openai import ChatRequest, CompletionRequest, SamplingFields
from tgictl.runtime.router.service import Admission, RouterService
from tgictl.runtime.router.validation import GenerationInput


class ClientBatchSizeError(TgictlError):
    http_status = 422
    error_type = "batch size exceeded"  # TGI's words


@dataclass
class Job:
    """One choice: which prompt it answers, its index among all choices, its request."""

    prompt: int
    index: int
    request: GenerationInput


def _fingerprint() -> str:
    return f"{__version__}-native"


def _openai_logprob(token: TokenInfo, top: Sequence[TokenInfo]) -> dict[str, Any]:
    return {
        "token": token.text,
        "logprob": token.logprob,
        "bytes": list(token.text.encode("utf-8")),
        "top_logprobs": [
            {"token": t.text, "logprob": t.logprob, "bytes": list(t.text.encode("utf-8"))} for t in top
        ],
    }


def _legacy_logprobs(tokens: Sequence[TokenInfo], tops: Sequence[Sequence[TokenInfo]], offset: int) -> dict[str, Any]:
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token.text)
    return {
        "tokens": [t.text for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [{t.text: t.logprob for t in top} for top in tops],
        "text_offset": offsets,
    }


async def _start(service: RouterService, jobs: list[Job]) -> tuple[list[Admission], list[Any]]:
    """Permits then validation for every job; on any failure, release what was taken."""
    admissions: list[Admission] = []
    try:
        for _ in jobs:
            admissions.append(service.admit())
        validated = [await service.validate(a, job.request) for a, job in zip(admissions, jobs)]
    except BaseException:
        for admission in admissions:
            admission.release()
        raise
    return admissions, validated


async def _merge(streams: list[AsyncIterator[StreamEvent]]) -> AsyncIterator[tuple[int, StreamEvent]]:
    """Interleave several streams as their events come; closing this closes (cancels) them all."""
    queue: asyncio.Queue[tuple[int, StreamEvent | None]] = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[StreamEvent]) -> None:
        try:
            async for event in stream:
                queue.put_nowait((i, event))
        finally:
            queue.put_nowait((i, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        open_streams = len(tasks)
        while open_streams:
            i, event = await queue.get()
            if event is None:
                open_streams -= 1
                continue
            yield i, event
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _prompt_tokens(jobs: list[Job], ends: dict[int, EndEvent]) -> int:
    """Each prompt counts once, however many choices it has."""
    seen: dict[int, int] = {}
    for job in jobs:
        if job.index in ends:
            seen[job.prompt] = ends[job.index].input_length
    return sum(seen.values())


class _Run:
    """What one OpenAI call shares between its choices."""

    def __init__(self, service: RouterService, kind: str, obj: str) -> None:
        self.service = service
        self.id = f"{kind}-{uuid.uuid4().hex}"
        self.object = obj
        self.created = int(time.time())
        self.model = service.model_id

    def envelope(self, obj: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id, "object": obj, "created": self.created, "model": self.model,
            "system_fingerprint": _fingerprint(), "choices": choices, **extra,
        }

    async def respond(
        self,
        http: Request,
        body: SamplingFields,
        jobs: list[Job],
        chunk: Callable[[Job, TokenEvent | EndEvent], dict[str, Any]],
        final: Callable[[Job, Outcome], dict[str, Any]],
        chunk_object: str,
    ) -> Response:
        admissions, validated = await _start(self.service, jobs)
        streams = [self.service.stream(a, v) for a, v in zip(admissions, validated)]

        def release() -> None:
            for admission in admissions:
                admission.release()

        if body.stream:
            events = self._events(jobs, streams, chunk, chunk_object, body.include_usage())
            return SSEResponse(events, on_close=release)
        try:
            outcomes = await until_disconnect(http, collect_all(streams))
        finally:
            release()
        if outcomes is None:
            return Response(status_code=499)
        ends = {job.index: o.end for job, o in zip(jobs, outcomes)}
        usage = _usage(_prompt_tokens(jobs, ends), sum(o.end.generated_tokens for o in outcomes))
        choices = [final(job, o) for job, o in zip(jobs, outcomes)]
        return TgiJSONResponse(self.envelope(self.object, choices, usage=usage))

    async def _events(
        self,
        jobs: list[Job],
        streams: list[AsyncIterator[StreamEvent]],
        chunk: Callable[[Job, TokenEvent | EndEvent], dict[str, Any]],
        chunk_object: str,
        include_usage: bool,
    ) -> AsyncIterator[str]:
        ends: dict[int, EndEvent] = {}
        usage_key = {"usage": None} if include_usage else {}
        merged = _merge(streams)
        try:
            async for i, event in merged:
                if isinstance(event, ErrorEvent):
                    err = event.error
                    yield sse({"error": {"message": err.message, "type": err.error_type,
                                         "http_status_code": err.http_status}})
                    yield sse("[DONE]")
                    return
                if isinstance(event, (TokenEvent, EndEvent)):
                    if isinstance(event, EndEvent):
                        ends[jobs[i].index] = event
                    yield sse(self.envelope(chunk_object, [chunk(jobs[i], event)], **usage_key))
            if len(ends) < len(jobs):
                yield sse({"error": {"message": "Incomplete generation stream",
                                     "type": "incomplete_generation_stream", "http_status_code": 500}})
            elif include_usage:
                completion = sum(e.generated_tokens for e in ends.values())
                yield sse(self.envelope(chunk_object, [], usage=_usage(_prompt_tokens(jobs, ends), completion)))
            yield sse("[DONE]")
        finally:
            await merged.aclose()


def continue_final_message(text: str, messages: Sequence[dict[str, Any]]) -> str:
    """A conversation ending with an assistant message is continued, not answered (TGI): the
    rendered prompt stops right after that message's content, without its end-of-turn."""
    last = messages[-1]
    content = last.get("content")
    if last.get("role") != "assistant" or not isinstance(content, str) or not content:
        return text
    end = text.rfind(content)
    return text if end < 0 else text[: end + len(content)].rstrip()


def _check_choices(service: RouterService, count: int) -> None:
    limit = service.config.max_client_batch_size
    if count > limit:
        raise ClientBatchSizeError(
            f"Number of choices (prompts x n) exceeds the maximum allowed batch size of {limit}. Given: {count}"
        )


def openai_router(service: RouterService, auth: Callable[..., Any]) -> APIRouter:
    router = APIRouter(tags=["OpenAI"])
    protected = [Depends(auth)]

    @router.post("/v1/chat/completions", dependencies=protected)
    async def chat_completions(body: ChatRequest, http: Request) -> Response:
        """OpenAI chat completions: the model's chat template, n choices, logprobs, streaming."""
        body.check_supported()
        if body.n < 1:
            raise ValidationError(f"`n` must be >= 1. Given: {body.n}")
        _check_choices(service, body.n)
        messages = [m.template_dict() for m in body.messages]
        text = continue_final_message(await service.render_chat(messages, body.tools), messages)
        top_n = (body.top_logprobs or 0) if body.logprobs else None
        jobs = [
            Job(0, i, body.generation_input(text, max_new_tokens=body.max_new_tokens(), top_n_tokens=top_n,
                                            choice=i, add_special_tokens=False))
            for i in range(body.n)
        ]
        run = _Run(service, "chatcmpl", "chat.completion")
        started: set[int] = set()

        def logprobs(tokens: Sequence[TokenInfo], tops: Sequence[Sequence[TokenInfo]]) -> dict[str, Any] | None:
            if not body.logprobs:
                return None
            return {"content": [_openai_logprob(t, top) for t, top in zip(tokens, tops)]}

        def chunk(job: Job, event: TokenEvent | EndEvent) -> dict[str, Any]:
            delta: dict[str, Any] = {"content": event.content}
            if job.index not in started:
                started.add(job.index)
                delta = {"role": "assistant", **delta}
            reason = OPENAI_FINISH_REASONS[event.finish_reason] if isinstance(event, EndEvent) else None
            return {"index": job.index, "delta": delta, "logprobs": logprobs([event.token], [event.top_tokens]),
                    "finish_reason": reason}

        def final(job: Job, outcome: Outcome) -> dict[str, Any]:
            return {
                "index": job.index,
                "message": {"role": "assistant", "content": outcome.end.generated_text},
                "logprobs": logprobs(outcome.tokens, outcome.top_tokens),
                "finish_reason": OPENAI_FINISH_REASONS[outcome.end.finish_reason],
            }

        return await run.respond(http, body, jobs, chunk, final, "chat.completion.chunk")

    @router.post("/v1/completions", dependencies=protected)
    async def completions(body: CompletionRequest, http: Request) -> Response:
        """OpenAI (legacy) completions: a prompt or a list of prompts, n choices each."""
        if body.suffix is not None:
            raise ValidationError("`suffix` is not supported")
        if body.echo:
            raise ValidationError("`echo` is not supported")
        prompts = body.prompts()
        if not prompts:
            raise ValidationError("`prompt` cannot be empty")
        if body.n < 1:
            raise ValidationError(f"`n` must be >= 1. Given: {body.n}")
        _check_choices(service, len(prompts) * body.n)
        top_n = body.logprobs
        jobs = [
            Job(p, p * body.n + i, body.generation_input(prompt, max_new_tokens=body.max_tokens, top_n_tokens=top_n,
                                                        choice=i, add_special_tokens=True))
            for p, prompt in enumerate(prompts)
            for i in range(body.n)
        ]
        run = _Run(service, "cmpl", "text_completion")
        offsets: dict[int, int] = {}

        def chunk(job: Job, event: TokenEvent | EndEvent) -> dict[str, Any]:
            reason = OPENAI_FINISH_REASONS[event.finish_reason] if isinstance(event, EndEvent) else None
            logprobs = None
            if body.logprobs is not None:
                logprobs = _legacy_logprobs([event.token], [event.top_tokens], offsets.get(job.index, 0))
                offsets[job.index] = offsets.get(job.index, 0) + len(event.token.text)
            return {"index": job.index, "text": event.content, "logprobs": logprobs, "finish_reason": reason}

        def final(job: Job, outcome: Outcome) -> dict[str, Any]:
            logprobs = None
            if body.logprobs is not None:
                logprobs = _legacy_logprobs(outcome.tokens, outcome.top_tokens, 0)
            return {
                "index": job.index,
                "text": outcome.end.generated_text,
                "logprobs": logprobs,
                "finish_reason": OPENAI_FINISH_REASONS[outcome.end.finish_reason],
            }

        return await run.respond(http, body, jobs, chunk, final, "text_completion")

    return router
