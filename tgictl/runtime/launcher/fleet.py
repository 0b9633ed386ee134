"""`tgictl launch --replicas N`: N replicas behind the SGLang Model Gateway, supervised
(docs/replicas.md; docs/architecture.md, "Replicas and gateways").

    every replica: shards ─▶ their sockets ─▶ router ─▶ its private port answers
      ─▶ gateway (SMG) on the public port ─▶ supervise until a signal (exit 0)

The replica is the unit of supervision. A replica whose child dies (a shard: a sharded forward cannot
go on without it; the router: nothing left to serve its shards) is stopped whole and started again
after a delay that doubles while it keeps dying (reset once it serves); meanwhile the gateway routes
around it (its port refuses connections, SMG leaves it out and retries elsewhere) and takes it back when
its health and load probes answer again. The gateway is restarted the same way. Only a replica that
dies before it ever served ends the launch (exit 1): that is a configuration or model problem, which
restarting would only repeat.

Shutdown on SIGTERM/SIGINT/SIGHUP: the gateway first (it finishes its in-flight requests within the
graceful timeout), then every router (nothing left to drain), then every shard; exit 0.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from collections.abc import Mapping
from pathlib import Path

from tgictl.config import LaunchConfig, LogConfig
from tgictl.errors import ChildFailedError
from tgictl.runtime.launcher.child import ChildProcess, describe_exit
from tgictl.runtime.launcher.fleet_plan import FleetPlan, ReplicaPlan, build_fleet_plan, describe
from tgictl.runtime.launcher.plan import free_port
from tgictl.runtime.launcher.replica_cpus import numa_nodes, plan_replica_cpus, usable_cpus
from tgictl.runtime.launcher.supervisor import (
    POLL_S,
    SignalState,
    catch_signals,
    clear_stale_socket,
    port_open,
    stop_children,
)

log = logging.getLogger("tgictl.launcher")


def _report_exit(child: ChildProcess, code: int, what: str) -> str:
    child.join_relay(0.5)
    log.error("%s (pid %d) %s%s; its last log lines:", child.label, child.pid, describe_exit(code), what)
    for line in child.tail()[-10:]:
        log.error("[%s] %s", child.label, line.message)
    return f"{child.label} (pid {child.pid}) {describe_exit(code)}{what}; {child.last_words()}"


class Replica:
    """One replica's processes and where they are in their life: down, loading (shards), starting
    (router), serving. Every method returns at once; the fleet's loop calls `advance` repeatedly."""

    def __init__(self, plan: ReplicaPlan) -> None:
        self.plan = plan
        self.shards: list[ChildProcess] = []
        self.router: ChildProcess | None = None
        self.serving = False
        self.failures = 0  # deaths since it last served
        self.restart_at: float | None = None  # when it is down: when it starts again

    @property
    def label(self) -> str:
        return f"replica {self.plan.index}"

    @property
    def children(self) -> list[ChildProcess]:
        return [*self.shards, *([self.router] if self.router is not None else [])]

    @property
    def up(self) -> bool:
        return bool(self.shards)

    def start(self) -> None:
        for path in self.plan.launch.socket_paths:
            clear_stale_socket(path)
        self.shards = [ChildProcess.start(spec) for spec in self.plan.launch.shards]
        self.restart_at = None

    def advance(self) -> None:
        """Start the router once every shard listens; note when the router's port answers."""
        launch = self.plan.launch
        if self.router is None and all(path.exists() for path in launch.socket_paths):
            self.router = ChildProcess.start(launch.router)
        if self.router is not None and not self.serving and port_open(*launch.router_address):
            self.serving = True
            self.failures = 0
            log.info("%s serving on %s", self.label, self.plan.url)

    def exited(self) -> tuple[ChildProcess, int] | None:
        for child in self.children:
            code = child.poll()
            if code is not None:
                return child, code
        return None

    def stop(self, timeout_s: float, signals: SignalState) -> None:
        stop_children(self.children, timeout_s, signals)
        self.remove_sockets()
        self.shards, self.router, self.serving = [], None, False

    def remove_sockets(self) -> None:
        for rank, path in enumerate(self.plan.launch.socket_paths):
            path.unlink(missing_ok=True)
            if rank < len(self.shards):
                path.with_name(f"{path.name}.{self.shards[rank].pid}.tmp").unlink(missing_ok=True)


