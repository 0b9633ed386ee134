"""`tgictl launch`: resolve the model once, start N shards and the router, supervise, stop in order
(TGI's launcher/src/main.rs).

    resolve model ─▶ private socket dir ─▶ shard 0..N-1 (own process groups, RANK/WORLD_SIZE/MASTER_*)
      ─▶ every `{uds}-{rank}` file exists (a shard creates it only once loaded and listening)
      ─▶ router ─▶ supervise until a signal (exit 0) or a child's death (exit 1, naming it)

Shutdown on SIGTERM/SIGINT/SIGHUP: the router first (it drains in-flight requests for up to
--graceful-termination-timeout), then the shards (SIGKILL after shard_stop_timeout_s), then every
socket file the shards left. A second signal is passed on: the router ends its requests at once, each
stream with an error event, and every child is killed HURRY_S later. When a child dies instead,
nothing can be drained (a sharded forward cannot run without a rank), so everything left gets
SIGTERM at once and SIGKILL after crash_stop_timeout_s.
"""

from __future__ import annotations

import logging
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType

from tgictl.config import HubConfig, LaunchConfig, LogConfig
from tgictl.env import Env
from tgictl.errors import ChildFailedError, ConfigError
from tgictl.runtime.host import usable_cores
from tgictl.runtime.launcher.child import ChildProcess, describe_exit
from tgictl.runtime.launcher.fleet_plan import require_gateway
from tgictl.runtime.launcher.plan import LaunchPlan, build_plan, free_port
from tgictl.runtime.model_files.resolve import load_model_config, resolve_model
from tgictl.runtime.model_files.resolve_adapter import resolve_adapters
from tgictl.runtime.profile.model_shape import kv_heads_per_shard, model_shape
from tgictl.runtime.shard.uds import check_socket_path, prepare_socket_dir

log = logging.getLogger("tgictl.launcher")

POLL_S = 0.1  # TGI's supervision period
# After a second signal: how long a child still gets (the router ends its streams with an error event).
HURRY_S = 3.0
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass
class SignalState:
    count: int = 0
    last: int | None = None


@contextmanager
def catch_signals() -> Iterator[SignalState]:
    """Turn termination signals into a counter the supervision loop reads (main thread only)."""
    state = SignalState()

    def handler(signum: int, frame: FrameType | None) -> None:
        state.count += 1
        state.last = signum

    previous = {signum: signal.signal(signum, handler) for signum in _SIGNALS}
    try:
        yield state
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def clear_stale_socket(path: Path) -> None:
    """Readiness is the socket file's existence, so a stale file must go before its shard starts; the
    shard's own rules decide what is stale (a socket something listens on is refused instead)."""
    check_socket_path(path)
    if path.is_socket():
        path.unlink(missing_ok=True)
        log.info("removed the stale socket %s", path)


