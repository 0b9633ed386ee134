"""Configuration: one frozen dataclass per component, validated in __post_init__.

Commands turn flags (and the Env) into these objects; runtime code takes them as arguments and never
reads flags or environment variables itself. Messages name the field and the allowed values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tgictl.env import Env
from tgictl.errors import ConfigError
from tgictl.kv_cache_dtype import DEFAULT_KV_CACHE_DTYPE, check_kv_cache_dtype
from tgictl.quantization import QuantizeSpec

LOG_LEVELS: tuple[str, ...] = ("debug", "info", "warning", "error", "critical")
CONVERT_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
DEFAULT_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class LogConfig:
    """How a process logs. `level` is one of LOG_LEVELS (lower case)."""

    level: str = "info"
    json_output: bool = False

    def __post_init__(self) -> None:
        if self.level.lower() not in LOG_LEVELS:
            raise ConfigError(f"log level must be one of {', '.join(LOG_LEVELS)}, got {self.level!r}")
        object.__setattr__(self, "level", self.level.lower())


@dataclass(frozen=True)
class HubConfig:
    """Where and how models are resolved and fetched from the Hugging Face hub."""

    hub_cache_dir: Path  # huggingface_hub's repository cache (HF_HUB_CACHE / HF_HOME/hub)
    cache_dir: Path  # tgictl's own cache (converted models)
    offline: bool = False
    endpoint: str | None = None
    token: str | None = None
    # Seconds to wait for the hub's metadata answer. Short on purpose: an unreachable hub must turn
    # into an error within seconds, never a hang.
    timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ConfigError(f"hub timeout_s must be > 0, got {self.timeout_s}")

    def __repr__(self) -> str:  # keep the token out of logs and tracebacks
        return (
            f"HubConfig(hub_cache_dir={self.hub_cache_dir!r}, cache_dir={self.cache_dir!r}, "
            f"offline={self.offline}, endpoint={self.endpoint!r}, token={'***' if self.token else None}, "
            f"timeout_s={self.timeout_s})"
        )

    @classmethod
    def from_env(cls, env: Env) -> HubConfig:
        return cls(
            hub_cache_dir=env.hub_cache_dir,
            cache_dir=env.cache_dir,
            offline=env.hf_hub_offline,
            endpoint=env.hf_endpoint,
            token=env.hf_token,
            timeout_s=env.hf_hub_etag_timeout if env.hf_hub_etag_timeout is not None else 5.0,
        )


@dataclass(frozen=True)
class DownloadConfig:
    model_id: str
    revision: str | None = None
    local_dir: Path | None = None

    def __post_init__(self) -> None:
        if not self.model_id.strip():
            raise ConfigError("model_id must not be empty")


@dataclass(frozen=True)
class ConvertConfig:
    """`dtype` None keeps a PyTorch checkpoint's own dtypes; GGUF (quantized) then becomes float32."""

    path: Path
    dtype: str | None = None
    output: Path | None = None  # None: next to the input, or under cache_dir when that is an installed package
    force: bool = False
    cache_dir: Path | None = None  # tgictl's cache (Env.cache_dir); where outputs go that must not go next to the input

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in CONVERT_DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(CONVERT_DTYPES)}, got {self.dtype!r}")


SHARD_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
# Unix socket paths are limited to 108 bytes (sun_path) including the NUL; the shard also binds a
# temporary name a few bytes longer than the final one.
MAX_UDS_PATH_BYTES = 90
# Most decode steps one Decode call may ask for (generate.proto's DecodeRequest.steps): a bound on one
# call's work, so that no router setting holds the device for minutes.
MAX_DECODE_STEPS = 64
MAX_ADAPTIVE_DECODE_STEPS = 16  # the most steps RouterConfig.decode_call_ms adds up to


def default_uds_path(uid: int) -> Path:
    """`/tmp/tgictl-{uid}/server`: TGI's `/tmp/text-generation-server`, inside a directory only the
    user can write, so no other local user can plant or replace a shard socket."""
    return Path("/tmp") / f"tgictl-{uid}" / "server"


# Names a request can give that mean the base model (OpenAI's `model` field): never an adapter's name.
BASE_MODEL_ALIASES: tuple[str, ...] = ("tgi",)
# The base model's label in the per-adapter metrics: not an adapter name either.
BASE_MODEL_LABEL = "base"
# --reasoning-parser's choices (runtime/router/text/reasoning.py defines each).
REASONING_PARSERS: tuple[str, ...] = ("deepseek_r1", "qwen3")


