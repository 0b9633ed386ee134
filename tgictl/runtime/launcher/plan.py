"""What `tgictl launch` will run: the shard and router command lines, their environments, the socket
paths, built from a LaunchConfig and the resolved model directory. Pure (no process is started), so
the exact command lines are unit-tested.

Shards get the resolved directory, never the hub id: the model is resolved (downloaded, converted)
once by the launcher instead of N times in parallel. Children always log JSON lines so the launcher
can re-emit each record at its level, whatever format the launcher itself prints.
"""

from __future__ import annotations

import enum
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path

from tgictl.config import (
    DEFAULT_HEALTH_STEP_TIMEOUT_S,
    LaunchConfig,
    LogConfig,
    RouterConfig,
    SpeculationConfig,
    shard_service_name,
)
from tgictl.env import API_KEY_VAR
from tgictl.kv_cache_dtype import DEFAULT_KV_CACHE_DTYPE
from tgictl.log import child_environ
from tgictl.runtime.launcher.child import ChildSpec

# torch.distributed rendezvous variables: set per shard, never inherited by the router.
_RENDEZVOUS_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE")

# RouterConfig field → `tgictl router` flag. Fields set by the launcher itself come first.
ROUTER_FLAGS: dict[str, str] = {
    "master_shard_uds_path": "--master-shard-uds-path",
    "tokenizer_name": "--tokenizer-name",
    "served_model_name": "--served-model-name",
    "model_path": "--model-path",
    "hostname": "--hostname",
    "port": "--port",
    "graceful_termination_timeout_s": "--graceful-termination-timeout",
    "max_concurrent_requests": "--max-concurrent-requests",
    "max_best_of": "--max-best-of",
    "max_stop_sequences": "--max-stop-sequences",
    "max_top_n_tokens": "--max-top-n-tokens",
    "max_input_tokens": "--max-input-tokens",
    "max_total_tokens": "--max-total-tokens",
    "max_batch_prefill_tokens": "--max-batch-prefill-tokens",
    "max_batch_total_tokens": "--max-batch-total-tokens",
    "max_batch_size": "--max-batch-size",
    "prefill_group_tokens": "--prefill-group-tokens",
    "decode_steps": "--decode-steps",
    "decode_call_ms": "--decode-call-ms",
    "prefix_caching": "--prefix-caching",
    "scheduling_policy": "--scheduling-policy",
    "max_client_batch_size": "--max-client-batch-size",
    "api_key": "--api-key",
    "cors_allow_origin": "--cors-allow-origin",
    "payload_limit": "--payload-limit",
    "http_header_timeout_s": "--http-header-timeout",
    "http_body_timeout_s": "--http-body-timeout",
    "max_connections": "--max-connections",
    "validation_workers": "--validation-workers",
    "otlp_endpoint": "--otlp-endpoint",
    "otlp_service_name": "--otlp-service-name",
    "reasoning_parser": "--reasoning-parser",
    "allow_lora_loading": "--allow-lora-loading",
    "kv_events_endpoint": "--kv-events-endpoint",
    "kv_events_replay_endpoint": "--kv-events-replay-endpoint",
    "kv_events_topic": "--kv-events-topic",
    "request_log": "--request-log",
}
# RouterConfig fields passed in the router's environment, never on its command line: `ps` shows
# every process's arguments to every local user (its environment only to its owner).
ROUTER_SECRETS: dict[str, str] = {"api_key": API_KEY_VAR}
# RouterConfig fields `tgictl router` has no flag for (internal tuning kept at its default).
ROUTER_FIELDS_WITHOUT_FLAG = frozenset({"max_new_tokens_per_round"})
# prefix_caching too: the router would otherwise read PREFIX_CACHING again, which the launch's own flag overrode.
_ALWAYS_PASSED = (
    "master_shard_uds_path", "tokenizer_name", "served_model_name", "hostname", "port", "graceful_termination_timeout_s",
    "prefix_caching",
)


@dataclass(frozen=True)
class LaunchPlan:
    """Everything the Launcher needs; index = rank in `shards` and `socket_paths`."""

    shards: tuple[ChildSpec, ...]
    socket_paths: tuple[Path, ...]
    router: ChildSpec
    router_address: tuple[str, int]  # where to probe the HTTP server once the router runs
    graceful_termination_timeout_s: float
    shard_stop_timeout_s: float
    crash_stop_timeout_s: float
    progress_interval_s: float


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def served_name(model_id: str) -> str:
    """The name a model is served under by default: a hub id as it is; a local path (a GGUF file, a
    directory) by its file's stem or its directory's name, not the relative path the user typed."""
    path = Path(model_id).expanduser()
    if not path.exists():
        return model_id
    path = path.resolve()
    return path.stem if path.is_file() else path.name


def router_argv(router: RouterConfig) -> list[str]:
    """`tgictl router` flags for `router`: the launcher-owned ones always, the rest when not default,
    so the router's own defaults (the same dataclass) stay the single source. Secrets never: see
    router_secrets_env."""
    defaults = {f.name: f.default for f in fields(RouterConfig)}
    argv: list[str] = []
    for name, flag in ROUTER_FLAGS.items():
        value = getattr(router, name)
        if name in ROUTER_SECRETS or value is None or (name not in _ALWAYS_PASSED and value == defaults.get(name)):
            continue
        if isinstance(value, bool):  # a --x/--no-x switch
            argv.append(flag if value else f"--no-{flag.removeprefix('--')}")
        elif isinstance(value, tuple):
            for item in value:
                argv += [flag, str(item)]
        elif isinstance(value, enum.Enum):  # a choice: its value is what the flag takes
            argv += [flag, str(value.value)]
        else:
            argv += [flag, str(value)]
    return argv


