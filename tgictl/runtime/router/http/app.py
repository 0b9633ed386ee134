"""The FastAPI app: routes, an error body for every failure, API key, CORS and the payload limit.

Every error leaves in the shape of the API whose route received it (error_shapes.py: TGI's
`{"error", "error_type"}`, OpenAI's `{"error": {"message", "type", "param", "code"}}` under /v1/): our
own errors with their status, malformed JSON as 400, a body of the wrong shape or types as 422, a wrong
content type as 415, an oversized body as 413, unknown paths as 404 - never FastAPI's `detail` format,
never a 500 for a client's mistake.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tgictl import __version__
from tgictl.errors import PayloadTooLargeError, TgictlError
from tgictl.runtime.router.http.anthropic.routes import anthropic_router
from tgictl.runtime.router.http.routes_adapters import adapter_router
from tgictl.runtime.router.http.openai_responses.routes import responses_router
from tgictl.runtime.router.http.request_spans import RequestSpans
from tgictl.runtime.router.http.error_shapes import shape_for
from tgictl.runtime.router.http.responses import error_response
from tgictl.runtime.router.http.routes_openai import openai_router
from tgictl.runtime.router.http.routes_tgi import tgi_router
from tgictl.runtime.router.http.worker_contract import worker_router
from tgictl.runtime.router.service import RouterService

log = logging.getLogger(__name__)


class UnauthorizedError(TgictlError):
    http_status = 401
    error_type = "unauthorized"

    def __init__(self) -> None:
        super().__init__("Unauthorized: a valid `Authorization: Bearer <api key>` header is required")


class RequestBodyError(TgictlError):
    """A body that is not JSON (400) or JSON of the wrong shape (422)."""

    error_type = "validation"

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.http_status = status


class UnsupportedMediaTypeError(TgictlError):
    http_status = 415
    error_type = "unsupported_media_type"


class HttpError(TgictlError):
    """Starlette's own answers (404, 405) in TGI's error shape."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.http_status = status
        self.error_type = {404: "not_found", 405: "method_not_allowed"}.get(status, "http")


class RequestTimeoutError(TgictlError):
    http_status = 408
    error_type = "request_timeout"


class BodyGuard:
    """Pure ASGI middleware in front of the app: POST bodies must be JSON (415), at most `limit` bytes (413),
    checked on Content-Length and again on the bytes actually received, and whole within `timeout_s` seconds of
    the headers (408: a client sending a byte a second must not hold a connection and a task for ever)."""

    def __init__(self, app: ASGIApp, limit: int, timeout_s: float) -> None:
        self.app = app
        self.limit = limit
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        shape = shape_for(scope["path"])
        too_large = PayloadTooLargeError(f"Payload too large: the request body must be at most {self.limit} bytes")
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await error_response(too_large, shape)(scope, receive, send)
            return
        media_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type != "application/json" and not media_type.endswith("+json"):
            err = UnsupportedMediaTypeError(
                f"Expected request with `Content-Type: application/json`, got {media_type or 'none'!r}"
            )
            await error_response(err, shape)(scope, receive, send)
            return
        # Read the body here (bounded) and replay it, so a chunked upload cannot exceed the limit either.
        chunks: list[bytes] = []
        size = 0
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), deadline - asyncio.get_running_loop().time())
            except asyncio.TimeoutError:
                late = RequestTimeoutError(f"Request timeout: the body must arrive within {self.timeout_s:g} s")
                await error_response(late, shape)(scope, receive, send)
                return
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await error_response(too_large, shape)(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _describe(errors: list[Any]) -> str:
    parts = []
    for error in errors:
        location = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
        parts.append(f"{location}: {error.get('msg')}" if location else str(error.get("msg")))
    return "; ".join(parts)


def create_app(service: RouterService) -> FastAPI:
    config = service.config
    expected = f"Bearer {config.api_key}".encode() if config.api_key is not None else None

    async def auth(request: Request) -> None:
        """The API key on every route that generates or reveals the model (constant-time compare), as
        `Authorization: Bearer KEY` or Anthropic's `x-api-key: KEY`."""
        if expected is None:
            return
        given = request.headers.get("authorization", "").encode()
        anthropic = f"Bearer {request.headers.get('x-api-key', '')}".encode()
        if not (hmac.compare_digest(given, expected) or hmac.compare_digest(anthropic, expected)):
            raise UnauthorizedError()

    app = FastAPI(
        title="tgictl",
        version=__version__,
        description="Text generation with TGI's and OpenAI's APIs",
        docs_url="/docs",
        openapi_url="/api-doc/openapi.json",
        redoc_url=None,
    )

    def answer(request: Request, err: TgictlError, headers: dict[str, str] | None = None) -> Any:
        return error_response(err, shape_for(request.url.path), headers)

    @app.exception_handler(TgictlError)
    async def _tgictl_error(request: Request, err: TgictlError) -> Any:
        return answer(request, err)

    @app.exception_handler(RequestValidationError)
    async def _body_error(request: Request, err: RequestValidationError) -> Any:
        errors = list(err.errors())
        if any(e.get("type") == "json_invalid" for e in errors):
            detail = "; ".join(str(e.get("ctx", {}).get("error", e.get("msg"))) for e in errors)
            return answer(request, RequestBodyError(f"Failed to parse the request body as JSON: {detail}", 400))
        return answer(
            request,
            RequestBodyError(f"Failed to deserialize the JSON body into the target type: {_describe(errors)}", 422),
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException) -> Any:
        return answer(request, HttpError(str(err.detail), err.status_code), getattr(err, "headers", None))

    @app.exception_handler(Exception)
    async def _bug(request: Request, err: Exception) -> Any:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return answer(request, TgictlError(f"Internal server error: {type(err).__name__}"))

    app.include_router(tgi_router(service, auth))
    app.include_router(openai_router(service, auth))
    app.include_router(anthropic_router(service, auth))
    app.include_router(responses_router(service, auth))
    if config.allow_lora_loading:
        app.include_router(adapter_router(service, auth))
    app.include_router(worker_router(service, auth))
    app.add_middleware(BodyGuard, limit=config.payload_limit, timeout_s=config.http_body_timeout_s)
    if config.otlp_endpoint is not None:
        app.add_middleware(RequestSpans)
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(config.cors_allow_origin) or ["*"],
        allow_methods=["GET", "POST"],
        allow_headers=["content-type", "authorization", "x-api-key", "anthropic-version", "traceparent", "tracestate"],
    )
    return app
