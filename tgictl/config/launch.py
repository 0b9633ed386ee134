"""`tgictl launch`: shards and a router (or replicas of both behind a gateway), supervised together."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tgictl.config.lora import LoraAdapterSpec
from tgictl.config.model_files import DEFAULT_MODEL_ID
from tgictl.config.router import RouterConfig
from tgictl.config.shard import (
    DEFAULT_HEALTH_STEP_TIMEOUT_S,
    MAX_UDS_PATH_BYTES,
    SpeculationConfig,
    check_health_step_timeout,
    check_shard_settings,
)
from tgictl.errors import ConfigError
from tgictl.kv_cache_dtype import DEFAULT_KV_CACHE_DTYPE
from tgictl.quantization import QuantizeSpec

# SMG's routing policies `--gateway-policy` offers (SMG's own names; docs/replicas.md compares three).
GATEWAY_POLICIES: tuple[str, ...] = (
    "cache_aware", "round_robin", "prefix_hash", "power_of_two", "least_load", "consistent_hashing", "random",
)


def check_replicas(replicas: int, replica_cpus: tuple[str, ...]) -> None:
    """--replicas and --replica-cpus as `launch` and `profile` take them."""
    if replicas < 1:
        raise ConfigError(f"--replicas must be >= 1, got {replicas}")
    if replicas == 1 and replica_cpus:
        raise ConfigError("--replica-cpus needs --replicas 2 or more")


@dataclass(frozen=True)
class LaunchConfig:
    """`tgictl launch`: N shard processes and one router, supervised together.

    `router` carries every router option; the launcher replaces its `master_shard_uds_path` and
    `tokenizer_name` with rank 0's socket and the resolved model directory, so both are placeholders
    here, and sets its `served_model_name` to `model_id` (a local path: its short name, plan.served_name)
    unless the user chose one. `shard_uds_path`
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
        check_shard_settings(self.model_id, self.dtype, self.block_size, self.kv_cache_memory, self.kv_cache_dtype)
        if self.num_shard < 1:
            raise ConfigError(f"--num-shard must be >= 1, got {self.num_shard}")
        check_replicas(self.replicas, self.replica_cpus)
        if self.gateway_policy not in GATEWAY_POLICIES:
            raise ConfigError(f"--gateway-policy must be one of {', '.join(GATEWAY_POLICIES)}, got {self.gateway_policy!r}")
        if self.replica_restart_delay_s < 0:
            raise ConfigError(f"replica_restart_delay_s must be >= 0, got {self.replica_restart_delay_s}")
        if self.master_port is not None and not 1 <= self.master_port <= 65535:
            raise ConfigError(f"--master-port must be in 1 .. 65535, got {self.master_port}")
        if not self.master_addr.strip():
            raise ConfigError("--master-addr must not be empty")
        if self.shard_uds_path is not None:
            if not self.shard_uds_path.is_absolute():
                raise ConfigError(f"--shard-uds-path must be an absolute path, got {str(self.shard_uds_path)!r}")
            last_socket = f"{self.shard_uds_path}-{self.num_shard - 1}"
            if len(last_socket.encode()) > MAX_UDS_PATH_BYTES:
                raise ConfigError(
                    f"--shard-uds-path {str(self.shard_uds_path)!r} is too long for a Unix socket: at most "
                    f"{MAX_UDS_PATH_BYTES} bytes with the '-{{rank}}' suffix"
                )
        for name, value in (("shard_stop_timeout_s", self.shard_stop_timeout_s),
                            ("crash_stop_timeout_s", self.crash_stop_timeout_s)):
            if value < 0:
                raise ConfigError(f"{name} must be >= 0, got {value}")
        if self.progress_interval_s <= 0:
            raise ConfigError(f"progress_interval_s must be > 0, got {self.progress_interval_s}")
        check_health_step_timeout(self.health_step_timeout_s)
