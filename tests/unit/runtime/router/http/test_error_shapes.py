"""Error bodies in the shape of the API whose route received the request, with bounded messages."""

from __future__ import annotations

from tgictl.errors import MAX_MESSAGE_CHARS, OverloadedError, TgictlError, ValidationError, bounded
from tgictl.runtime.router.http.error_shapes import (
    anthropic_error_body,
    openai_error_body,
    shape_for,
    tgi_error_body,
)


def test_tgi_routes_keep_tgi_shape() -> None:
    err = ValidationError("`top_k` must be strictly positive")
    for path in ("/generate", "/generate_stream", "/", "/health", "/tokenize"):
        assert shape_for(path)(err) == {
            "error": "Input validation error: `top_k` must be strictly positive", "error_type": "validation"}


def test_openai_routes_answer_in_openai_shape() -> None:
    err = ValidationError("`n` must be >= 1. Given: 0")
    body = shape_for("/v1/chat/completions")(err)
    assert body == {"error": {"message": "Input validation error: `n` must be >= 1. Given: 0",
                              "type": "invalid_request_error", "param": None, "code": "validation"}}
    assert shape_for("/v1/completions") is openai_error_body
    assert openai_error_body(OverloadedError())["error"]["type"] == "rate_limit_error"
    assert openai_error_body(TgictlError("boom"))["error"]["type"] == "server_error"


def test_anthropic_routes_answer_in_anthropics_shape() -> None:
    err = ValidationError("`max_new_tokens` must be strictly positive")
    for path in ("/v1/messages", "/v1/messages/count_tokens", "/v1/messages/nope"):
        assert shape_for(path)(err) == {"type": "error", "error": {
            "type": "invalid_request_error", "message": "Input validation error: `max_new_tokens` must be strictly positive"}}
    assert shape_for("/v1/responses") is openai_error_body  # the longest prefix wins, and only it
    assert anthropic_error_body(OverloadedError())["error"]["type"] == "rate_limit_error"
    assert anthropic_error_body(TgictlError("boom"))["error"]["type"] == "api_error"


def test_messages_are_bounded_in_every_shape() -> None:
    huge = TgictlError("grammar is not valid: " + "x" * 100_000)
    for body in (tgi_error_body(huge)["error"], openai_error_body(huge)["error"]["message"],
                 anthropic_error_body(huge)["error"]["message"]):
        assert len(body) <= MAX_MESSAGE_CHARS
        assert body.startswith("grammar is not valid: xxx") and "more characters" in body
    assert bounded("short") == "short"
    assert bounded("y" * MAX_MESSAGE_CHARS) == "y" * MAX_MESSAGE_CHARS
