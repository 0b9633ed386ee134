"""Helpers the reliability tests share: server metrics (KV blocks, queue), TGI's error JSON, SSE parsing.

Every wait here is bounded: a server that hangs fails the test with what it last saw, never blocks CI.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx

# Parameters that make generation deterministic and exactly this long (greedy, past EOS).
GREEDY = {"do_sample": False, "ignore_eos": True}


def metric(text: str, name: str) -> float:
    """One unlabelled sample from a Prometheus text page."""
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    if match is None:
        raise AssertionError(f"{name} not exported")
    return float(match.group(1))


@dataclass(frozen=True)
class KvState:
    total: int
    free: int
    cached: int
    queue: int  # tgi_queue_size: requests waiting for a batch

    @property
    def leaked(self) -> int:
        """Blocks neither free nor held by the prefix cache: owned by requests (0 when idle)."""
        return self.total - self.free - self.cached


def kv_state(url: str, headers: dict[str, str] | None = None) -> KvState:
    text = httpx.get(f"{url}/metrics", headers=headers, timeout=10.0).text
    total, free, cached = (int(metric(text, f"tgictl_kv_blocks_{k}")) for k in ("total", "free", "cached"))
    return KvState(total, free, cached, int(metric(text, "tgi_queue_size")))


def wait_idle(url: str, timeout_s: float = 15.0) -> KvState:
    """Wait until no block is owned by a request and the queue is empty; returns the final state.
    Fails (naming the leak) if that never happens: a leaked block is never given back."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = kv_state(url)
        if state.leaked == 0 and state.queue == 0:
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"not idle after {timeout_s} s: {state} ({state.leaked} blocks leaked)")
        time.sleep(0.1)


def assert_error_json(status: int, body: bytes, context: Any = "", path: str | None = None) -> dict[str, Any]:
    """An error body in the shape of its route's API, returned as TGI's {"error": str, "error_type": str}.
    TGI's routes: {"error": str, "error_type": str}; OpenAI's (/v1/...): {"error": {"message", "type",
    "param", "code"}}, tgictl's error type in `code`; Anthropic's (/v1/messages...): {"type": "error", "error":
    {"type", "message"}}, its type as the error type. Without `path` TGI's or OpenAI's shape is accepted."""
    try:
        parsed = json.loads(body)
    except ValueError:
        raise AssertionError(f"{status} without a JSON body: {body[:300]!r} ({context})") from None
    assert isinstance(parsed, dict), f"{status} body is not an error object: {body[:300]!r} ({context})"
    if path is not None and path.startswith("/v1/messages"):
        error = parsed.get("error")
        ok = parsed.get("type") == "error" and isinstance(error, dict) and set(error) == {"type", "message"} and all(
            isinstance(v, str) for v in error.values())
        assert ok, f"{status} body is not Anthropic's error JSON: {body[:300]!r} ({context})"
        return {"error": error["message"], "error_type": error["type"]}
    openai_shape = path.startswith("/v1/") if path is not None else isinstance(parsed.get("error"), dict)
    if openai_shape:
        error = parsed.get("error")
        ok = isinstance(error, dict) and isinstance(error.get("message"), str) and isinstance(
            error.get("type"), str) and isinstance(error.get("code"), str) and "param" in error
        assert ok, f"{status} body is not OpenAI's error JSON: {body[:300]!r} ({context})"
        return {"error": error["message"], "error_type": error["code"]}
    ok = isinstance(parsed.get("error"), str) and isinstance(parsed.get("error_type"), str)
    assert ok, f"{status} body is not TGI's error JSON: {body[:300]!r} ({context})"
    return parsed


def sse_data(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The JSON objects of `data:` lines ([DONE] skipped)."""
    events = []
    for line in lines:
        if line.startswith("data:"):
            payload = line[5:].strip()
            if payload and payload != "[DONE]":
                events.append(json.loads(payload))
    return events


def is_error_event(event: dict[str, Any]) -> bool:
    """An in-band stream error: TGI's {"error", "error_type"}, OpenAI's {"error": {"message", ...}}, Anthropic's
    {"type": "error", "error": {"type", "message"}} or the Responses API's {"type": "error", "code", "message"}."""
    if event.get("type") == "error":
        error = event.get("error", event)
        return isinstance(error, dict) and isinstance(error.get("message"), str)
    error = event.get("error")
    if isinstance(error, dict):
        return isinstance(error.get("message"), str) and isinstance(error.get("code"), str)
    return isinstance(error, str) and isinstance(event.get("error_type"), str)


def generate(url: str, inputs: str, max_new_tokens: int, timeout_s: float = 60.0) -> str:
    """A greedy /generate run alone: the reference text for the same request under load."""
    response = httpx.post(
        f"{url}/generate",
        json={"inputs": inputs, "parameters": {**GREEDY, "max_new_tokens": max_new_tokens}},
        timeout=timeout_s,
    )
    assert response.status_code == 200, response.text
    return str(response.json()["generated_text"])