def check_port_free(hostname: str, port: int) -> None:
    """Refuse a port something already listens on now, before minutes of model loading, rather than
    when the router finally fails to bind it."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(hostname or None, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as err:
        raise ConfigError(f"--hostname {hostname!r} does not resolve: {err}") from None
    with socket.socket(family, kind, proto) as probe:
        # As uvicorn binds: SO_REUSEADDR lets a port in TIME_WAIT through, not one in use.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as err:
            raise ConfigError(f"cannot listen on {hostname}:{port}: {err.strerror or err}; "
                              "choose another --port or stop what uses it") from None


class Launcher:
    """Runs one LaunchPlan to its end. `run()` returns after a signal-initiated shutdown and raises
    ChildFailedError when a child exits on its own; either way every child is gone when it returns."""

    def __init__(self, plan: LaunchPlan) -> None:
        self.plan = plan
        self.shards: list[ChildProcess] = []
        self.router: ChildProcess | None = None
        self._signals = SignalState()

    @property
    def children(self) -> list[ChildProcess]:
        return [*self.shards, *([self.router] if self.router is not None else [])]

    def run(self) -> None:
        with catch_signals() as self._signals:
            crashed = True
            try:
                for path in self.plan.socket_paths:
                    clear_stale_socket(path)
                if self._start_shards() and self._start_router():
                    self._supervise()
                crashed = False
            finally:
                if crashed:
                    self._stop_all_now()
                else:
                    self._stop_in_order()
                self._remove_sockets()

    # ---- start-up -----------------------------------------------------------------------------

    def _start_shards(self) -> bool:
        """Start every rank and wait for every socket; False when a signal came first."""
        start = time.monotonic()
        for spec in self.plan.shards:
            self.shards.append(ChildProcess.start(spec))
        pending = set(range(len(self.shards)))
        next_progress = start + self.plan.progress_interval_s
        while pending:
            if self._signals.count:
                log.info("signal received while the shards were loading; stopping")
                return False
            for rank in sorted(pending):
                if self.plan.socket_paths[rank].exists():
                    pending.discard(rank)
                    log.info("shard %d ready after %.1f s", rank, time.monotonic() - start)
            self._raise_if_any_exited(before_ready=pending)
            now = time.monotonic()
            if pending and now >= next_progress:
                log.info(
                    "waiting for shards to load: %d/%d ready after %.0f s (pending: %s)",
                    len(self.shards) - len(pending), len(self.shards), now - start,
                    ", ".join(f"shard {rank}" for rank in sorted(pending)),
                )
                next_progress = now + self.plan.progress_interval_s
            if pending:
                time.sleep(POLL_S)
        return True

    def _start_router(self) -> bool:
        if self._signals.count:
            return False
        self.router = ChildProcess.start(self.plan.router)
        return True

    # ---- supervision --------------------------------------------------------------------------

    def _supervise(self) -> None:
        """Until a signal: fail as soon as any child exits; say once when the HTTP port answers."""
        host, port = self.plan.router_address
        announced = False
        while not self._signals.count:
            self._raise_if_any_exited()
            if not announced and port_open(host, port):
                log.info("ready: http://%s:%d", host if ":" not in host else f"[{host}]", port)
                announced = True
            time.sleep(POLL_S)
        name = signal.Signals(self._signals.last).name if self._signals.last else "signal"
        if announced:
            log.info("%s received: draining the router (up to %.0f s; another signal ends the requests at "
                     "once, with an error event), then stopping the shards",
                     name, self.plan.graceful_termination_timeout_s)
        else:
            log.info("%s received before the server was ready (the router was still starting): stopping", name)

    def _raise_if_any_exited(self, before_ready: set[int] | None = None) -> None:
        for child in self.children:
            code = child.poll()
            if code is None:
                continue
            child.join_relay(0.5)  # its last lines are usually the explanation
            when = " before it was ready" if before_ready and child.spec.rank in before_ready else ""
            log.error("%s (pid %d) %s%s; its last log lines:", child.label, child.pid, describe_exit(code), when)
            for line in child.tail()[-10:]:
                log.error("[%s] %s", child.label, line.message)
            raise ChildFailedError(
                f"{child.label} (pid {child.pid}) {describe_exit(code)}{when}; {child.last_words()}"
            )

    # ---- shutdown -----------------------------------------------------------------------------

    def _stop_in_order(self) -> None:
        if self.router is not None:
            # The router ends still-running streams itself at the timeout; a little extra for that.
            self._stop([self.router], self.plan.graceful_termination_timeout_s + 5.0)
        self._stop(self.shards, self.plan.shard_stop_timeout_s)

    def _stop_all_now(self) -> None:
        self._stop(self.children, self.plan.crash_stop_timeout_s)

    def _stop(self, children: Sequence[ChildProcess], timeout_s: float) -> None:
        stop_children(children, timeout_s, self._signals)

    def _remove_sockets(self) -> None:
        """A shard killed mid-shutdown leaves its socket (and maybe its temporary bind name) behind."""
        for rank, path in enumerate(self.plan.socket_paths):
            path.unlink(missing_ok=True)
            if rank < len(self.shards):
                path.with_name(f"{path.name}.{self.shards[rank].pid}.tmp").unlink(missing_ok=True)


def stop_children(children: Sequence[ChildProcess], timeout_s: float, signals: SignalState) -> None:
    """SIGTERM, wait up to `timeout_s`, then SIGKILL; reap all. Another signal while waiting is
    passed on (a second SIGTERM: the router then ends its requests with an error event at once)
    and leaves them HURRY_S before the kill."""
    signals_before = signals.count
    running = [child for child in children if child.poll() is None]
    for child in running:
        child.signal_group(signal.SIGTERM)
    start = time.monotonic()
    deadline = start + timeout_s
    hurried = False
    while any(child.poll() is None for child in running):
        now = time.monotonic()
        if now >= deadline:
            break
        if signals.count > signals_before and not hurried:
            hurried = True
            deadline = min(deadline, now + HURRY_S)
            for child in running:
                if child.poll() is None:
                    log.info("another signal: %s (pid %d) gets %.0f s to end what it runs, then is killed",
                             child.label, child.pid, HURRY_S)
                    child.signal_group(signal.SIGTERM)
        time.sleep(POLL_S / 2)
    for child in children:
        # Also the already-exited ones: their group may still hold a process they started.
        child.signal_group(signal.SIGKILL)
        code = child.wait(30.0)
        child.join_relay()
        if child in running:
            if code is not None and code < 0 and -code == signal.SIGKILL:
                why = "after another signal" if hurried else f"within its {timeout_s:.0f} s"
                log.warning("%s (pid %d) did not stop %s: killed after %.1f s", child.label, child.pid,
                            why, time.monotonic() - start)
            else:
                outcome = describe_exit(code) if code is not None else "did not exit"
                log.info("%s (pid %d) stopped: %s", child.label, child.pid, outcome)


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def launch(config: LaunchConfig, log_config: LogConfig, env: Env, child_env: Mapping[str, str]) -> None:
    """Resolve the model, then run shards and router until a signal (returns) or a failure (raises).

    `child_env` is the environment the children start from (the launcher's own, normally).
    """
    check_port_free(config.router.hostname, config.router.port)
    if config.replicas > 1:
        require_gateway(config.replicas)
    hub = HubConfig.from_env(env)
    model_dir = resolve_model(config.model_id, config.revision, hub=hub)
    log.info("model %s: %s", config.model_id, model_dir)
    if config.lora_adapters:  # once, here: the shards then all read the same local directories
        config = replace(config, lora_adapters=resolve_adapters(config.lora_adapters, hub))
    # Fail in milliseconds, not after N processes loaded torch, when the heads cannot be split.
    kv_heads_per_shard(model_shape(load_model_config(model_dir)), config.num_shard)
    private_dir: Path | None = None
    if config.shard_uds_path is None:
        # mkdtemp creates it 0700 with a fresh name: private, and never shared with another launch.
        private_dir = Path(tempfile.mkdtemp(prefix="tgictl-", dir="/tmp"))
        uds_base = private_dir / "shard"
    else:
        uds_base = config.shard_uds_path
        prepare_socket_dir(uds_base.parent)
    try:
        if config.replicas > 1:
            from tgictl.runtime.launcher.fleet import launch_fleet

            launch_fleet(config, model_dir, uds_base, log_config, child_env)
            return
        master_port = config.master_port if config.master_port is not None else free_port()
        plan = build_plan(config, model_dir, uds_base, log_config, child_env, master_port, usable_cores())
        log.info("starting %d shard(s) on %s-{rank}, rendezvous %s:%d",
                 config.num_shard, uds_base, config.master_addr, master_port)
        Launcher(plan).run()
    finally:
        if private_dir is not None:
            shutil.rmtree(private_dir, ignore_errors=True)
    log.info("all processes stopped")
