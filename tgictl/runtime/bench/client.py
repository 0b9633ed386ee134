"""One streamed request of `tgictl bench` and what it measured.

Each API (TGI's /generate_stream, OpenAI's /v1/completions and /v1/chat/completions) has a request
body and a reader of its server-sent events; both feed one RequestRecord. Token counts come from
the server when it states them (TGI `details.generated_tokens`, OpenAI `usage`), else from the
stream itself (one event per token, which is how TGI-compatible servers stream).

A token's time is the time its bytes arrived: the events of one network read share it, so a burst
(several decode steps sent at once) is visible as such (stats.burst_latencies, inter_token_latencies).
"""

from __future__ import annotations

import codecs
import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from tgictl.runtime.bench.stats import burst_latencies, inter_token_latencies, time_per_output_token
from tgictl.runtime.bench.workloads import BenchPrompt

_PATHS = {"tgi": "/generate_stream", "openai-chat": "/v1/chat/completions",
          "openai-completions": "/v1/completions"}


@dataclass
class RequestRecord:
    """One request as the client saw it. Times are seconds; `start_s` counts from the run's start
    and `token_times` from this request's send."""

    index: int
    group: int | None
    start_s: float = 0.0
    max_new_tokens: int = 0
    prompt_tokens: int | None = None
    prompt_tokens_source: str = "none"  # "server" | "tokenizer" | "none"
    tokenizer_prompt_tokens: int | None = None  # what the bench's tokenizer counted (a cross-check)
    output_tokens: int = 0
    output_tokens_source: str = "stream"  # "server" | "stream"
    stream_events: int = 0  # token-carrying events received
    ttft_s: float | None = None
    e2e_s: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    status: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def itl_s(self) -> list[float]:
        """Per token: each arrival's gap divided by the tokens it brought."""
        return inter_token_latencies(self.token_times)

    @property
    def itl_burst_s(self) -> list[float]:
        """Per burst: the gaps between arrivals of tokens."""
        return burst_latencies(self.token_times)

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.e2e_s is None:
            return None
        return time_per_output_token(self.ttft_s, self.e2e_s, self.output_tokens)

    def slo_figures(self) -> dict[str, float | None]:
        return {"ttft": self.ttft_s, "tpot": self.tpot_s, "e2e": self.e2e_s}

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index, "group": self.group, "start_s": self.start_s, "max_new_tokens": self.max_new_tokens,
            "prompt_tokens": self.prompt_tokens, "prompt_tokens_source": self.prompt_tokens_source,
            "tokenizer_prompt_tokens": self.tokenizer_prompt_tokens,
            "output_tokens": self.output_tokens, "output_tokens_source": self.output_tokens_source,
            "stream_events": self.stream_events, "ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "e2e_s": self.e2e_s,
            "itl_s": self.itl_s, "itl_burst_s": self.itl_burst_s, "finish_reason": self.finish_reason,
            "status": self.status, "error": self.error,
        }


@dataclass(frozen=True)
class ApiSettings:
    api: str
    model: str  # the `model` field of OpenAI bodies (TGI-compatible servers ignore it)
    ignore_eos: bool
    # more body fields for servers with their own spelling (e.g. OpenAI's logit_bias to ban EOS)
    extra_body: Mapping[str, Any] = field(default_factory=dict)


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The client's default headers: every call (requests, /info, /metrics) carries the key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def request_body(settings: ApiSettings, prompt: BenchPrompt) -> dict[str, Any]:
    """Greedy on every API (TGI's default; temperature 0 for OpenAI), so runs are comparable."""
    extra: dict[str, Any] = {"ignore_eos": True} if settings.ignore_eos else {}
    extra.update(settings.extra_body)
    if settings.api == "tgi":
        parameters = {"max_new_tokens": prompt.max_new_tokens, "details": True, **extra}
        return {"inputs": prompt.text, "parameters": parameters}
    body: dict[str, Any] = {
        "model": settings.model, "max_tokens": prompt.max_new_tokens, "temperature": 0.0, "stream": True,
        "stream_options": {"include_usage": True}, **extra,
    }
    if settings.api == "openai-chat":
        body["messages"] = prompt.message_dicts()
    else:
        body["prompt"] = prompt.text
    return body


