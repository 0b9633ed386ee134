"""One OpenTelemetry span per generation request (docs/architecture.md, "Tracing"): an ASGI
middleware, so the span covers the whole answer, a stream's last event included, and is the current
span while the route runs (validation, the scheduler's queue/prefill/decode phases and the batch
spans the shards continue hang from it). A W3C `traceparent` header makes it part of the caller's
trace, as TGI does."""

from __future__ import annotations

from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tgictl.tracing import context_from, tracer

# Route → span name (TGI's handler names).
SPAN_NAMES: dict[str, str] = {
    "/": "compat_generate",
    "/generate": "generate",
    "/generate_stream": "generate_stream",
    "/v1/chat/completions": "chat_completions",
    "/v1/completions": "completions",
}


class RequestSpans:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = SPAN_NAMES.get(scope.get("path", "")) if scope["type"] == "http" else None
        if name is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        attributes = {"http.request.method": "POST", "http.route": scope["path"]}
        with tracer().start_as_current_span(name, context=context_from(headers), kind=SpanKind.SERVER,
                                            attributes=attributes) as span:

            async def traced_send(message: Message) -> None:
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_status(Status(StatusCode.ERROR))
                await send(message)

            await self.app(scope, receive, traced_send)
