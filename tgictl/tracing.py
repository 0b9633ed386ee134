"""OpenTelemetry tracing, as TGI has it (`--otlp-endpoint`, `--otlp-service-name`): spans go to an
OTLP collector over gRPC (docs/architecture.md, "Tracing").

Without an endpoint nothing is configured: OpenTelemetry's API then hands out non-recording spans,
which cost a function call, so the code paths are the same traced or not. W3C trace context
(`traceparent`) travels from the HTTP client into the router's request span and from the router's
batch spans to the shards in gRPC metadata.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Tracer

from tgictl.config import TracingConfig

log = logging.getLogger(__name__)

TRACER_NAME = "tgictl"
TRACEPARENT = "traceparent"
_provider: Any = None  # the SDK's TracerProvider once configured (shut down at exit)


def configure_tracing(config: TracingConfig) -> None:
    """Export this process's spans to `config.otlp_endpoint` (nothing to do without one)."""
    global _provider
    if config.otlp_endpoint is None:
        return
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: config.service_name}))
    exporter = OTLPSpanExporter(endpoint=config.otlp_endpoint, insecure=not config.otlp_endpoint.startswith("https"))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=config.export_delay_ms))
    trace.set_tracer_provider(provider)
    _provider = provider
    log.info("tracing: spans of %s go to %s", config.service_name, config.otlp_endpoint)


def shutdown_tracing() -> None:
    """Send the spans still buffered (call once, at exit)."""
    global _provider
    if _provider is not None:
        _provider.shutdown()
        _provider = None


def tracer() -> Tracer:
    return trace.get_tracer(TRACER_NAME)


def context_from(carrier: Mapping[str, str]) -> Context:
    """The W3C trace context in HTTP headers or gRPC metadata (an empty context without one)."""
    return propagate.extract(carrier)


def grpc_metadata() -> tuple[tuple[str, str], ...]:
    """The current span's trace context as gRPC metadata; empty when nothing records."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return tuple(carrier.items())


def links(contexts: Iterable[SpanContext | None]) -> list[Link]:
    return [Link(c) for c in contexts if c is not None and c.is_valid]


def wall_ns(monotonic_s: float) -> int:
    """A time.monotonic() reading as Unix nanoseconds (span times are wall-clock)."""
    return time.time_ns() - int((time.monotonic() - monotonic_s) * 1e9)


def add_finished_span(
    name: str, parent: Context, start_monotonic: float, end_monotonic: float, **attributes: Any
) -> None:
    """A child span of `parent` for a phase that already ended (queue, prefill, decode: the
    scheduler records their times, and the spans are written once the request ended)."""
    span = tracer().start_span(name, context=parent, start_time=wall_ns(start_monotonic), attributes=attributes)
    span.end(end_time=wall_ns(end_monotonic))


@contextmanager
def server_span(name: str, metadata: Iterable[tuple[str, Any]], **attributes: Any) -> Iterator[Span | None]:
    """A shard's span for one RPC, a child of the router's span that sent it; nothing when the RPC
    carries no trace context."""
    carrier = {k: v for k, v in metadata if isinstance(v, str)}
    if TRACEPARENT not in carrier:
        yield None
        return
    with tracer().start_as_current_span(name, context=context_from(carrier), kind=SpanKind.SERVER,
                                        attributes=attributes) as span:
        yield span
