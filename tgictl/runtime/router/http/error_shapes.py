"""An error's body in the shape of the API whose route received the request.

TGI's routes answer `{"error": message, "error_type": type}` (TGI's ErrorResponse). OpenAI's routes answer
`{"error": {"message", "type", "param", "code"}}`, the shape the openai SDK reads its message from (given TGI's
shape it shows only "Error code: 422"). Anthropic's Messages routes answer `{"type": "error", "error": {"type",
"message"}}`, the anthropic SDK's shape. Every HTTP boundary that turns an error into a body (the exception
handlers, the body guard, in-band stream errors) asks `shape_for(path)`, so one request never sees two shapes.

Messages are bounded (tgictl.errors.bounded): an error may quote a client's input (a grammar, a prompt), and
an answer must stay a line a person can read, whatever the input's size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tgictl.errors import TgictlError, bounded

ErrorShape = Callable[[TgictlError], dict[str, Any]]


def tgi_error_body(err: TgictlError) -> dict[str, Any]:
    return {"error": bounded(err.message), "error_type": err.error_type}


# OpenAI's error types by HTTP status (its API reference, "Error codes"); tgictl's own type goes in `code`.
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def openai_error_type(status: int) -> str:
    return _OPENAI_TYPES.get(status, "server_error")


def openai_error_body(err: TgictlError) -> dict[str, Any]:
    return {
        "error": {
            "message": bounded(err.message),
            "type": openai_error_type(err.http_status),
            "param": getattr(err, "param", None),
            "code": err.error_type,
        }
    }


# Anthropic's error types by HTTP status (its API reference, "Errors"); 422 is its invalid request too.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "request_too_large",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_error_body(err: TgictlError) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": _ANTHROPIC_TYPES.get(err.http_status, "api_error"), "message": bounded(err.message)},
    }


# Path prefixes of the APIs that are not TGI's; the longest match wins, everything else is TGI's shape.
_SHAPES: dict[str, ErrorShape] = {"/v1/": openai_error_body, "/v1/messages": anthropic_error_body}


def shape_for(path: str) -> ErrorShape:
    matches = [prefix for prefix in _SHAPES if path.startswith(prefix)]
    return _SHAPES[max(matches, key=len)] if matches else tgi_error_body