@dataclass(frozen=True)
class LoraAdapterSpec:
    """One `--lora-adapters` entry: `name=PATH` (a local PEFT directory) or a hub id `owner/name[@revision]`
    (named by its id), resolved like models (docs/architecture.md, "Multi-LoRA")."""

    name: str
    source: str  # a local directory or a hub id
    revision: str | None = None

    def flag(self) -> str:
        """The entry as --lora-adapters spells it (the launcher passes resolved directories this way)."""
        return f"{self.name}={self.source}"


def parse_lora_adapters(text: str | None) -> tuple[LoraAdapterSpec, ...]:
    """`a=/path/a,owner/b@main` -> the entries, in order; names must be unique and not a base alias."""
    specs: list[LoraAdapterSpec] = []
    for raw in (text or "").split(","):
        entry = raw.strip()
        if not entry:
            continue
        name, sep, source = entry.partition("=")
        revision = None
        if not sep:
            source, _, rev = entry.partition("@")
            name, revision = source, rev or None
        name, source = name.strip(), source.strip()
        if not name or not source:
            raise ConfigError(f"--lora-adapters entries are name=PATH or a hub id[@revision], got {entry!r}")
        if name in (*BASE_MODEL_ALIASES, BASE_MODEL_LABEL):
            raise ConfigError(f"LoRA adapter name {name!r} is reserved for the base model")
        if any(s.name == name for s in specs):
            raise ConfigError(f"LoRA adapter name {name!r} is given twice")
        specs.append(LoraAdapterSpec(name, source, revision))
    return tuple(specs)


# One device job (a Prefill of max_batch_prefill_tokens, a Decode of up to 64 steps) runs well under this even for
# 8B models on a few CPU cores (a 4,096-token prefill there is ~2 minutes); a job past it is hung.
DEFAULT_HEALTH_STEP_TIMEOUT_S = 300.0


def _check_health_step_timeout(seconds: float) -> None:
    if not seconds > 0:
        raise ConfigError(f"--health-step-timeout must be > 0 seconds, got {seconds}")


def _check_shard_settings(model_id: str, dtype: str | None, block_size: int, kv_cache_memory: int | None,
                          kv_cache_dtype: str) -> None:
    """The settings a shard takes, checked the same way wherever they are given (shard or launch)."""
    check_kv_cache_dtype(kv_cache_dtype)
    if not model_id.strip():
        raise ConfigError("model_id must not be empty")
    if dtype is not None and dtype not in SHARD_DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(SHARD_DTYPES)}, got {dtype!r}")
    if block_size < 1:
        raise ConfigError(f"block_size must be >= 1, got {block_size}")
    if kv_cache_memory is not None and kv_cache_memory < 1:
        raise ConfigError(f"kv_cache_memory must be >= 1 byte, got {kv_cache_memory}")


@dataclass(frozen=True)
class TracingConfig:
    """OpenTelemetry export of one process's spans (TGI's --otlp-endpoint, --otlp-service-name)."""

    otlp_endpoint: str | None = None  # an OTLP/gRPC collector, e.g. http://127.0.0.1:4317; None: off
    service_name: str = "tgictl.router"
    export_delay_ms: int = 1000  # how long finished spans wait to be sent in one batch

    def __post_init__(self) -> None:
        if self.otlp_endpoint is not None and not self.otlp_endpoint.strip():
            raise ConfigError("otlp_endpoint must not be empty")
        if not self.service_name.strip():
            raise ConfigError("otlp_service_name must not be empty")


SHARD_SERVICE_SUFFIX = ".shard"


def shard_service_name(router_service_name: str) -> str:
    """The shards' service name beside the router's (TGI: ...router and ...server)."""
    return router_service_name.removesuffix(".router") + SHARD_SERVICE_SUFFIX


