"""Every HTTP request's id and route, for the request log (router/request_log.py): a pure ASGI
middleware, so they are set in the request's context before any route runs and the answer carries the
id back as `X-Request-Id` (the client's own, when it sent a plain one). A request answered with an error
status whose generations logged nothing (refused before any: bad input, full queue, wrong key) is
logged here, once."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tgictl.runtime.router.request_log import ORIGIN, RequestOrigin, log_refused, request_id

HEADER = b"x-request-id"


class RequestIds:
    def __init__(self, app: ASGIApp, log_refused_requests: bool = True) -> None:
        self.app = app
        self.log_refused_requests = log_refused_requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = next((value for key, value in scope["headers"] if key.lower() == HEADER), None)
        origin = RequestOrigin(request_id(sent.decode("latin-1") if sent is not None else None),
                               scope.get("path", ""), time.monotonic())
        token = ORIGIN.set(origin)
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = [*message.get("headers", []), (HEADER, origin.request_id.encode("latin-1"))]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            ORIGIN.reset(token)
            if self.log_refused_requests and status >= 400 and origin.lines == 0:
                log_refused(origin, status)
