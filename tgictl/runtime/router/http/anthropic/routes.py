"""Anthropic's routes: POST /v1/messages (whole or streamed) and /v1/messages/count_tokens. Errors leave in
Anthropic's shape (error_shapes.py, by the /v1/messages prefix)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from tgictl.runtime.router.http.anthropic.schemas import CountTokensRequest, MessagesRequest
from tgictl.runtime.router.http.anthropic.translate import MessageWriter, chat_turn, generation_input
from tgictl.runtime.router.http.one_generation import OneGeneration
from tgictl.runtime.router.http.responses import TgiJSONResponse
from tgictl.runtime.router.service import RouterService


def anthropic_router(service: RouterService, auth: Callable[..., Any]) -> APIRouter:
    router = APIRouter(tags=["Anthropic"])
    protected = [Depends(auth)]

    @router.post("/v1/messages", dependencies=protected)
    async def messages(body: MessagesRequest, http: Request) -> Response:
        """Anthropic's Messages: system, turns, tools (tool_use / tool_result), thinking, streaming."""
        turn = await chat_turn(body, service.reasoning is not None).prepare(service)
        generation = await OneGeneration.start(service, generation_input(body, turn))
        writer = MessageWriter(turn, generation.request.adapter or service.model_id)
        if body.stream:
            return generation.stream(writer.stream)
        outcome = await generation.collect(http)
        if outcome is None:
            return Response(status_code=499)  # the client left; nobody reads this
        return TgiJSONResponse(writer.message(outcome))

    @router.post("/v1/messages/count_tokens", dependencies=protected)
    async def count_tokens(body: CountTokensRequest) -> Response:
        """The prompt tokens the same conversation would take (its chat template rendered, tools included)."""
        turn = await chat_turn(body, service.reasoning is not None).prepare(service)
        pieces = await service.tokenize(turn.prompt, add_special_tokens=False)
        return TgiJSONResponse({"input_tokens": len(pieces)})

    return router
