"""What `tgictl launch --replicas N` will run: N replica plans (each a LaunchPlan: shards + router, on a
private port and private sockets, pinned to its cores) and the gateway's command line (SMG on the public
port, in front of the replicas). Pure, like plan.py: ports, core sets and rendezvous ports come in as
arguments, so the command lines are unit-tested (docs/replicas.md; docs/architecture.md, "Replicas and
gateways").
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from tgictl.config import LaunchConfig, LogConfig
from tgictl.env import API_KEY_VAR
from tgictl.errors import ConfigError
from tgictl.log import child_environ
from tgictl.runtime.launcher.child import ChildSpec
from tgictl.runtime.launcher.plan import LaunchPlan, build_plan, probe_host, router_secrets_env
from tgictl.runtime.launcher.replica_cpus import format_cpu_list

# Replicas listen on loopback only: the gateway is the one public door.
REPLICA_HOST = "127.0.0.1"
# How often SMG probes /health and reads each replica's load (/metrics): a restarted replica is seen
# serving again within this long; a dead one is left out at its first refused connection.
GATEWAY_HEALTH_INTERVAL_S = 5
GATEWAY_LOAD_INTERVAL_S = 2


@dataclass(frozen=True)
class ReplicaPlan:
    index: int
    launch: LaunchPlan  # its shards and router, labelled "replica i ..." and pinned to `cpus`
    cpus: tuple[int, ...]

    @property
    def url(self) -> str:
        host, port = self.launch.router_address
        return f"http://{host}:{port}"


@dataclass(frozen=True)
class FleetPlan:
    replicas: tuple[ReplicaPlan, ...]
    gateway: ChildSpec
    gateway_address: tuple[str, int]  # where to probe the public port
    gateway_stop_timeout_s: float  # its in-flight requests may finish within the graceful timeout
    restart_delay_s: float
    max_restart_delay_s: float = 30.0


def require_gateway(replicas: int) -> None:
    """One readable line, before anything loads, when SMG is not installed."""
    if importlib.util.find_spec("smg") is None:
        raise ConfigError(f"--replicas {replicas} runs the SGLang Model Gateway in front of the replicas, and it is "
                          "not installed: pip install 'tgictl[gateway]'")


def replica_socket_base(uds_base: Path, index: int) -> Path:
    """Replica i's shards listen on `{base}-r{i}-{rank}` (next to where one replica's would be)."""
    return uds_base.with_name(f"{uds_base.name}-r{index}")


def offset_endpoint(endpoint: str | None, index: int) -> str | None:
    """Replica i's ZMQ endpoint for KV events: TCP port + i (vLLM's rule for data-parallel ranks), else
    a path suffix, so replicas on one host never bind the same address."""
    if endpoint is None or index == 0:
        return endpoint
    head, sep, port = endpoint.rpartition(":")
    if endpoint.startswith("tcp://") and sep and port.isdigit():
        return f"{head}:{int(port) + index}"
    return f"{endpoint}-r{index}"


def _smg_log_level(level: str) -> str:
    # SMG logs every registration step at info; the launcher says what matters itself.
    return {"debug": "debug", "error": "error", "critical": "error"}.get(level, "warn")


def gateway_argv(config: LaunchConfig, worker_urls: Sequence[str], metrics_port: int, log_level: str) -> list[str]:
    """`smg launch` flags for a gateway in front of `worker_urls` on the launch's public address."""
    router = config.router
    served = router.served_model_name or config.model_id
    argv = [
        "--host", router.hostname, "--port", str(router.port), "--worker-urls", *worker_urls,
        "--policy", config.gateway_policy,
        # Requests may name the model `tgi`, as a single replica accepts (config.BASE_MODEL_ALIASES).
        "--model-alias", f"tgi={served}",
        "--prometheus-host", REPLICA_HOST, "--prometheus-port", str(metrics_port),
        "--health-check-interval-secs", str(GATEWAY_HEALTH_INTERVAL_S),
        "--load-monitor-interval", str(GATEWAY_LOAD_INTERVAL_S),
        "--worker-startup-check-interval", "1",
        "--shutdown-grace-period-secs", str(max(1, round(router.graceful_termination_timeout_s))),
        "--max-payload-size", str(router.payload_limit),
        # HTTP workers are routed on request text: no tokenizer needed in the gateway.
        "--disable-tokenizer-autoload",
        "--log-json", "--log-level", _smg_log_level(log_level),
    ]  # fmt: skip
    argv += ["--cors-allowed-origins", *(router.cors_allow_origin or ("*",))]
    return argv


def build_fleet_plan(
    config: LaunchConfig,
    model_dir: Path,
    uds_base: Path,
    log_config: LogConfig,
    base_env: Mapping[str, str],
    cpu_sets: Sequence[tuple[int, ...]],
    router_ports: Sequence[int],
    master_ports: Sequence[int],
    metrics_port: int,
) -> FleetPlan:
    if not len(cpu_sets) == len(router_ports) == len(master_ports) == config.replicas:
        raise ValueError("one core set, router port and rendezvous port per replica")
    replicas = []
    for index, (cpus, port, master_port) in enumerate(zip(cpu_sets, router_ports, master_ports)):
        env = dict(base_env)
        # Each shard's OpenMP pool sized to its share of the replica's cores (not the host's).
        env.setdefault("OMP_NUM_THREADS", str(max(1, len(cpus) // config.num_shard)))
        router = replace(config.router, hostname=REPLICA_HOST, port=port,
                         kv_events_endpoint=offset_endpoint(config.router.kv_events_endpoint, index),
                         kv_events_replay_endpoint=offset_endpoint(config.router.kv_events_replay_endpoint, index))
        single = replace(config, replicas=1, replica_cpus=(), router=router)
        launch = build_plan(single, model_dir, replica_socket_base(uds_base, index), log_config, env, master_port,
                            len(cpus))
        pin = {"replica": index, "cpus": tuple(cpus)}
        launch = replace(launch, shards=tuple(replace(s, **pin) for s in launch.shards),
                         router=replace(launch.router, **pin))
        replicas.append(ReplicaPlan(index, launch, tuple(cpus)))
    gateway_env = dict(base_env)
    gateway_env.pop(API_KEY_VAR, None)  # the key the config resolved is set below, not the inherited one
    gateway_env.update(child_environ(replace(log_config, json_output=True)))
    gateway_env.update(router_secrets_env(config.router))
    gateway = ChildSpec(
        role="gateway",
        argv=(sys.executable, "-m", "tgictl.runtime.launcher.gateway_process",
              *gateway_argv(config, [r.url for r in replicas], metrics_port, log_config.level)),
        env=gateway_env,
    )
    return FleetPlan(
        replicas=tuple(replicas),
        gateway=gateway,
        gateway_address=(probe_host(config.router.hostname), config.router.port),
        gateway_stop_timeout_s=config.router.graceful_termination_timeout_s + 5.0,
        restart_delay_s=config.replica_restart_delay_s,
    )


def describe(plan: FleetPlan) -> str:
    """One line per replica for the launcher's log: where it listens and which cores it has."""
    return "; ".join(f"replica {r.index}: {r.url} on cores {format_cpu_list(r.cpus)}" for r in plan.replicas)
