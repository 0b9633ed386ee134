"""OpenAI's Responses routes: POST /v1/responses (whole or streamed), GET /v1/responses/{id} (a stored one).
Errors leave in OpenAI's shape (the /v1/ prefix)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from tgictl.errors import TgictlError
from tgictl.runtime.router.http.chat.messages import ChatMessage
from tgictl.runtime.router.http.one_generation import OneGeneration
from tgictl.runtime.router.http.openai_responses.output import ResponseWriter
from tgictl.runtime.router.http.openai_responses.schemas import ResponsesRequest
from tgictl.runtime.router.http.openai_responses.store import ResponseStore, StoredResponse
from tgictl.runtime.router.http.openai_responses.translate import chat_turn, generation_input
from tgictl.runtime.router.http.responses import TgiJSONResponse
from tgictl.runtime.router.service import RouterService


class ResponseNotFoundError(TgictlError):
    """A response id the store does not hold: 404 on GET, 400 as a `previous_response_id` (OpenAI's)."""

    http_status = 404
    error_type = "not_found"

    def __init__(self, response_id: str, previous: bool = False) -> None:
        super().__init__(
            f"{'Previous response' if previous else 'Response'} with id {response_id!r} not found: responses are kept "
            "in the server's memory (the most recent ones, not those created with `store: false`) and none survive "
            "its restart"
        )
        if previous:
            self.http_status = 400
            self.error_type = "previous_response_not_found"
            self.param = "previous_response_id"


def responses_router(service: RouterService, auth: Callable[..., Any], store: ResponseStore | None = None) -> APIRouter:
    router = APIRouter(tags=["OpenAI"])
    protected = [Depends(auth)]
    kept = store if store is not None else ResponseStore()

    @router.post("/v1/responses", dependencies=protected)
    async def create(body: ResponsesRequest, http: Request) -> Response:
        """OpenAI's Responses: input items, instructions, function tools, text.format, previous_response_id."""
        earlier: tuple[ChatMessage, ...] = ()
        if body.previous_response_id is not None:
            previous = kept.get(body.previous_response_id)
            if previous is None:
                raise ResponseNotFoundError(body.previous_response_id, previous=True)
            earlier = previous.conversation
        turn, conversation = chat_turn(body, earlier)
        prepared = await turn.prepare(service)
        generation = await OneGeneration.start(service, generation_input(body, prepared))
        writer = ResponseWriter(body, prepared, generation.request.adapter or service.model_id)

        def keep(response: dict[str, Any], answer: ChatMessage) -> None:
            if body.store:
                kept.put(writer.id, StoredResponse((*conversation, answer), response))

        if body.stream:
            async def events(one: OneGeneration) -> AsyncGenerator[str, None]:
                done: list[tuple[dict[str, Any], ChatMessage]] = []
                async for text in writer.stream(one, done):
                    yield text
                for response, answer in done:
                    keep(response, answer)

            return generation.stream(events)
        outcome = await generation.collect(http)
        if outcome is None:
            return Response(status_code=499)  # the client left; nobody reads this
        response, answer = writer.whole(outcome)
        keep(response, answer)
        return TgiJSONResponse(response)

    @router.get("/v1/responses/{response_id}", dependencies=protected)
    async def retrieve(response_id: str) -> Response:
        """A response kept in the server's memory (see POST's `store`)."""
        stored = kept.get(response_id)
        if stored is None:
            raise ResponseNotFoundError(response_id)
        return TgiJSONResponse(stored.response)

    return router