@dataclass(frozen=True)
class SpeculationConfig:
    """Speculative decoding with n-gram drafts from the request's own text (TGI's --speculate;
    docs/architecture.md, "Speculative decoding"). `tokens` = 0 turns it off."""

    tokens: int = 0  # draft tokens verified per step at most
    ngram_min: int = 1  # shortest suffix looked up in the row's text
    ngram_max: int = 3  # longest suffix looked up (the longest match wins)
    max_batch: int = 4  # a step with more decoding rows drafts nothing (verification is compute then)
    min_acceptance: float = 0.3  # a row accepting fewer of its recent drafts pauses drafting
    pause_steps: int = 16

    def __post_init__(self) -> None:
        if not 0 <= self.tokens <= 16:
            raise ConfigError(f"speculate must be in 0 .. 16, got {self.tokens}")
        if not 1 <= self.ngram_min <= self.ngram_max <= 16:
            raise ConfigError(
                f"speculate n-gram sizes must satisfy 1 <= min <= max <= 16, got {self.ngram_min}..{self.ngram_max}"
            )
        if self.max_batch < 1:
            raise ConfigError(f"speculate max batch must be >= 1, got {self.max_batch}")
        if not 0.0 <= self.min_acceptance <= 1.0:
            raise ConfigError(f"speculate min acceptance must be in 0 .. 1, got {self.min_acceptance}")
        if self.pause_steps < 0:
            raise ConfigError(f"speculate pause steps must be >= 0, got {self.pause_steps}")


@dataclass(frozen=True)
class ShardConfig:
    """One rank of `tgictl shard`. The rank listens on `unix://{uds_path}-{rank}`."""

    model_id: str
    uds_path: Path
    revision: str | None = None
    dtype: str | None = None  # None: bfloat16 on CUDA and on CPUs with native bf16 math, else float32
    block_size: int = 16  # tokens per KV block
    kv_cache_memory: int | None = None  # bytes; None: the runtime's default budget
    kv_cache_dtype: str = DEFAULT_KV_CACHE_DTYPE  # --kv-cache-dtype: the cache's format (docs/kv-cache.md)
    quantize: QuantizeSpec | None = None  # --quantize: safetensors projections quantized at load
    batch_invariant: bool = False  # --batch-invariant: linears in fixed row blocks (kernels/batch_invariance.py)
    rank: int = 0
    world_size: int = 1
    master_addr: str | None = None  # torch.distributed rendezvous; required when world_size > 1
    master_port: int | None = None
    shutdown_grace_s: float = 30.0  # SIGTERM: how long the RPC in flight may still run
    # --health-step-timeout: the Health RPC reports the rank unhealthy once one device job (a step) has run
    # longer than this (a hung collective or device); it never waits for the step itself.
    health_step_timeout_s: float = DEFAULT_HEALTH_STEP_TIMEOUT_S
    tracing: TracingConfig = field(default_factory=lambda: TracingConfig(service_name="tgictl.shard"))
    speculation: SpeculationConfig = field(default_factory=SpeculationConfig)
    lora_adapters: tuple[LoraAdapterSpec, ...] = ()  # served beside the base model, in this order

    def __post_init__(self) -> None:
        _check_shard_settings(self.model_id, self.dtype, self.block_size, self.kv_cache_memory, self.kv_cache_dtype)
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"RANK must be in 0 .. WORLD_SIZE - 1, got RANK={self.rank}, WORLD_SIZE={self.world_size}"
            )
        if self.world_size > 1 and (self.master_addr is None or self.master_port is None):
            raise ConfigError("MASTER_ADDR and MASTER_PORT must be set when WORLD_SIZE > 1")
        if not self.uds_path.is_absolute():
            raise ConfigError(f"uds_path must be an absolute path, got {str(self.uds_path)!r}")
        if len(str(self.socket_path(self.world_size - 1)).encode()) > MAX_UDS_PATH_BYTES:
            raise ConfigError(
                f"uds_path {str(self.uds_path)!r} is too long for a Unix socket: at most "
                f"{MAX_UDS_PATH_BYTES} bytes with the '-{{rank}}' suffix"
            )
        if self.shutdown_grace_s < 0:
            raise ConfigError(f"shutdown_grace_s must be >= 0, got {self.shutdown_grace_s}")
        _check_health_step_timeout(self.health_step_timeout_s)

    def socket_path(self, rank: int) -> Path:
        return Path(f"{self.uds_path}-{rank}")

    @property
    def urls(self) -> tuple[str, ...]:
        """Every rank's URL, index = rank (what ServiceDiscovery answers)."""
        return tuple(f"unix://{self.socket_path(rank)}" for rank in range(self.world_size))


