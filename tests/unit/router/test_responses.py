"""HTTP plumbing: NaN-free JSON, SSE framing, TGI's error body."""

from __future__ import annotations

import json

from tgictl.errors import OverloadedError, ValidationError
from tgictl.runtime.router.responses import TgiJSONResponse, dumps, error_body, error_response, finite, sse


def test_non_finite_floats_become_null() -> None:
    value = {"a": float("nan"), "b": [1.5, float("inf"), {"c": float("-inf")}], "d": (2, "x")}
    assert finite(value) == {"a": None, "b": [1.5, None, {"c": None}], "d": [2, "x"]}
    assert json.loads(dumps(value)) == {"a": None, "b": [1.5, None, {"c": None}], "d": [2, "x"]}
    assert TgiJSONResponse({"logprob": float("nan")}).body == b'{"logprob":null}'


def test_sse_framing() -> None:
    assert sse({"index": 1, "text": "a\nb"}) == 'data: {"index":1,"text":"a\\nb"}\n\n'
    assert sse("[DONE]") == "data: [DONE]\n\n"


def test_error_body_keeps_tgi_shape() -> None:
    err = ValidationError("`top_k` must be strictly positive")
    assert error_body(err) == {"error": "Input validation error: `top_k` must be strictly positive",
                               "error_type": "validation"}
    response = error_response(OverloadedError())
    assert response.status_code == 429
    assert json.loads(response.body) == {"error": "Model is overloaded", "error_type": "overloaded"}
