"""OpenAI's routes (TGI's router/src/lib.rs ChatRequest, CompletionRequest): POST /v1/chat/completions and /v1/completions.

Every choice (n per prompt) is one request with its own permit, run concurrently (openai_run.py).
Finish reasons are OpenAI's only ("stop", "length", and "tool_calls" for an answer made of calls),
and stop strings are not in the text, streamed or not. `response_format` and `tools` become the
request's grammar (docs/architecture.md, "Guided generation").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from tgictl.errors import ValidationError
from tgictl.runtime.router.http.legacy_completions import CompletionShape, legacy_logprobs
from tgictl.runtime.router.http.openai_choices import (
    ClientBatchSizeError,
    Job,
    OpenAIRun,
)
from tgictl.runtime.router.http.chat.answer import whole_answer
from tgictl.runtime.router.http.openai_chat import OPENAI_FINISH, StreamedChoice, chat_message
from tgictl.runtime.router.http.outcome import OPENAI_FINISH_REASONS, Outcome
from tgictl.runtime.router.http.schemas_openai import ChatRequest, CompletionRequest
from tgictl.runtime.router.request import EndEvent, TokenEvent, TokenInfo
from tgictl.runtime.router.service import RouterService


def _openai_logprob(token: TokenInfo, top: Sequence[TokenInfo]) -> dict[str, Any]:
    return {
        "token": token.text,
        "logprob": token.logprob,
        "bytes": list(token.text.encode("utf-8")),
        "top_logprobs": [
            {"token": t.text, "logprob": t.logprob, "bytes": list(t.text.encode("utf-8"))} for t in top
        ],
    }


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
        turn = await body.chat_turn().prepare(service)
        top_n = (body.top_logprobs or 0) if body.logprobs else None
        jobs = [
            Job(0, i, body.generation_input(turn.prompt, max_new_tokens=body.max_new_tokens(), top_n_tokens=top_n,
                                            choice=i, add_special_tokens=False, grammar=turn.grammar))
            for i in range(body.n)
        ]
        run = OpenAIRun(service, "chatcmpl", "chat.completion")
        streamed = {job.index: StreamedChoice(turn.reader()) for job in jobs}

        def logprobs(tokens: Sequence[TokenInfo], tops: Sequence[Sequence[TokenInfo]]) -> dict[str, Any] | None:
            if not body.logprobs:
                return None
            return {"content": [_openai_logprob(t, top) for t, top in zip(tokens, tops)]}

        def chunk(job: Job, event: TokenEvent | EndEvent) -> dict[str, Any] | None:
            end = event if isinstance(event, EndEvent) else None
            delta, reason = streamed[job.index].delta(event.content, end)
            if delta is None:
                return None
            return {"index": job.index, "delta": delta, "logprobs": logprobs([event.token], [event.top_tokens]),
                    "finish_reason": reason}

        def final(job: Job, outcome: Outcome) -> dict[str, Any]:
            answer = whole_answer(turn.reader(), outcome.contents, outcome.end)
            return {
                "index": job.index,
                "message": chat_message(answer),
                "logprobs": logprobs(outcome.tokens, outcome.top_tokens),
                "finish_reason": OPENAI_FINISH[answer.finish],
            }

        return await run.respond(http, body, jobs, chunk, final, "chat.completion.chunk")

    @router.post("/v1/completions", dependencies=protected)
    async def completions(body: CompletionRequest, http: Request) -> Response:
        """OpenAI (legacy) completions: prompts as text or token ids, n choices each, `echo` with
        prompt logprobs (legacy_completions.py)."""
        shape = CompletionShape.of(body)
        prompts = body.prompts()
        if not prompts:
            raise ValidationError("`prompt` cannot be empty")
        if body.n < 1:
            raise ValidationError(f"`n` must be >= 1. Given: {body.n}")
        _check_choices(service, len(prompts) * body.n)
        texts = [p if isinstance(p, str)
                 else service.tokenizer.decode(service.validator.check_token_ids(p), skip_special_tokens=False)
                 for p in prompts]
        max_new_tokens = None if body.max_tokens is None else body.max_tokens + shape.max_new_tokens_delta
        grammar = body.response_grammar()
        jobs = [
            Job(p, p * body.n + i, body.generation_input(
                texts[p], max_new_tokens=max_new_tokens, top_n_tokens=body.logprobs, choice=i,
                add_special_tokens=True, input_ids=None if isinstance(prompt, str) else prompt,
                prompt_logprobs=shape.prompt_logprobs, grammar=grammar,
            ))
            for p, prompt in enumerate(prompts)
            for i in range(body.n)
        ]
        run = OpenAIRun(service, "cmpl", "text_completion", completion_tokens=shape.completion_tokens)
        offsets: dict[int, int] = {}

        def chunk(job: Job, event: TokenEvent | EndEvent) -> dict[str, Any]:
            reason = OPENAI_FINISH_REASONS[event.finish_reason] if isinstance(event, EndEvent) else None
            logprobs = None
            if body.logprobs is not None:
                logprobs = legacy_logprobs([event.token], [event.top_tokens], offsets.get(job.index, 0))
                offsets[job.index] = offsets.get(job.index, 0) + len(event.token.text)
            return {"index": job.index, "text": event.content, "logprobs": logprobs, "finish_reason": reason}

        def final(job: Job, outcome: Outcome) -> dict[str, Any]:
            return shape.choice(job.index, texts[job.prompt], outcome)

        return await run.respond(http, body, jobs, chunk, final, "text_completion")

    return router
