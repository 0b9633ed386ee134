"""TGI's native routes (router/src/server.rs): /generate, /generate_stream, / (compat), /tokenize,
/health, /info, /metrics, /v1/models."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from tgictl import __version__
from tgictl.errors import TgictlError
from tgictl.runtime.router.http.error_shapes import tgi_error_body
from tgictl.runtime.router.http.outcome import (
    TGI_FINISH_REASONS,
    Outcome,
    collect_all,
    prefill_dict,
    tgi_text,
    token_dict,
)
from tgictl.runtime.router.http.responses import (
    KEEP_ALIVE,
    KEEP_ALIVE_S,
    SSEResponse,
    TgiJSONResponse,
    in_bursts,
    sse,
    until_disconnect,
)
from tgictl.runtime.router.http.schemas_tgi import (
    CompatGenerateRequest,
    GenerateRequest,
    to_generation_input,
)
from tgictl.runtime.router.http.worker_contract import model_card
from tgictl.runtime.router.metrics import METRICS_CONTENT_TYPE
from tgictl.runtime.router.request import EndEvent, ErrorEvent, TokenEvent
from tgictl.runtime.router.scheduling.event_channel import EventChannel
from tgictl.runtime.router.service import Admission, RouterService


def compute_type(service: RouterService) -> str:
    return f"{service.info.world_size}-{service.info.device_type}"


def _details(outcome: Outcome, with_prefill: bool) -> dict[str, Any]:
    end = outcome.end
    details: dict[str, Any] = {
        "finish_reason": TGI_FINISH_REASONS[end.finish_reason],
        "generated_tokens": end.generated_tokens,
        "seed": end.seed,
        "cached_tokens": end.cached_tokens,  # tgictl extension: prompt tokens the radix cache supplied
        "prefill": [prefill_dict(t) for t in outcome.prefill] if with_prefill else [],
        "tokens": [token_dict(t) for t in outcome.tokens],
    }
    if any(outcome.top_tokens):
        details["top_tokens"] = [[token_dict(t) for t in top] for top in outcome.top_tokens]
    return details


def _headers(service: RouterService, admissions: list[Admission], outcome: Outcome, inputs: str) -> dict[str, str]:
    end = outcome.end
    total_s = time.monotonic() - admissions[0].start
    validation_s = sum(a.validation_s for a in admissions)
    per_token = end.inference_s / end.generated_tokens if end.generated_tokens else 0.0
    return {
        "x-compute-type": compute_type(service),
        "x-compute-time": f"{total_s:.6f}",
        "x-compute-characters": str(len(inputs)),
        "x-total-time": str(int(total_s * 1000)),
        "x-validation-time": str(int(validation_s * 1000)),
        "x-queue-time": str(int(end.queued_s * 1000)),
        "x-inference-time": str(int(end.inference_s * 1000)),
        "x-time-per-token": str(int(per_token * 1000)),
        "x-prompt-tokens": str(end.input_length),
        "x-generated-tokens": str(end.generated_tokens),
    }


async def _generate(
    service: RouterService, http: Request, body: GenerateRequest, full_text_default: bool
) -> tuple[dict[str, Any], dict[str, str]] | None:
    """The response body and headers, or None when the client left."""
    params = body.parameters
    best_of = service.validator.validate_best_of(params.best_of) if params.best_of not in (None, 1) else 1
    request = to_generation_input(body, stream=False)
    admissions: list[Admission] = []
    try:
        for _ in range(best_of):  # each sequence holds its own permit, as in TGI
            admissions.append(service.admit())
        validated = [await service.validate(a, request) for a in admissions]
        outcomes = await until_disconnect(http, collect_all(service.open(admissions, validated)))
    finally:
        for admission in admissions:
            admission.release()
    if outcomes is None:
        return None
    best = max(outcomes, key=lambda o: o.mean_logprob)
    return_full_text = params.return_full_text if params.return_full_text is not None else full_text_default
    prefix = body.inputs if return_full_text else ""
    content: dict[str, Any] = {"generated_text": prefix + tgi_text(best.end)}
    if params.details or params.decoder_input_details:
        with_prefill = bool(params.decoder_input_details)
        details = _details(best, with_prefill)
        if best_of > 1:
            details["best_of_sequences"] = [
                {"generated_text": prefix + tgi_text(o.end), **_details(o, with_prefill)}
                for o in outcomes if o is not best
            ]
        content["details"] = details
    return content, _headers(service, admissions, best, body.inputs)


def _json(answer: tuple[Any, dict[str, str]] | None, as_list: bool = False) -> Response:
    if answer is None:  # the client left; nobody reads this (nginx's "client closed request")
        return Response(status_code=499)
    content, headers = answer
    return TgiJSONResponse([content] if as_list else content, headers=headers)


async def _events(
    service: RouterService, admission: Admission, body: GenerateRequest, full_text: bool
) -> AsyncIterator[str]:
    try:
        validated = await service.validate(admission, to_generation_input(body, stream=True))
    except TgictlError as err:  # validation runs inside the stream: TGI sends it in-band
        yield sse(tgi_error_body(err))
        return
    channel = service.open([admission], [validated])
    bursts = in_bursts(channel, _messages(channel, body, full_text))
    try:
        async for text in bursts:
            yield text
    finally:
        await bursts.aclose()


async def _messages(channel: EventChannel, body: GenerateRequest, full_text: bool) -> AsyncGenerator[str, None]:
    """The SSE events of one generation read from `channel`, which closes when they end."""
    params = body.parameters
    index = 0
    try:
        while not channel.done:
            item = await channel.next(KEEP_ALIVE_S)
            if item is None:
                yield KEEP_ALIVE  # proxies see traffic while a request waits
                continue
            event = item[1]
            if isinstance(event, ErrorEvent):
                yield sse(tgi_error_body(event.error))
                return
            if not isinstance(event, (TokenEvent, EndEvent)):
                continue
            index += 1
            message: dict[str, Any] = {"index": index, "token": token_dict(event.token)}
            if event.top_tokens:
                message["top_tokens"] = [token_dict(t) for t in event.top_tokens]
            message["generated_text"] = None
            message["details"] = None
            if isinstance(event, EndEvent):
                message["generated_text"] = (body.inputs if full_text else "") + tgi_text(event)
                if params.details:
                    message["details"] = {
                        "finish_reason": TGI_FINISH_REASONS[event.finish_reason],
                        "generated_tokens": event.generated_tokens,
                        "seed": event.seed,
                        "input_length": event.input_length,
                        "cached_tokens": event.cached_tokens,
                    }
                yield sse(message)
                return
            yield sse(message)
    finally:
        channel.close()


def _stream(service: RouterService, body: GenerateRequest, full_text_default: bool) -> Response:
    admission = service.admit()  # 429 / 503 before the stream starts
    params = body.parameters
    full_text = params.return_full_text if params.return_full_text is not None else full_text_default
    headers = {"x-compute-type": compute_type(service), "x-compute-characters": str(len(body.inputs))}
    return SSEResponse(_events(service, admission, body, full_text), on_close=admission.release, headers=headers)


def tgi_router(service: RouterService, auth: Callable[..., Any]) -> APIRouter:
    router = APIRouter()
    protected = [Depends(auth)]

    @router.post("/generate", dependencies=protected, tags=["Text Generation Inference"])
    async def generate(body: CompatGenerateRequest, http: Request) -> Response:
        """Generate tokens; with `stream: true` (what a gateway's /generate forwards) as /generate_stream."""
        if body.stream:
            return _stream(service, body, full_text_default=False)
        return _json(await _generate(service, http, body, full_text_default=False))

    @router.post("/generate_stream", dependencies=protected, tags=["Text Generation Inference"])
    async def generate_stream(body: GenerateRequest) -> Response:
        """Generate a stream of token events (server-sent events)."""
        return _stream(service, body, full_text_default=False)

    @router.post("/", dependencies=protected, tags=["Text Generation Inference"])
    async def compat_generate(body: CompatGenerateRequest, http: Request) -> Response:
        """/generate (answered as a list of one) or /generate_stream when `stream` is true."""
        if body.stream:
            return _stream(service, body, full_text_default=True)
        return _json(await _generate(service, http, body, full_text_default=True), as_list=True)

    @router.post("/tokenize", dependencies=protected, tags=["Text Generation Inference"])
    async def tokenize(body: GenerateRequest) -> Response:
        """Tokenize the inputs: ids with their character offsets."""
        pieces = await service.tokenize(body.inputs)
        return TgiJSONResponse(
            [{"id": i, "text": body.inputs[start:stop], "start": start, "stop": stop} for i, start, stop in pieces]
        )

    @router.get("/health", tags=["Text Generation Inference"])
    async def health() -> Response:
        """200 when the shards can serve (after a generation error: when a real forward succeeds)."""
        await service.check_health()
        return Response(status_code=200)

    @router.get("/info", dependencies=protected, tags=["Text Generation Inference"])
    async def info() -> Response:
        """Model and limits."""
        config, limits = service.config, service.limits
        return TgiJSONResponse(
            {
                "model_id": service.model_id,
                "model_sha": None,
                "model_pipeline_tag": "text-generation",
                "model_dtype": service.info.dtype,
                "model_device_type": service.info.device_type,
                "max_concurrent_requests": config.max_concurrent_requests,
                "max_best_of": config.max_best_of,
                "max_stop_sequences": config.max_stop_sequences,
                "max_input_tokens": limits.max_input_tokens,
                "max_total_tokens": limits.max_total_tokens,
                "max_batch_prefill_tokens": limits.max_batch_prefill_tokens,
                "max_batch_total_tokens": limits.max_batch_total_tokens,
                "max_batch_size": limits.max_batch_size,
                "block_size": service.info.block_size,
                "prefix_caching": service.prefix_caching,
                "speculate": service.info.speculate,
                # LoRA adapters a request may name (parameters.adapter_id, OpenAI `model`), in load order.
                "lora_adapters": list(service.adapters.slots.loaded),
                "validation_workers": config.validation_workers,
                "max_client_batch_size": config.max_client_batch_size,
                "router": "tgictl-router",
                "version": __version__,
                "sha": None,
                "docker_label": None,
            }
        )

    @router.get("/metrics", tags=["Text Generation Inference"])
    async def metrics() -> Response:
        """Prometheus metrics."""
        return Response(service.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    @router.get("/v1/models", dependencies=protected, tags=["OpenAI"])
    async def models() -> Response:
        """The served model and its LoRA adapters (each a `model` a request may name), OpenAI style."""
        base = model_card(service, service.model_id)
        adapters = [model_card(service, name, parent=service.model_id) for name in service.adapters.slots.loaded]
        return TgiJSONResponse({"object": "list", "data": [base, *adapters]})

    return router
