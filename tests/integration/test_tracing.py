"""OpenTelemetry tracing end to end: a real shard and router export to an OTLP receiver running in
this process (gRPC on loopback); a request with a W3C traceparent yields the request span in the
caller's trace, its validation, queue, prefill and decode children, batch spans linked to it, and
the shard's spans as children of those batch spans."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tests.integration.http_stack import Stack, http_stack
from tgictl.runtime.launcher.plan import free_port

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every span it is sent, with its service's name."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, Any]] = []

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method's name
        for resource_spans in request.resource_spans:
            service = next(a.value.string_value for a in resource_spans.resource.attributes
                           if a.key == "service.name")
            for scope in resource_spans.scope_spans:
                self.spans.extend((service, span) for span in scope.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def of_trace(self, trace_id: str) -> list[tuple[str, Any]]:
        return [(s, span) for s, span in self.spans if span.trace_id.hex() == trace_id]


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[Receiver, int]]:
    servicer = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    yield servicer, port
    server.stop(0)


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
          receiver: tuple[Receiver, int]) -> Iterator[Stack]:
    endpoint = f"http://127.0.0.1:{receiver[1]}"
    with http_stack(tiny_model_dir, tmp_path_factory.mktemp("tracing"),
                    router_args=["--otlp-endpoint", endpoint, "--otlp-service-name", "test.router"],
                    shard_args=["--otlp-endpoint", endpoint, "--otlp-service-name", "test.shard"]) as running:
        yield running


def wait_for(receiver: Receiver, trace_id: str, names: set[str], timeout_s: float = 30.0) -> list[tuple[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        spans = receiver.of_trace(trace_id)
        if names <= {span.name for _, span in spans}:
            return spans
        time.sleep(0.2)
    raise AssertionError(f"spans {names} not all received: {sorted(span.name for _, span in receiver.of_trace(trace_id))}")


def test_a_request_is_one_trace_from_http_to_the_shard(stack: Stack, receiver: tuple[Receiver, int]) -> None:
    collector = receiver[0]
    headers = {"traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"}
    body = {"inputs": "the quick brown fox", "parameters": {"max_new_tokens": 4, "ignore_eos": True}}
    response = httpx.post(f"{stack.url}/generate", json=body, headers=headers, timeout=60)
    assert response.status_code == 200
    spans = wait_for(collector, TRACE_ID, {"generate", "validation", "queue", "prefill", "decode"})
    by_name: dict[str, list[tuple[str, Any]]] = {}
    for service, span in spans:
        by_name.setdefault(span.name, []).append((service, span))

    (service, request_span), = by_name["generate"]
    assert service == "test.router" and request_span.parent_span_id.hex() == CALLER_SPAN  # traceparent honoured
    parents = {span.span_id: span.parent_span_id for _, span in spans}

    def under_request(span: Any) -> bool:  # FastAPI's own spans may sit in between
        at = span.parent_span_id
        while at and at != request_span.span_id:
            at = parents.get(at, b"")
        return at == request_span.span_id

    for phase in ("validation", "queue", "prefill", "decode"):
        (_, child), = [(s, span) for s, span in by_name[phase] if under_request(span)]
        assert request_span.start_time_unix_nano <= child.start_time_unix_nano <= child.end_time_unix_nano
        assert child.end_time_unix_nano <= request_span.end_time_unix_nano
    # A batch serves many requests: its spans are traces of their own that link to every request
    # they served; the shard's spans continue them across gRPC.
    deadline = time.monotonic() + 30
    while True:
        batches = [span for service, span in collector.spans
                   if service == "test.router" and span.name in ("prefill", "decode")
                   and any(link.trace_id == request_span.trace_id for link in span.links)]
        shard_spans = [(service, span) for service, span in collector.spans
                       if span.parent_span_id in {b.span_id for b in batches}]
        if len(shard_spans) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    # 4 tokens: 1 from the prefill, 3 from one decode call (--decode-steps 4: the queue was empty)
    assert sorted(b.name for b in batches) == ["decode", "prefill"]
    (decode,) = [b for b in batches if b.name == "decode"]
    assert {a.key: a.value.int_value for a in decode.attributes}["tgictl.batch.steps"] == 4
    assert all(b.trace_id != request_span.trace_id and not b.parent_span_id for b in batches)
    assert sorted(span.name for _, span in shard_spans) == ["Decode", "Prefill"]
    assert {service for service, _ in shard_spans} == {"test.shard"}


def test_openai_stream_spans_end_with_the_stream(stack: Stack, receiver: tuple[Receiver, int]) -> None:
    trace_id = "a" * 32
    headers = {"traceparent": f"00-{trace_id}-{'b' * 16}-01"}
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json=body, headers=headers, timeout=60) as r:
        frames = [line for line in r.iter_lines() if line.startswith("data:")]
    assert frames[-1] == "data: [DONE]"
    spans = wait_for(collector := receiver[0], trace_id, {"chat_completions", "decode"})
    (_, request_span), = [(s, span) for s, span in spans if span.name == "chat_completions"]
    (_, decode), = [(s, span) for s, span in spans if span.name == "decode"]
    assert decode.end_time_unix_nano <= request_span.end_time_unix_nano
    assert collector.of_trace(trace_id)


def test_a_request_without_traceparent_starts_its_own_trace(stack: Stack, receiver: tuple[Receiver, int]) -> None:
    before = {span.trace_id for _, span in receiver[0].spans}
    response = httpx.post(f"{stack.url}/generate", json={"inputs": "x", "parameters": {"max_new_tokens": 1}},
                          timeout=60)
    assert response.status_code == 200
    deadline = time.monotonic() + 30
    while True:
        roots = [span for _, span in receiver[0].spans
                 if span.name == "generate" and span.trace_id not in before]
        if roots or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    (root,) = roots
    assert not root.parent_span_id  # a root: nobody else's trace
