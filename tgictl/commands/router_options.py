"""The router's options, declared once for the two commands that take them: `tgictl router` serves
with them, `tgictl launch` hands them to the router it starts. One table keeps the two from drifting
apart (a flag, a help text or a default changed in one place only).

A command decorated with `with_router_options` gets every option below added to its own flags and
receives their parsed values as one `RouterFlags`, from which it builds its RouterConfig.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Optional

import typer

from tgictl.config import MAX_ADAPTIVE_DECODE_STEPS, REASONING_PARSERS, RouterConfig, SchedulingPolicy
from tgictl.env import Env

# RouterConfig is the single source of the defaults (the launcher's router_argv compares against it too).
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(RouterConfig)}

# (RouterConfig field, parameter type, option). The parameter is named after the field, so the parsed
# values are RouterConfig keyword arguments as they are (only cors_allow_origin needs a tuple).
_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("served_model_name", Optional[str], typer.Option(
        None, "--served-model-name", show_default=False,
        help="The model name /v1/models and OpenAI responses report and requests may name (`tgi` always works "
        "too; default for launch: --model-id, a local file's stem or directory's name for a path; for router: "
        "--tokenizer-name).",
    )),
    ("model_path", Optional[str], typer.Option(
        None, "--model-path", show_default=False,
        help="The model_id /info reports when it is not the served name (default for launch: a local model's "
        "path as given to --model-id).",
    )),
    ("hostname", str, typer.Option(_DEFAULTS["hostname"], "--hostname", help="Address the HTTP server listens on.")),
    ("port", int, typer.Option(_DEFAULTS["port"], "--port", help="HTTP port.")),
    ("graceful_termination_timeout_s", float, typer.Option(
        _DEFAULTS["graceful_termination_timeout_s"], "--graceful-termination-timeout",
        help="Seconds in-flight requests may run after SIGTERM.",
    )),
    ("max_concurrent_requests", int, typer.Option(
        _DEFAULTS["max_concurrent_requests"], "--max-concurrent-requests", help="Beyond this: 429."
    )),
    ("max_input_tokens", Optional[int], typer.Option(
        None, "--max-input-tokens", show_default=False, help="Default: from warmup (max_total_tokens - 1)."
    )),
    ("max_total_tokens", Optional[int], typer.Option(
        None, "--max-total-tokens", show_default=False, help="Default: from warmup."
    )),
    ("max_batch_prefill_tokens", Optional[int], typer.Option(
        None, "--max-batch-prefill-tokens", show_default=False,
        help="Default: 4096, at most max_position_embeddings and the KV capacity.",
    )),
    ("max_batch_total_tokens", Optional[int], typer.Option(
        None, "--max-batch-total-tokens", show_default=False,
        help="Default and maximum: the KV tokens the shards hold after warmup.",
    )),
    ("max_batch_size", Optional[int], typer.Option(None, "--max-batch-size", show_default=False)),
    ("prefill_group_tokens", Optional[int], typer.Option(
        None, "--prefill-group-tokens", show_default=False,
        help="A prefill step takes a request after its first only while their prompt tokens stay within this, "
        "so a burst of short prompts starts over several steps and the first answers stream early; one long "
        "prompt still fills --max-batch-prefill-tokens (default: 512 on a CPU, no limit on CUDA; 0: no limit).",
    )),
    ("decode_steps", int, typer.Option(
        _DEFAULTS["decode_steps"], "--decode-steps",
        help="Decode steps per shard call while no request waits to join: fewer round trips per token, "
        "tokens streamed in bursts of up to this many (1: one step per call).",
    )),
    ("decode_call_ms", float, typer.Option(
        _DEFAULTS["decode_call_ms"], "--decode-call-ms",
        help="With --decode-steps above 1: more steps per call while steps are short, until a call's forward "
        f"lasts about this long (at most {MAX_ADAPTIVE_DECODE_STEPS} steps; 0: exactly --decode-steps).",
    )),
    ("prefix_caching", Optional[bool], typer.Option(
        None, "--prefix-caching/--no-prefix-caching", show_default=False,
        help="Reuse the KV of cached prompt prefixes (default: on, or $PREFIX_CACHING as TGI reads it).",
    )),
    ("scheduling_policy", SchedulingPolicy, typer.Option(
        _DEFAULTS["scheduling_policy"], "--scheduling-policy",
        help="fcfs: waiting requests run in arrival order. priority: by each request's `priority` (lower "
        "first, then arrival; a full KV cache preempts the lowest priority first).",
    )),
    ("max_best_of", int, typer.Option(_DEFAULTS["max_best_of"], "--max-best-of")),
    ("max_stop_sequences", int, typer.Option(_DEFAULTS["max_stop_sequences"], "--max-stop-sequences")),
    ("max_top_n_tokens", int, typer.Option(_DEFAULTS["max_top_n_tokens"], "--max-top-n-tokens")),
    ("max_client_batch_size", int, typer.Option(
        _DEFAULTS["max_client_batch_size"], "--max-client-batch-size",
        help="Most prompts x n choices in one OpenAI request.",
    )),
    ("api_key", Optional[str], typer.Option(
        None, "--api-key", show_default=False,
        help="Require `Authorization: Bearer KEY` on generating routes (default: $TGICTL_API_KEY, which, "
        "unlike a flag, other users cannot see in `ps`).",
    )),
    ("cors_allow_origin", Optional[list[str]], typer.Option(
        None, "--cors-allow-origin", show_default=False, help="Repeatable; default: any origin."
    )),
    ("payload_limit", int, typer.Option(
        _DEFAULTS["payload_limit"], "--payload-limit", help="Largest request body in bytes."
    )),
    ("http_header_timeout_s", float, typer.Option(
        _DEFAULTS["http_header_timeout_s"], "--http-header-timeout",
        help="Seconds a client has to send a request's headers (from its connection, or its previous "
        "response); then the connection is closed.",
    )),
    ("http_body_timeout_s", float, typer.Option(
        _DEFAULTS["http_body_timeout_s"], "--http-body-timeout",
        help="Seconds a client has to send a request's whole body once its headers arrived (else 408).",
    )),
    ("max_connections", int, typer.Option(
        _DEFAULTS["max_connections"], "--max-connections",
        help="Open HTTP connections at most; a new one beyond is answered 503 and closed.",
    )),
    ("validation_workers", int, typer.Option(
        _DEFAULTS["validation_workers"], "--validation-workers", help="Tokenizer threads."
    )),
    ("otlp_endpoint", Optional[str], typer.Option(
        None, "--otlp-endpoint", show_default=False,
        help="Send OpenTelemetry traces to this OTLP/gRPC collector, e.g. http://127.0.0.1:4317.",
    )),
    ("kv_events_endpoint", Optional[str], typer.Option(
        None, "--kv-events-endpoint", show_default=False,
        help="Publish KV cache events (vLLM's format) on this ZMQ endpoint: tcp://*:5557 binds, tcp://HOST:PORT "
        "connects to a consumer. Needs pip install 'tgictl[kv-events]'.",
    )),
    ("kv_events_replay_endpoint", Optional[str], typer.Option(
        None, "--kv-events-replay-endpoint", show_default=False,
        help="Answer replay requests for missed KV event batches here (e.g. tcp://*:5558).",
    )),
    ("kv_events_topic", str, typer.Option(
        _DEFAULTS["kv_events_topic"], "--kv-events-topic", help="The ZMQ topic of the KV events (vLLM's default: none).",
    )),
    ("otlp_service_name", str, typer.Option(
        _DEFAULTS["otlp_service_name"], "--otlp-service-name",
        help="The router's service name in traces (launch: the shards get NAME.shard, '.router' dropped).",
    )),
    ("reasoning_parser", Optional[str], typer.Option(
        None, "--reasoning-parser", show_default=False,
        help=f"Split a reasoning model's think text from its answer: {' or '.join(REASONING_PARSERS)} "
        "(reasoning_content, thinking blocks, reasoning items).",
    )),
    ("allow_lora_loading", bool, typer.Option(
        _DEFAULTS["allow_lora_loading"], "--allow-lora-loading/--no-allow-lora-loading", show_default=False,
        help="Serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (with --api-key when one is set; "
        "default: off).",
    )),
    ("request_log", bool, typer.Option(
        _DEFAULTS["request_log"], "--request-log/--no-request-log", show_default=False,
        help="Log one info line per finished request: id, route, adapter, tokens in, cached and out, finish "
        "reason, total, validation, queue and inference time (never its text; default: on).",
    )),
)
_FLAGS_PARAMETER = "router_flags"


@dataclass(frozen=True)
class RouterFlags:
    """The router options as parsed: RouterConfig field → value, for every option in the table."""

    values: Mapping[str, Any] = field(repr=False)  # holds --api-key: never printed

    def config(self, *, master_shard_uds_path: str, tokenizer_name: str, env: Env) -> RouterConfig:
        """The RouterConfig these flags describe (validated there: a bad value raises ConfigError).
        Without --api-key the key comes from TGICTL_API_KEY, which keeps it out of `ps`; without
        --[no-]prefix-caching the setting comes from PREFIX_CACHING (default on)."""
        values = dict(self.values)
        if values["api_key"] is None:
            values["api_key"] = env.api_key
        if values["prefix_caching"] is None:
            values["prefix_caching"] = env.prefix_caching
        return RouterConfig(master_shard_uds_path=master_shard_uds_path, tokenizer_name=tokenizer_name, **values)


def with_router_options(command: Callable[..., None]) -> Callable[..., None]:
    """`command` with the router options added after its own flags. `command` declares a keyword-only
    `router_flags: RouterFlags` parameter, which Typer never sees: it is filled from those options."""
    own = inspect.signature(command, eval_str=True)
    if _FLAGS_PARAMETER not in own.parameters:
        raise TypeError(f"{command.__name__} must take a `{_FLAGS_PARAMETER}: RouterFlags` parameter")
    parameters = [p for p in own.parameters.values() if p.name != _FLAGS_PARAMETER]
    parameters += [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind)
        for name, kind, option in _OPTIONS
    ]

    @functools.wraps(command)
    def parsed(**kwargs: Any) -> None:
        router = {name: kwargs.pop(name) for name, _, _ in _OPTIONS}
        router["cors_allow_origin"] = tuple(router["cors_allow_origin"] or ())
        command(**kwargs, **{_FLAGS_PARAMETER: RouterFlags(router)})

    # Typer reads a command's flags from its signature and type hints: show it the combined ones.
    parsed.__signature__ = own.replace(parameters=parameters)  # type: ignore[attr-defined]
    parsed.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": own.return_annotation}
    return parsed
