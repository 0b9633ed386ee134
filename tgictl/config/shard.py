"""`tgictl shard`: one rank's settings, and the checks the launcher's copies of them share."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tgictl.config.lora import LoraAdapterSpec
from tgictl.config.model_files import check_model_id
from tgictl.config.process import TracingConfig
from tgictl.errors import ConfigError
from tgictl.kv_cache_dtype import DEFAULT_KV_CACHE_DTYPE, check_kv_cache_dtype
from tgictl.quantization import QuantizeSpec

SHARD_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
# Unix socket paths are limited to 108 bytes (sun_path) including the NUL; the shard also binds a
# temporary name a few bytes longer than the final one.
MAX_UDS_PATH_BYTES = 90


def default_uds_path(uid: int) -> Path:
    """`/tmp/tgictl-{uid}/server`: TGI's `/tmp/text-generation-server`, inside a directory only the
    user can write, so no other local user can plant or replace a shard socket."""
    return Path("/tmp") / f"tgictl-{uid}" / "server"


# One device job (a Prefill of max_batch_prefill_tokens, a Decode of up to 64 steps) runs well under this even for
# 8B models on a few CPU cores (a 4,096-token prefill there is ~2 minutes); a job past it is hung.
DEFAULT_HEALTH_STEP_TIMEOUT_S = 300.0


def check_health_step_timeout(seconds: float) -> None:
    if not seconds > 0:
        raise ConfigError(f"--health-step-timeout must be > 0 seconds, got {seconds}")


def check_shard_settings(model_id: str, dtype: str | None, block_size: int, kv_cache_memory: int | None,
                         kv_cache_dtype: str) -> None:
    """The settings a shard takes, checked the same way wherever they are given (shard or launch)."""
    check_kv_cache_dtype(kv_cache_dtype)
    check_model_id(model_id)
    if dtype is not None and dtype not in SHARD_DTYPES:
        raise ConfigError(f"--dtype must be one of {', '.join(SHARD_DTYPES)}, got {dtype!r}")
    if block_size < 1:
        raise ConfigError(f"--block-size must be >= 1, got {block_size}")
    if kv_cache_memory is not None and kv_cache_memory < 1:
        raise ConfigError(f"--kv-cache-memory must be >= 1 byte, got {kv_cache_memory}")


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
            raise ConfigError(f"--speculate must be in 0 .. 16, got {self.tokens}")
        if not 1 <= self.ngram_min <= self.ngram_max <= 16:
            raise ConfigError(
                f"--speculate-ngram-min and --speculate-ngram-max must satisfy 1 <= min <= max <= 16, "
                f"got {self.ngram_min} and {self.ngram_max}"
            )
        if self.max_batch < 1:
            raise ConfigError(f"--speculate-max-batch must be >= 1, got {self.max_batch}")
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
        check_shard_settings(self.model_id, self.dtype, self.block_size, self.kv_cache_memory, self.kv_cache_dtype)
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"RANK must be in 0 .. WORLD_SIZE - 1, got RANK={self.rank}, WORLD_SIZE={self.world_size}"
            )
        if self.world_size > 1 and (self.master_addr is None or self.master_port is None):
            raise ConfigError("MASTER_ADDR and MASTER_PORT must be set when WORLD_SIZE > 1")
        if not self.uds_path.is_absolute():
            raise ConfigError(f"--uds-path must be an absolute path, got {str(self.uds_path)!r}")
        if len(str(self.socket_path(self.world_size - 1)).encode()) > MAX_UDS_PATH_BYTES:
            raise ConfigError(
                f"--uds-path {str(self.uds_path)!r} is too long for a Unix socket: at most "
                f"{MAX_UDS_PATH_BYTES} bytes with the '-{{rank}}' suffix"
            )
        if self.shutdown_grace_s < 0:
            raise ConfigError(f"shutdown_grace_s must be >= 0, got {self.shutdown_grace_s}")
        check_health_step_timeout(self.health_step_timeout_s)

    def socket_path(self, rank: int) -> Path:
        return Path(f"{self.uds_path}-{rank}")

    @property
    def urls(self) -> tuple[str, ...]:
        """Every rank's URL, index = rank (what ServiceDiscovery answers)."""
        return tuple(f"unix://{self.socket_path(rank)}" for rank in range(self.world_size))
