"""`tgictl router`: TGI's router options."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from tgictl.config.process import TracingConfig
from tgictl.errors import ConfigError

# Most decode steps one Decode call may ask for (generate.proto's DecodeRequest.steps): a bound on one
# call's work, so that no router setting holds the device for minutes.
MAX_DECODE_STEPS = 64
MAX_ADAPTIVE_DECODE_STEPS = 16  # the most steps RouterConfig.decode_call_ms adds up to
# --reasoning-parser's choices (runtime/router/text/reasoning.py defines each).
REASONING_PARSERS: tuple[str, ...] = ("deepseek_r1", "qwen3")


class SchedulingPolicy(str, enum.Enum):
    """In which order waiting requests run and whom a full cache preempts (--scheduling-policy)."""

    FCFS = "fcfs"  # first come, first served (TGI's queue)
    PRIORITY = "priority"  # by the request's `priority`, lower first, then first come (vLLM's semantics)


@dataclass(frozen=True)
class RouterConfig:
    """`tgictl router`: TGI's router options. None = derived at start-up from the shard's warmup
    (TGI's launcher derives them the same way), as TGI derives them."""

    master_shard_uds_path: str
    tokenizer_name: str
    # The name /info, /v1/models and OpenAI responses report. None: tokenizer_name. The launcher sets
    # it to the model id the user asked for, since its tokenizer_name is the resolved local directory.
    served_model_name: str | None = None
    # What /info reports as model_id when it is not the served name: the launcher passes the path a local
    # model was given as (it serves it under a short name: plan.served_name).
    model_path: str | None = None
    hostname: str = "127.0.0.1"
    port: int = 8080
    max_concurrent_requests: int = 128
    max_best_of: int = 2
    max_stop_sequences: int = 4
    max_top_n_tokens: int = 5
    max_input_tokens: int | None = None
    max_total_tokens: int | None = None
    max_batch_prefill_tokens: int | None = None
    max_batch_total_tokens: int | None = None
    max_batch_size: int | None = None
    # A Prefill takes a request after its first only while the prompt tokens to compute stay within this, so a
    # burst of short prompts starts over several steps and the first ones stream early (docs/scheduling.md, "Prefill
    # groups"); one long prompt still fills --max-batch-prefill-tokens.
    # None: the device's default (scheduling/limits.py: 512 on a CPU, no limit on CUDA); 0: no limit.
    prefill_group_tokens: int | None = None
    # Decode steps per shard call while no request waits to join (runtime/shard/decode_steps.py): fewer
    # round trips per token, tokens streamed in bursts of up to this many. 1: one step per call, as TGI.
    decode_steps: int = 4
    # ... and more while the steps are short, until a call's forward lasts about this long (the previous call's
    # forward per step tells; at most MAX_ADAPTIVE_DECODE_STEPS), so the router's ~1.3 ms of CPU per call stays a
    # small part of a call for fast models too, and every model streams in bursts of about the same length
    # (4 steps of bf16 SmolLM2 on 2 cores: ~34 ms). 0: exactly decode_steps; decode_steps 1 is always one.
    decode_call_ms: float = 30.0
    # The radix prefix cache (TGI's PREFIX_CACHING). Off: every prompt is computed in full, and blocks
    # go straight back to the free list.
    prefix_caching: bool = True
    # Waiting requests run in arrival order (fcfs), or by their `priority` (lower first; a full cache
    # preempts the lowest priority first, and a waiting request may preempt running ones of lower priority).
    scheduling_policy: SchedulingPolicy = SchedulingPolicy.FCFS
    max_client_batch_size: int = 4
    api_key: str | None = field(default=None, repr=False)  # never printed
    cors_allow_origin: tuple[str, ...] = ()  # empty: any origin
    payload_limit: int = 2_000_000  # bytes of a request body
    # Slow clients (router/http/connection_guard.py): a request's headers must arrive within this many seconds
    # of its connection (or of the previous response), its body within the next; beyond max_connections open
    # connections a new one is answered 503 and closed.
    http_header_timeout_s: float = 10.0
    http_body_timeout_s: float = 60.0
    max_connections: int = 1024
    validation_workers: int = 2
    graceful_termination_timeout_s: float = 90.0
    max_new_tokens_per_round: int = 1024  # TGI's DEFAULT_GENERATION_LENGTH; longer requests continue
    otlp_endpoint: str | None = None  # OpenTelemetry collector (OTLP/gRPC); None: no tracing
    otlp_service_name: str = "tgictl.router"
    # Split a reasoning model's think text from its answer (docs/apis.md, "Reasoning"); None: off.
    reasoning_parser: str | None = None
    # POST /v1/load_lora_adapter and /v1/unload_lora_adapter (docs/apis.md, "Adapters at runtime"); off: 404.
    allow_lora_loading: bool = False
    # KV cache events over ZMQ in vLLM's format (router/kv_event_publisher.py); None: none published.
    kv_events_endpoint: str | None = None
    kv_events_replay_endpoint: str | None = None
    kv_events_topic: str = ""
    # One info line per finished request (router/request_log.py: ids, tokens, times; never text); off: none.
    request_log: bool = True

    def __post_init__(self) -> None:
        TracingConfig(self.otlp_endpoint, self.otlp_service_name)  # the same checks
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ConfigError(
                f"--reasoning-parser must be one of {', '.join(REASONING_PARSERS)}, got {self.reasoning_parser!r}"
            )
        if self.kv_events_endpoint is None and (self.kv_events_replay_endpoint is not None or self.kv_events_topic):
            raise ConfigError("--kv-events-replay-endpoint and --kv-events-topic need --kv-events-endpoint")
        # Keyed by the flag that sets each (max_new_tokens_per_round has none: it is the field's name).
        positive = {
            "--port": self.port,
            "--max-concurrent-requests": self.max_concurrent_requests,
            "--max-best-of": self.max_best_of,
            "--max-client-batch-size": self.max_client_batch_size,
            "--payload-limit": self.payload_limit,
            "--max-connections": self.max_connections,
            "--validation-workers": self.validation_workers,
            "max_new_tokens_per_round": self.max_new_tokens_per_round,
            "--decode-steps": self.decode_steps,
        }
        optional_positive = {
            "--max-input-tokens": self.max_input_tokens,
            "--max-total-tokens": self.max_total_tokens,
            "--max-batch-prefill-tokens": self.max_batch_prefill_tokens,
            "--max-batch-total-tokens": self.max_batch_total_tokens,
            "--max-batch-size": self.max_batch_size,
        }
        for name, value in {**positive, **{k: v for k, v in optional_positive.items() if v is not None}}.items():
            if value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        for flag, seconds in (("--http-header-timeout", self.http_header_timeout_s),
                              ("--http-body-timeout", self.http_body_timeout_s)):
            if not seconds > 0:
                raise ConfigError(f"{flag} must be > 0 seconds, got {seconds}")
        if self.max_connections <= self.max_concurrent_requests:
            raise ConfigError(
                f"--max-connections ({self.max_connections}) must be above --max-concurrent-requests "
                f"({self.max_concurrent_requests}): every request holds a connection, and /health needs one too"
            )
        if self.prefill_group_tokens is not None and self.prefill_group_tokens < 0:
            raise ConfigError(f"--prefill-group-tokens must be >= 0, got {self.prefill_group_tokens}")
        if not 0 <= self.decode_call_ms <= 10_000:
            raise ConfigError(f"--decode-call-ms must be within 0..10000, got {self.decode_call_ms}")
        if self.decode_steps > MAX_DECODE_STEPS:
            raise ConfigError(f"--decode-steps must be <= {MAX_DECODE_STEPS}, got {self.decode_steps}")
        if self.port > 65535:
            raise ConfigError(f"--port must be <= 65535, got {self.port}")
        for name, value in (("--max-stop-sequences", self.max_stop_sequences),
                            ("--max-top-n-tokens", self.max_top_n_tokens)):
            if value < 0:
                raise ConfigError(f"{name} must be >= 0, got {value}")
        if self.graceful_termination_timeout_s < 0:
            raise ConfigError(
                f"--graceful-termination-timeout must be >= 0 seconds, got {self.graceful_termination_timeout_s}"
            )
        if (self.max_input_tokens is not None and self.max_total_tokens is not None
                and self.max_input_tokens >= self.max_total_tokens):
            raise ConfigError(
                f"--max-input-tokens ({self.max_input_tokens}) must be < --max-total-tokens ({self.max_total_tokens})"
            )
        if self.api_key is not None and not self.api_key:
            raise ConfigError("--api-key must not be empty")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ConfigError("--served-model-name must not be empty")
        if self.model_path is not None and not self.model_path.strip():
            raise ConfigError("--model-path must not be empty")

    @property
    def tracing(self) -> TracingConfig:
        return TracingConfig(self.otlp_endpoint, self.otlp_service_name)

    @property
    def model_name(self) -> str:
        """The model's name as the API reports it."""
        return self.served_model_name if self.served_model_name is not None else self.tokenizer_name
