"""Configuration: one frozen dataclass per component, validated in __post_init__.

Commands turn flags (and the Env) into these objects; runtime code takes them as arguments and never
reads flags or environment variables itself. Messages name the flag that sets the value as the user
types it (`--num-shard must be >= 1, got 0`; the variable where only the environment sets it) and the
allowed values.

One module per component (process.py: logging and tracing; model_files.py; lora.py; shard.py; router.py;
launch.py; bench.py); everything is imported from here, `from tgictl.config import RouterConfig`.
"""

from tgictl.config.bench import BENCH_APIS, BENCH_WORKLOADS, BenchConfig
from tgictl.config.launch import GATEWAY_POLICIES, LaunchConfig, check_replicas
from tgictl.config.lora import BASE_MODEL_ALIASES, BASE_MODEL_LABEL, LoraAdapterSpec, parse_lora_adapters
from tgictl.config.model_files import (
    CONVERT_DTYPES,
    DEFAULT_MODEL_ID,
    ConvertConfig,
    DownloadConfig,
    HubConfig,
    check_model_id,
)
from tgictl.config.process import LOG_LEVELS, SHARD_SERVICE_SUFFIX, LogConfig, TracingConfig, shard_service_name
from tgictl.config.router import MAX_ADAPTIVE_DECODE_STEPS, MAX_DECODE_STEPS, REASONING_PARSERS, RouterConfig
from tgictl.config.shard import (
    DEFAULT_HEALTH_STEP_TIMEOUT_S,
    MAX_UDS_PATH_BYTES,
    SHARD_DTYPES,
    ShardConfig,
    SpeculationConfig,
    default_uds_path,
)

__all__ = [
    "BASE_MODEL_ALIASES", "BASE_MODEL_LABEL", "BENCH_APIS", "BENCH_WORKLOADS", "CONVERT_DTYPES",
    "DEFAULT_HEALTH_STEP_TIMEOUT_S", "DEFAULT_MODEL_ID", "GATEWAY_POLICIES", "LOG_LEVELS", "MAX_ADAPTIVE_DECODE_STEPS",
    "MAX_DECODE_STEPS", "MAX_UDS_PATH_BYTES", "REASONING_PARSERS", "SHARD_DTYPES", "SHARD_SERVICE_SUFFIX",
    "BenchConfig", "ConvertConfig", "DownloadConfig", "HubConfig", "LaunchConfig", "LogConfig", "LoraAdapterSpec",
    "RouterConfig", "ShardConfig", "SpeculationConfig", "TracingConfig", "default_uds_path", "parse_lora_adapters",
    "check_model_id", "check_replicas", "shard_service_name",
]