@dataclass(frozen=True)
class RouterConfig:
    """`tgictl router`: TGI's router options. None = derived at start-up from the shard's warmup
    (TGI's launcher derives them the same way), as TGI derives them."""

    master_shard_uds_path: str
    tokenizer_name: str
    # The name /info, /v1/models and OpenAI responses report. None: tokenizer_name. The launcher sets
    # it to the model id the user asked for, since its tokenizer_name is the resolved local directory.
    served_model_name: str | None = None
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

    def __post_init__(self) -> None:
        TracingConfig(self.otlp_endpoint, self.otlp_service_name)  # the same checks
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ConfigError(
                f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)}, got {self.reasoning_parser!r}"
            )
        if self.kv_events_endpoint is None and (self.kv_events_replay_endpoint is not None or self.kv_events_topic):
            raise ConfigError("--kv-events-replay-endpoint and --kv-events-topic need --kv-events-endpoint")
        positive = {
            "port": self.port,
            "max_concurrent_requests": self.max_concurrent_requests,
            "max_best_of": self.max_best_of,
            "max_client_batch_size": self.max_client_batch_size,
            "payload_limit": self.payload_limit,
            "max_connections": self.max_connections,
            "validation_workers": self.validation_workers,
            "max_new_tokens_per_round": self.max_new_tokens_per_round,
            "decode_steps": self.decode_steps,
        }
        optional_positive = {
            "max_input_tokens": self.max_input_tokens,
            "max_total_tokens": self.max_total_tokens,
            "max_batch_prefill_tokens": self.max_batch_prefill_tokens,
            "max_batch_total_tokens": self.max_batch_total_tokens,
            "max_batch_size": self.max_batch_size,
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
        if not 0 <= self.decode_call_ms <= 10_000:
            raise ConfigError(f"decode_call_ms must be within 0..10000, got {self.decode_call_ms}")
        if self.decode_steps > MAX_DECODE_STEPS:
            raise ConfigError(f"decode_steps must be <= {MAX_DECODE_STEPS}, got {self.decode_steps}")
        if self.port > 65535:
            raise ConfigError(f"port must be <= 65535, got {self.port}")
        for name, value in (("max_stop_sequences", self.max_stop_sequences), ("max_top_n_tokens", self.max_top_n_tokens)):
            if value < 0:
                raise ConfigError(f"{name} must be >= 0, got {value}")
        if self.graceful_termination_timeout_s < 0:
            raise ConfigError(
                f"graceful_termination_timeout_s must be >= 0, got {self.graceful_termination_timeout_s}"
            )
        if (self.max_input_tokens is not None and self.max_total_tokens is not None
                and self.max_input_tokens >= self.max_total_tokens):
            raise ConfigError(
                f"`max_input_tokens` must be < `max_total_tokens`, got max_input_tokens={self.max_input_tokens} "
                f"and max_total_tokens={self.max_total_tokens}"
            )
        if self.api_key is not None and not self.api_key:
            raise ConfigError("api_key must not be empty")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ConfigError("served_model_name must not be empty")

    @property
    def tracing(self) -> TracingConfig:
        return TracingConfig(self.otlp_endpoint, self.otlp_service_name)

    @property
    def model_name(self) -> str:
        """The model's name as the API reports it."""
        return self.served_model_name if self.served_model_name is not None else self.tokenizer_name


# SMG's routing policies `--gateway-policy` offers (SMG's own names; docs/replicas.md compares three).
GATEWAY_POLICIES: tuple[str, ...] = (
    "cache_aware", "round_robin", "prefix_hash", "power_of_two", "least_load", "consistent_hashing", "random",
)


@dataclass(frozen=True)
class LaunchConfig:
    """`tgictl launch`: N shard processes and one router, supervised together.

    `router` carries every router option; the launcher replaces its `master_shard_uds_path` and
    `tokenizer_name` with rank 0's socket and the resolved model directory, so both are placeholders
    here, and sets its `served_model_name` to `model_id` unless the user chose one. `shard_uds_path`
    None: a fresh private directory per launch, removed on exit (two launches by one user never share
    sockets).
    """

    router: RouterConfig
    model_id: str = DEFAULT_MODEL_ID
    revision: str | None = None
    num_shard: int = 1
    dtype: str | None = None
    block_size: int = 16
    kv_cache_memory: int | None = None  # bytes per shard
    kv_cache_dtype: str = DEFAULT_KV_CACHE_DTYPE  # passed to every shard
    quantize: QuantizeSpec | None = None  # passed to every shard
    batch_invariant: bool = False  # passed to every shard
    shard_uds_path: Path | None = None
    master_addr: str = "127.0.0.1"
    master_port: int | None = None  # None: a free port on this host
    lora_adapters: tuple[LoraAdapterSpec, ...] = ()  # resolved once, passed to every shard as directories
    # After the router stopped no RPC is in flight, so a shard that ignores SIGTERM this long is stuck
    # (in a collective, say) and gets SIGKILL.
    shard_stop_timeout_s: float = 10.0
    # After a child died the rest cannot serve: they get this long after SIGTERM, then SIGKILL.
    crash_stop_timeout_s: float = 3.0
    progress_interval_s: float = 5.0  # how often "waiting for shards" is logged
    speculation: SpeculationConfig = field(default_factory=SpeculationConfig)
    health_step_timeout_s: float = DEFAULT_HEALTH_STEP_TIMEOUT_S  # passed to every shard (ShardConfig)
    # Replicas (docs/replicas.md): above 1, that many routers-with-shards on private ports behind the SMG
    # gateway on `router.port`, each pinned to its own cores (`replica_cpus`: one cpulist each, or planned).
    replicas: int = 1
    replica_cpus: tuple[str, ...] = ()
    gateway_policy: str = "cache_aware"
    replica_restart_delay_s: float = 1.0  # before a dead replica starts again (doubles while it keeps dying)

    def __post_init__(self) -> None:
        _check_shard_settings(self.model_id, self.dtype, self.block_size, self.kv_cache_memory, self.kv_cache_dtype)
        if self.num_shard < 1:
            raise ConfigError(f"num_shard must be >= 1, got {self.num_shard}")
        if self.replicas < 1:
            raise ConfigError(f"--replicas must be >= 1, got {self.replicas}")
        if self.replicas == 1 and self.replica_cpus:
            raise ConfigError("--replica-cpus needs --replicas 2 or more")
        if self.gateway_policy not in GATEWAY_POLICIES:
            raise ConfigError(f"--gateway-policy must be one of {', '.join(GATEWAY_POLICIES)}, got {self.gateway_policy!r}")
        if self.replica_restart_delay_s < 0:
            raise ConfigError(f"replica_restart_delay_s must be >= 0, got {self.replica_restart_delay_s}")
        if self.master_port is not None and not 1 <= self.master_port <= 65535:
            raise ConfigError(f"master_port must be in 1 .. 65535, got {self.master_port}")
        if not self.master_addr.strip():
            raise ConfigError("master_addr must not be empty")
        if self.shard_uds_path is not None:
            if not self.shard_uds_path.is_absolute():
                raise ConfigError(f"shard_uds_path must be an absolute path, got {str(self.shard_uds_path)!r}")
            last_socket = f"{self.shard_uds_path}-{self.num_shard - 1}"
            if len(last_socket.encode()) > MAX_UDS_PATH_BYTES:
                raise ConfigError(
                    f"shard_uds_path {str(self.shard_uds_path)!r} is too long for a Unix socket: at most "
                    f"{MAX_UDS_PATH_BYTES} bytes with the '-{{rank}}' suffix"
                )
        for name, value in (("shard_stop_timeout_s", self.shard_stop_timeout_s),
                            ("crash_stop_timeout_s", self.crash_stop_timeout_s)):
            if value < 0:
                raise ConfigError(f"{name} must be >= 0, got {value}")
        if self.progress_interval_s <= 0:
            raise ConfigError(f"progress_interval_s must be > 0, got {self.progress_interval_s}")
        _check_health_step_timeout(self.health_step_timeout_s)


BENCH_APIS: tuple[str, ...] = ("tgi", "openai-chat", "openai-completions")
BENCH_WORKLOADS: tuple[str, ...] = ("random", "shared-prefix", "file")


@dataclass(frozen=True)
class BenchConfig:
    """`tgictl bench`: an HTTP load test of a server (`url`) or TGI's static-batch benchmark straight
    through a shard's gRPC socket (`shard_uds_path`); exactly one is set. Lengths are tokens, times
    seconds; ranges are inclusive (low, high)."""

    url: str | None = None
    shard_uds_path: str | None = None
    api: str = "tgi"
    model_id: str | None = None  # the tokenizer (exact prompt lengths) and the OpenAI `model` field
    tokenizer: str | None = None  # overrides model_id's tokenizer
    api_key: str | None = field(default=None, repr=False)  # never printed
    workload: str = "random"
    input_len: tuple[int, int] = (256, 256)  # shared-prefix: the tokens after the prefix
    output_len: tuple[int, int] | None = None  # None: 128, or the dataset's reference replies
    prefix_len: int = 1024
    groups: int = 4
    prompts_per_group: int = 8
    dataset: Path | None = None
    concurrency: tuple[int, ...] = (1,)  # closed loop: one run per value
    request_rate: tuple[float, ...] = ()  # open loop (Poisson, requests/s): one run per value
    num_requests: int | None = None  # None: the workload's size (random: 100) unless duration_s is set
    duration_s: float | None = None
    warmup: int = 0  # requests sent once before the first run, left out of every figure
    ignore_eos: bool = False
    slo: tuple[tuple[str, float], ...] = ()  # (key, seconds) with key in ttft, tpot, e2e
    seed: int = 0
    output: Path | None = None
    report: Path | None = None  # an HTML page of the HTTP runs (inline SVG plots)
    request_timeout_s: float = 600.0
    metrics_interval_s: float = 0.5
    # Shard micro-benchmark (TGI's benchmark defaults).
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    sequence_length: int = 10
    decode_length: int = 8
    runs: int = 10
    warmups: int = 1

    def __post_init__(self) -> None:
        if (self.url is None) == (self.shard_uds_path is None):
            raise ConfigError("give exactly one of --url (HTTP load test) and --shard (gRPC micro-benchmark)")
        if self.report is not None and self.url is None:
            raise ConfigError("--report plots HTTP load tests: it needs --url")
        if self.api not in BENCH_APIS:
            raise ConfigError(f"api must be one of {', '.join(BENCH_APIS)}, got {self.api!r}")
        if self.workload not in BENCH_WORKLOADS:
            raise ConfigError(f"workload must be one of {', '.join(BENCH_WORKLOADS)}, got {self.workload!r}")
        if self.workload == "file" and self.dataset is None:
            raise ConfigError("the file workload needs --dataset PATH")
        for name, bounds in (("input_len", self.input_len), ("output_len", self.output_len)):
            if bounds is not None and not 1 <= bounds[0] <= bounds[1]:
                raise ConfigError(f"{name} must satisfy 1 <= MIN <= MAX, got {bounds[0]}:{bounds[1]}")
        positive = {"prefix_len": self.prefix_len, "groups": self.groups, "prompts_per_group": self.prompts_per_group,
                    "sequence_length": self.sequence_length, "decode_length": self.decode_length, "runs": self.runs}
        for name, value in positive.items():
            if value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        for name, values in (("concurrency", self.concurrency), ("batch_sizes", self.batch_sizes)):
            if not values or any(v < 1 for v in values):
                raise ConfigError(f"{name} must be one or more integers >= 1, got {list(values)}")
        if any(not r > 0 for r in self.request_rate):
            raise ConfigError(f"request_rate must be > 0 requests/s, got {list(self.request_rate)}")
        if self.num_requests is not None and self.num_requests < 1:
            raise ConfigError(f"num_requests must be >= 1, got {self.num_requests}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ConfigError(f"duration_s must be > 0, got {self.duration_s}")
        for name, value in (("warmup", self.warmup), ("warmups", self.warmups)):
            if value < 0:
                raise ConfigError(f"{name} must be >= 0, got {value}")
        for name, seconds in (("request_timeout_s", self.request_timeout_s),
                              ("metrics_interval_s", self.metrics_interval_s)):
            if not seconds > 0:
                raise ConfigError(f"{name} must be > 0, got {seconds}")
        if any(key not in ("ttft", "tpot", "e2e") or not seconds > 0 for key, seconds in self.slo):
            raise ConfigError(f"slo entries must be ttft, tpot or e2e with seconds > 0, got {dict(self.slo)}")
