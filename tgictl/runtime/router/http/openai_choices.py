"""One OpenAI call run as n choices: permits and validation for all, non-stream collection, and the
interleaved SSE stream of their chunks (one EventChannel carries them all) ending with `data: [DONE]`
(errors in-band after the first byte)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from tgictl import __version__
from tgictl.errors import TgictlError
from tgictl.runtime.router.http.error_shapes import openai_error_body
from tgictl.runtime.router.http.outcome import Outcome, collect_all
from tgictl.runtime.router.http.responses import (
    KEEP_ALIVE,
    KEEP_ALIVE_S,
    SSEResponse,
    TgiJSONResponse,
    in_bursts,
    sse,
    until_disconnect,
)
from tgictl.runtime.router.http.schemas_openai import SamplingFields
from tgictl.runtime.router.request import EndEvent, ErrorEvent, TokenEvent
from tgictl.runtime.router.scheduling.event_channel import EventChannel
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


def fingerprint() -> str:
    return f"{__version__}-native"


async def start_jobs(service: RouterService, jobs: list[Job]) -> tuple[list[Admission], list[Any]]:
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


def _usage(jobs: list[Job], ends: dict[int, EndEvent], counted: Callable[[int], int]) -> dict[str, Any]:
    """OpenAI's usage; `prompt_tokens_details.cached_tokens` counts the prompt tokens whose KV came
    from the radix cache (docs/architecture.md, "Memory model"). `counted`: the completion tokens a
    choice returns of those it generated."""
    prompt, cached = _prompt_tokens(jobs, ends)
    completion = sum(counted(e.generated_tokens) for e in ends.values())
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _prompt_tokens(jobs: list[Job], ends: dict[int, EndEvent]) -> tuple[int, int]:
    """Prompt and cached prompt tokens; each prompt counts once, however many choices it has."""
    seen: dict[int, EndEvent] = {}
    for job in jobs:
        if job.index in ends:
            seen[job.prompt] = ends[job.index]
    return sum(e.input_length for e in seen.values()), sum(e.cached_tokens for e in seen.values())


class OpenAIRun:
    """What one OpenAI call shares between its choices."""

    def __init__(
        self, service: RouterService, kind: str, obj: str, completion_tokens: Callable[[int], int] = lambda n: n
    ) -> None:
        self.service = service
        self.completion_tokens = completion_tokens
        self.id = f"{kind}-{uuid.uuid4().hex}"
        self.object = obj
        self.created = int(time.time())
        self.model = service.model_id

    def envelope(self, obj: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id, "object": obj, "created": self.created, "model": self.model,
            "system_fingerprint": fingerprint(), "choices": choices, **extra,
        }

    async def respond(
        self,
        http: Request,
        body: SamplingFields,
        jobs: list[Job],
        chunk: Callable[[Job, TokenEvent | EndEvent], dict[str, Any] | None],
        final: Callable[[Job, Outcome], dict[str, Any]],
        chunk_object: str,
    ) -> Response:
        """`chunk` may return None for an event that releases nothing yet (a tool call being read)."""
        admissions, validated = await start_jobs(self.service, jobs)
        if validated and validated[0].adapter is not None:  # every choice names the same `model`
            self.model = validated[0].adapter  # the adapter's name, as the client asked (vLLM's echo)
        channel = self.service.open(admissions, validated)

        def release() -> None:
            for admission in admissions:
                admission.release()

        if body.stream:
            events = self._events(jobs, channel, chunk, chunk_object, body.include_usage())
            return SSEResponse(in_bursts(channel, events), on_close=release)
        try:
            outcomes = await until_disconnect(http, collect_all(channel))
        finally:
            release()
        if outcomes is None:
            return Response(status_code=499)
        ends = {job.index: o.end for job, o in zip(jobs, outcomes)}
        usage = _usage(jobs, ends, self.completion_tokens)
        choices = [final(job, o) for job, o in zip(jobs, outcomes)]
        return TgiJSONResponse(self.envelope(self.object, choices, usage=usage))

    async def _events(
        self,
        jobs: list[Job],
        channel: EventChannel,
        chunk: Callable[[Job, TokenEvent | EndEvent], dict[str, Any] | None],
        chunk_object: str,
        include_usage: bool,
    ) -> AsyncGenerator[str, None]:
        ends: dict[int, EndEvent] = {}
        usage_key = {"usage": None} if include_usage else {}
        try:
            while not channel.done:
                item = await channel.next(KEEP_ALIVE_S)
                if item is None:
                    yield KEEP_ALIVE
                    continue
                i, event = item
                if isinstance(event, ErrorEvent):
                    yield sse(openai_error_body(event.error))
                    yield sse("[DONE]")
                    return
                if isinstance(event, (TokenEvent, EndEvent)):
                    if isinstance(event, EndEvent):
                        ends[jobs[i].index] = event
                    choice = chunk(jobs[i], event)
                    if choice is not None:
                        yield sse(self.envelope(chunk_object, [choice], **usage_key))
            if include_usage:
                yield sse(self.envelope(chunk_object, [], usage=_usage(jobs, ends, self.completion_tokens)))
            yield sse("[DONE]")
        finally:
            channel.close()