class _Reader:
    """Folds the stream's JSON events into a record; returns True at the stream's last event."""

    def __init__(self, api: str, record: RequestRecord, sent: float) -> None:
        self.api = api
        self.record = record
        self.sent = sent
        self.arrived = sent  # when the bytes of the event being read arrived

    def _token(self) -> None:
        now = self.arrived - self.sent
        if self.record.ttft_s is None:
            self.record.ttft_s = now
        self.record.token_times.append(now)
        self.record.stream_events += 1

    def event(self, payload: dict[str, Any]) -> bool:
        if "error" in payload:
            error = payload["error"]
            self.record.error = error.get("message", str(error)) if isinstance(error, dict) else str(error)
            return True
        if self.api == "tgi":
            return self._tgi(payload)
        return self._openai(payload)

    def _tgi(self, payload: dict[str, Any]) -> bool:
        if payload.get("token") is not None:
            self._token()
        if payload.get("generated_text") is None:
            return False
        details = payload.get("details") or {}
        if isinstance(details.get("generated_tokens"), int):
            self.record.output_tokens = details["generated_tokens"]
            self.record.output_tokens_source = "server"
        if isinstance(details.get("input_length"), int):
            self.record.prompt_tokens = details["input_length"]
            self.record.prompt_tokens_source = "server"
        self.record.finish_reason = details.get("finish_reason")
        return True

    def _openai(self, payload: dict[str, Any]) -> bool:
        for choice in payload.get("choices") or []:
            delta = choice.get("delta")
            finish = choice.get("finish_reason")
            if isinstance(delta, dict) and "role" in delta and not delta.get("content") and finish is None:
                continue  # OpenAI and vLLM open a chat stream with a role-only chunk: no token yet
            if finish is not None:
                self.record.finish_reason = finish
                if isinstance(delta, dict) and delta.get("content") is None:
                    continue  # OpenAI's closing chunk: an empty delta with the finish reason, no token
            self._token()
        usage = payload.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("completion_tokens"), int):
                self.record.output_tokens = usage["completion_tokens"]
                self.record.output_tokens_source = "server"
            if isinstance(usage.get("prompt_tokens"), int):
                self.record.prompt_tokens = usage["prompt_tokens"]
                self.record.prompt_tokens_source = "server"
        return False  # OpenAI streams end with `data: [DONE]`


async def _sse_data(response: httpx.Response) -> AsyncIterator[tuple[float, str]]:
    """Each `data:` payload of an event stream with the time of the network read that completed it."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    async for chunk in response.aiter_bytes():
        arrived = time.perf_counter()
        *lines, pending = (pending + decoder.decode(chunk)).split("\n")
        for line in lines:
            if line.startswith("data:"):  # blank separators, comments and keep-alives skipped
                yield arrived, line[len("data:"):].strip()
    if pending.startswith("data:"):
        yield time.perf_counter(), pending[len("data:"):].strip()


async def send(client: httpx.AsyncClient, settings: ApiSettings, prompt: BenchPrompt, index: int,
               run_start: float) -> RequestRecord:
    """Send one streamed request and time it; failures are recorded, never raised."""
    record = RequestRecord(index=index, group=prompt.group, max_new_tokens=prompt.max_new_tokens)
    if prompt.prompt_tokens is not None:
        record.prompt_tokens, record.prompt_tokens_source = prompt.prompt_tokens, "tokenizer"
        record.tokenizer_prompt_tokens = prompt.prompt_tokens
    sent = time.perf_counter()
    record.start_s = sent - run_start
    reader = _Reader(settings.api, record, sent)
    finished = False
    try:
        async with client.stream("POST", _PATHS[settings.api], json=request_body(settings, prompt)) as response:
            record.status = response.status_code
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                record.error = f"HTTP {response.status_code}: {body[:300]}"
                return record
            async for arrived, data in _sse_data(response):
                reader.arrived = arrived
                if data == "[DONE]":
                    finished = True
                    break
                if reader.event(json.loads(data)):
                    finished = True
                    break
    except (httpx.HTTPError, json.JSONDecodeError) as err:
        record.error = f"{type(err).__name__}: {err}"
        return record
    record.e2e_s = time.perf_counter() - sent
    if record.error is None and not finished and record.finish_reason is None:
        # OpenAI streams end with `data: [DONE]`; some servers (transformers serve) just close the
        # stream after the chunk with the finish reason, which is complete too
        record.error = "the stream ended before its last event"
    if record.output_tokens_source == "stream":
        record.output_tokens = record.stream_events
    return record