class FleetLauncher:
    """Runs a FleetPlan to its end: returns after a signal, raises ChildFailedError when a replica dies
    before it ever served. Every child is gone when it returns."""

    def __init__(self, plan: FleetPlan) -> None:
        self.plan = plan
        self.replicas = [Replica(r) for r in plan.replicas]
        self.gateway: ChildProcess | None = None
        self._gateway_failures = 0
        self._gateway_restart_at: float | None = None
        self._signals = SignalState()

    def run(self) -> None:
        with catch_signals() as self._signals:
            crashed = True
            try:
                for replica in self.replicas:
                    replica.start()
                if self._wait_until_all_serve():
                    self.gateway = ChildProcess.start(self.plan.gateway)
                    self._supervise()
                crashed = False
            finally:
                self._stop(in_order=not crashed)

    # ---- start-up -----------------------------------------------------------------------------

    def _wait_until_all_serve(self) -> bool:
        start = time.monotonic()
        next_progress = start + 5.0
        while not all(r.serving for r in self.replicas):
            if self._signals.count:
                log.info("signal received while the replicas were starting; stopping")
                return False
            for replica in self.replicas:
                replica.advance()
                dead = replica.exited()
                if dead is not None:
                    raise ChildFailedError(_report_exit(*dead, " before its replica served"))
            now = time.monotonic()
            if now >= next_progress:
                waiting = [r.label for r in self.replicas if not r.serving]
                log.info("waiting for %s after %.0f s", ", ".join(waiting), now - start)
                next_progress = now + 5.0
            time.sleep(POLL_S)
        log.info("%d replicas serving after %.1f s; starting the gateway", len(self.replicas), time.monotonic() - start)
        return True

    # ---- supervision --------------------------------------------------------------------------

    def _delay(self, failures: int) -> float:
        return min(self.plan.restart_delay_s * 2 ** max(failures - 1, 0), self.plan.max_restart_delay_s)

    def _supervise(self) -> None:
        announced = False
        while not self._signals.count:
            now = time.monotonic()
            for replica in self.replicas:
                self._watch(replica, now)
            self._watch_gateway(now)
            if not announced and self.gateway is not None and port_open(*self.plan.gateway_address):
                host, port = self.plan.gateway_address
                log.info("ready: http://%s:%d (gateway in front of %d replicas)",
                         host if ":" not in host else f"[{host}]", port, len(self.replicas))
                announced = True
            time.sleep(POLL_S)
        log.info("signal received: draining the gateway (up to %.0f s), then stopping the replicas",
                 self.plan.gateway_stop_timeout_s - 5.0)

    def _watch(self, replica: Replica, now: float) -> None:
        if not replica.up:
            if replica.restart_at is not None and now >= replica.restart_at:
                log.info("restarting %s (restart %d in a row)", replica.label, replica.failures)
                replica.start()
            return
        dead = replica.exited()
        if dead is None:
            replica.advance()
            return
        _report_exit(*dead, "; the gateway routes around its replica meanwhile")
        replica.stop(self.plan.replicas[0].launch.crash_stop_timeout_s, self._signals)
        replica.failures += 1
        delay = self._delay(replica.failures)
        replica.restart_at = time.monotonic() + delay
        log.warning("%s stopped; it starts again in %.1f s", replica.label, delay)

    def _watch_gateway(self, now: float) -> None:
        if self.gateway is None:
            if self._gateway_restart_at is not None and now >= self._gateway_restart_at:
                self.gateway = ChildProcess.start(self.plan.gateway)
                self._gateway_restart_at = None
            return
        code = self.gateway.poll()
        if code is None:
            return
        _report_exit(self.gateway, code, "")
        stop_children([self.gateway], 0.0, self._signals)
        self.gateway = None
        self._gateway_failures += 1
        delay = self._delay(self._gateway_failures)
        self._gateway_restart_at = time.monotonic() + delay
        log.warning("the gateway starts again in %.1f s", delay)

    # ---- shutdown -----------------------------------------------------------------------------

    def _stop(self, in_order: bool) -> None:
        launch = self.plan.replicas[0].launch
        gateway: Sequence[ChildProcess] = [self.gateway] if self.gateway is not None else []
        if not in_order:
            stop_children([*gateway, *(c for r in self.replicas for c in r.children)], launch.crash_stop_timeout_s,
                          self._signals)
        else:
            stop_children(gateway, self.plan.gateway_stop_timeout_s, self._signals)
            routers = [r.router for r in self.replicas if r.router is not None]
            stop_children(routers, launch.graceful_termination_timeout_s + 5.0, self._signals)
            stop_children([s for r in self.replicas for s in r.shards], launch.shard_stop_timeout_s, self._signals)
        for replica in self.replicas:
            replica.remove_sockets()


def launch_fleet(
    config: LaunchConfig, model_dir: Path, uds_base: Path, log_config: LogConfig, child_env: Mapping[str, str]
) -> None:
    """Plan the replicas (cores, private ports, rendezvous ports) and run them behind the gateway."""
    cpus = plan_replica_cpus(config.replicas, usable_cpus(), numa_nodes(), config.replica_cpus)
    count = config.replicas
    master_ports = ([config.master_port + i for i in range(count)] if config.master_port is not None
                    else [free_port() for _ in range(count)])
    plan = build_fleet_plan(config, model_dir, uds_base, log_config, child_env, cpus,
                            [free_port() for _ in range(count)], master_ports, free_port())
    log.info("starting %d replicas of %d shard(s): %s", count, config.num_shard, describe(plan))
    FleetLauncher(plan).run()
