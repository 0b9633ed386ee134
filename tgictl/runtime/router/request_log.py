"""One info line per finished generation, as TGI logs one per request (its `generate` span's fields:
total, validation, queue and inference time, time per token, seed), with what operators grep for
beside them: the request's id and route, its tokens in, cached and out, its finish reason and adapter.

Never the prompt or the output text (docs/operations.md, "Request log"). With --json-output the same
fields are a JSON object's keys (times in seconds); `--no-request-log` turns the line off.

The id and the route are the HTTP request's: `http/request_ids.py` sets them for the request's context,
where `RouterService.open()` reads them; a request with several generations (n, best_of, a list of
prompts) logs one line per generation, its id suffixed `/index`. A request refused before any generation
(an HTTP 4xx or 5xx: bad input, a full queue, a wrong key) gets one line from the middleware instead, with
its status: every request is logged once.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from contextvars import ContextVar
from dataclasses import dataclass

from tgictl.config import BASE_MODEL_LABEL
from tgictl.runtime.router.request import EndEvent, ErrorEvent

log = logging.getLogger(__name__)


# An X-Request-Id a client sends is kept when it is a plain token (it lands in log lines); else a new one.
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")


def request_id(client_value: str | None) -> str:
    """The id of one HTTP request: the client's X-Request-Id when it is a plain token, else a fresh one."""
    if client_value is not None and _CLIENT_ID.fullmatch(client_value):
        return client_value
    return uuid.uuid4().hex[:16]


@dataclass
class RequestOrigin:
    """Where a generation came from, captured when it is opened (inside its HTTP request); it counts the
    lines its generations logged, so that the middleware logs a refused request (and only that) itself."""

    request_id: str
    route: str
    started: float = 0.0
    lines: int = 0

    @classmethod
    def current(cls) -> RequestOrigin:
        return ORIGIN.get() or cls(request_id(None), "-", time.monotonic())


# The current HTTP request's origin (unset outside one: a generation opened by code, not a route).
ORIGIN: ContextVar[RequestOrigin | None] = ContextVar("tgictl_request_origin", default=None)


def _duration(seconds: float) -> str:
    return f"{seconds:.3f}s" if seconds >= 1 else f"{seconds * 1000:.1f}ms"


def log_finished(
    origin: RequestOrigin, index: int, count: int, adapter: str | None, total_s: float, validation_s: float,
    event: EndEvent | ErrorEvent | None,
) -> None:
    """The line for one generation: ended (`event` its EndEvent), failed (an ErrorEvent: its error type) or
    dropped (None: the client left first)."""
    origin.lines += 1
    if not log.isEnabledFor(logging.INFO):
        return
    fields: dict[str, object] = {
        "request_id": origin.request_id if count == 1 else f"{origin.request_id}/{index}",
        "route": origin.route,
        "adapter": adapter or BASE_MODEL_LABEL,
    }
    if isinstance(event, EndEvent):
        per_token = event.inference_s / event.generated_tokens if event.generated_tokens else 0.0
        fields |= {
            "input_tokens": event.input_length, "cached_tokens": event.cached_tokens,
            "generated_tokens": event.generated_tokens,
            "finish_reason": event.finish_reason.name.lower(),  # TGI's words: length, eos_token, stop_sequence
        }
        times = {"total_time": total_s, "validation_time": validation_s, "queue_time": event.queued_s,
                 "inference_time": event.inference_s, "time_per_token": per_token}
        seed = event.seed
    else:
        fields["finish_reason"] = "error" if event is not None else "cancelled"
        if event is not None:
            fields["error_type"] = event.error.error_type
        times = {"total_time": total_s, "validation_time": validation_s}
        seed = None
    text = " ".join(f"{key}={value}" for key, value in fields.items())
    text += " " + " ".join(f"{key}={_duration(seconds)}" for key, seconds in times.items())
    if seed is not None:
        text += f" seed={seed}"
    extra = fields | {f"{key}_s": round(seconds, 6) for key, seconds in times.items()} | {"seed": seed}
    log.info("request %s", text, extra=extra)


def log_refused(origin: RequestOrigin, status: int) -> None:
    """The line for a request that ended in an HTTP error before it generated anything (its status, never
    its body: an error message may quote the input)."""
    total_s = time.monotonic() - origin.started
    log.info("request request_id=%s route=%s status=%d total_time=%s", origin.request_id, origin.route, status,
             _duration(total_s),
             extra={"request_id": origin.request_id, "route": origin.route, "status": status,
                    "total_time_s": round(total_s, 6)})