def router_secrets_env(router: RouterConfig) -> dict[str, str]:
    """The variables that carry `router`'s secrets to the router process (the set ones only)."""
    return {var: getattr(router, name) for name, var in ROUTER_SECRETS.items() if getattr(router, name) is not None}


def shard_argv(config: LaunchConfig, model_dir: Path, uds_base: Path) -> list[str]:
    argv = ["--model-id", str(model_dir), "--uds-path", str(uds_base), "--block-size", str(config.block_size)]
    if config.dtype is not None:
        argv += ["--dtype", config.dtype]
    if config.kv_cache_memory is not None:
        argv += ["--kv-cache-memory", str(config.kv_cache_memory)]
    if config.kv_cache_dtype != DEFAULT_KV_CACHE_DTYPE:
        argv += ["--kv-cache-dtype", config.kv_cache_dtype]
    argv += speculation_argv(config.speculation)
    if config.lora_adapters:  # resolved by the launcher: every shard reads the same directories
        argv += ["--lora-adapters", ",".join(spec.flag() for spec in config.lora_adapters)]
    if config.router.otlp_endpoint is not None:  # the shards' spans join the router's traces
        argv += ["--otlp-endpoint", config.router.otlp_endpoint,
                 "--otlp-service-name", shard_service_name(config.router.otlp_service_name)]
    if config.batch_invariant:
        argv.append("--batch-invariant")
    if config.health_step_timeout_s != DEFAULT_HEALTH_STEP_TIMEOUT_S:
        argv += ["--health-step-timeout", str(config.health_step_timeout_s)]
    if config.quantize is not None:
        argv += ["--quantize", config.quantize.method]
        if config.quantize.method == "int4":
            argv += ["--quantize-group-size", str(config.quantize.group_size)]
    return argv


def speculation_argv(config: SpeculationConfig) -> list[str]:
    """The `tgictl shard` flags for `config`, always explicit so a shard never reads $SPECULATE again."""
    return [
        "--speculate", str(config.tokens),
        "--speculate-ngram-min", str(config.ngram_min),
        "--speculate-ngram-max", str(config.ngram_max),
        "--speculate-max-batch", str(config.max_batch),
    ]


def probe_host(hostname: str) -> str:
    """Where a local client reaches a server bound to `hostname` (a wildcard address is not one)."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(hostname, hostname)


def build_plan(
    config: LaunchConfig,
    model_dir: Path,
    uds_base: Path,
    log_config: LogConfig,
    base_env: Mapping[str, str],
    master_port: int,
    cpu_count: int = 1,
) -> LaunchPlan:
    """The command lines for `config`: shards on `{uds_base}-{rank}`, rendezvous on `master_port`.
    `cpu_count`: the cores this process may use, shared out among the shards."""
    # Secret variables too: the shards need none, and the router gets its config's values, not
    # whatever this process inherited.
    common = {k: v for k, v in base_env.items() if k not in _RENDEZVOUS_VARS and k not in ROUTER_SECRETS.values()}
    common.update(child_environ(replace(log_config, json_output=True)))
    common["PYTHONUNBUFFERED"] = "1"  # log lines reach the launcher as they are written
    shard_env = dict(common)
    if config.num_shard > 1 and "OMP_NUM_THREADS" not in base_env:
        # Each torch process would start one thread per core; N of them oversubscribe the CPU and
        # OpenMP's spinning threads then slow every forward (and each collective waits for the slowest).
        shard_env["OMP_NUM_THREADS"] = str(max(1, cpu_count // config.num_shard))
    tgictl = [sys.executable, "-m", "tgictl"]
    shards = tuple(
        ChildSpec(
            role="shard",
            rank=rank,
            argv=(*tgictl, "shard", *shard_argv(config, model_dir, uds_base)),
            env={
                **shard_env,
                "RANK": str(rank),
                "WORLD_SIZE": str(config.num_shard),
                "MASTER_ADDR": config.master_addr,
                "MASTER_PORT": str(master_port),
            },
        )
        for rank in range(config.num_shard)
    )
    # The router loads the tokenizer from the resolved directory but names the model as the user did
    # (a hub id, not a path in the cache; a local path by its short name, the path itself in /info).
    served = config.router.served_model_name or served_name(config.model_id)
    router = replace(
        config.router, master_shard_uds_path=f"{uds_base}-0", tokenizer_name=str(model_dir), served_model_name=served,
        model_path=config.router.model_path or (config.model_id if served != config.model_id else None),
    )
    return LaunchPlan(
        shards=shards,
        socket_paths=tuple(Path(f"{uds_base}-{rank}") for rank in range(config.num_shard)),
        router=ChildSpec(
            role="router", argv=(*tgictl, "router", *router_argv(router)), env={**common, **router_secrets_env(router)}
        ),
        router_address=(probe_host(router.hostname), router.port),
        graceful_termination_timeout_s=router.graceful_termination_timeout_s,
        shard_stop_timeout_s=config.shard_stop_timeout_s,
        crash_stop_timeout_s=config.crash_stop_timeout_s,
        progress_interval_s=config.progress_interval_s,
    )
