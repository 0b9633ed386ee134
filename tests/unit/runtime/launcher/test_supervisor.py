"""The launcher's supervision with stand-in children (launcher_fakes.py) that start in milliseconds:
readiness by socket file, relayed logs, ordered shutdown on a signal, fast teardown when a child dies,
SIGKILL for a child that ignores SIGTERM, stale and foreign sockets. Real shards and router are in
tests/integration/test_launch.py."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from launcher_fakes import FAKES, make_plan

from tgictl.errors import ChildFailedError, ConfigError
from tgictl.runtime.launcher.plan import LaunchPlan
from tgictl.runtime.launcher.supervisor import (
    Launcher,
    check_port_free,
    clear_stale_socket,
)

REPO_ROOT = Path(__file__).resolve().parents[3]


def read_events(events: Path) -> list[str]:
    """Event texts in the order they happened (the monotonic clock is shared by all processes)."""
    if not events.exists():
        return []
    rows = [line.split(" ", 1) for line in events.read_text().splitlines()]
    return [text for _, text in sorted(rows, key=lambda row: float(row[0]))]


def when(events: Path, predicate: Callable[[list[str]], bool], action: Callable[[list[str]], None]) -> threading.Thread:
    """In a thread: wait (up to 30 s) until `predicate(events)` holds, then run `action(events)`."""

    def watch() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            current = read_events(events)
            if predicate(current):
                action(current)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def router_ready(events: list[str]) -> bool:
    return any(e.startswith("router ready") for e in events)


def pid_of(events: list[str], label: str) -> int:
    return next(int(e.rsplit("pid=", 1)[1]) for e in events if e.startswith(f"{label} ready"))


def signal_self(signum: int = signal.SIGTERM) -> Callable[[list[str]], None]:
    return lambda events: os.kill(os.getpid(), signum)


def assert_all_gone(launcher: Launcher, plan: LaunchPlan) -> None:
    for child in launcher.children:
        assert child.poll() is not None, f"{child.label} still running"
        with pytest.raises(ProcessLookupError):
            os.killpg(child.pid, 0)  # nothing left in its process group either
    for path in plan.socket_paths:
        assert not path.exists(), f"{path} left behind"


def test_signal_stops_router_first_then_shards_and_relays_child_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plan, events = make_plan(tmp_path, [[], []], ["--drain-s", "0.5"])
    launcher = Launcher(plan)
    when(events, router_ready, signal_self(signal.SIGTERM))
    with caplog.at_level(logging.INFO, logger="tgictl"):
        launcher.run()  # returns: a signal-initiated shutdown is a success

    order = [e.split(" pid=")[0] for e in read_events(events)]
    assert sorted(order[:2]) == ["shard 0 ready", "shard 1 ready"] and order[2] == "router ready"
    # The router drains and exits before any shard is asked to stop.
    assert order[3:5] == ["router term", "router exit"]
    assert sorted(order[5:]) == ["shard 0 exit", "shard 0 term", "shard 1 exit", "shard 1 term"]
    assert_all_gone(launcher, plan)
    assert [c.proc.returncode for c in launcher.children] == [0, 0, 0]

    relayed = {(r.levelno, r.getMessage()) for r in caplog.records if r.name == "tgictl.launcher"}
    # JSON records keep their level; plain lines keep the stream's (stdout: info).
    assert (logging.INFO, "[shard 0] rank 0/2 rendezvous 127.0.0.1:29999") in relayed
    assert (logging.INFO, "[shard 1] plain stdout line from shard 1") in relayed
    assert (logging.WARNING, "[router] router warning for the relay") in relayed
    started = [r for r in caplog.records if r.getMessage().startswith("started shard 1: pid ")]
    assert len(started) == 1 and started[0].child_pid == launcher.shards[1].pid  # type: ignore[attr-defined]


def test_shard_exiting_before_ready_fails_naming_it_with_its_last_error(tmp_path: Path) -> None:
    plan, events = make_plan(tmp_path, [[], ["--load-s", "0.3", "--crash-before-ready", "3"]])
    launcher = Launcher(plan)
    with pytest.raises(ChildFailedError) as failure:
        launcher.run()
    assert str(failure.value) == (
        f"shard 1 (pid {launcher.shards[1].pid}) exited with code 3 before it was ready; "
        "its last error: shard 1: out of memory while loading"
    )
    assert failure.value.exit_code == 1
    assert launcher.router is None  # never started
    assert_all_gone(launcher, plan)
    # The other rank was stopped, its socket removed.
    assert "shard 0 term" in read_events(events)


def test_kill_9_of_a_shard_stops_everything_within_seconds(tmp_path: Path) -> None:
    plan, events = make_plan(tmp_path, [[], []], ["--drain-s", "30"], crash_stop_s=2.0)
    launcher = Launcher(plan)
    killed_at: list[float] = []

    def kill_shard_1(current: list[str]) -> None:
        killed_at.append(time.monotonic())
        os.kill(pid_of(current, "shard 1"), signal.SIGKILL)

    when(events, router_ready, kill_shard_1)
    with pytest.raises(ChildFailedError) as failure:
        launcher.run()
    elapsed = time.monotonic() - killed_at[0]
    assert str(failure.value) == (
        f"shard 1 (pid {launcher.shards[1].pid}) was killed by SIGKILL; its last log line: shard 1 serving on "
        f"{plan.socket_paths[1]}"
    )
    # The router would drain for 30 s; after a crash it gets crash_stop_s and then SIGKILL.
    assert elapsed < 2.0 + 3.0
    assert_all_gone(launcher, plan)


def test_router_exit_fails_and_stops_the_shards(tmp_path: Path) -> None:
    plan, events = make_plan(tmp_path, [[]], ["--exit-after-s", "0.3"])
    launcher = Launcher(plan)
    with pytest.raises(ChildFailedError) as failure:
        launcher.run()
    assert launcher.router is not None
    assert str(failure.value) == (
        f"router (pid {launcher.router.pid}) exited with code 4; its last error: router gave up"
    )
    assert "shard 0 exit" in read_events(events)
    assert_all_gone(launcher, plan)


def test_shard_ignoring_sigterm_is_killed_after_the_stop_timeout(tmp_path: Path) -> None:
    plan, events = make_plan(tmp_path, [["--ignore-term"]], shard_stop_s=0.5)
    launcher = Launcher(plan)
    when(events, router_ready, signal_self())
    start = time.monotonic()
    launcher.run()
    assert time.monotonic() - start < 10
    assert launcher.shards[0].proc.returncode == -signal.SIGKILL
    assert "shard 0 term" in read_events(events)
    assert_all_gone(launcher, plan)  # its socket file too, although the shard never removed it


def test_signal_while_shards_load_stops_them_without_starting_the_router(tmp_path: Path) -> None:
    plan, events = make_plan(tmp_path, [["--load-s", "60"]])
    launcher = Launcher(plan)
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    start = time.monotonic()
    launcher.run()
    assert time.monotonic() - start < 5
    assert launcher.router is None
    assert_all_gone(launcher, plan)


def test_second_signal_cuts_the_drain_short(tmp_path: Path) -> None:
    plan, events = make_plan(tmp_path, [[]], ["--drain-s", "60"], graceful_s=60)
    launcher = Launcher(plan)
    when(events, router_ready, signal_self())
    when(events, lambda e: "router term" in e, signal_self())
    start = time.monotonic()
    launcher.run()
    assert time.monotonic() - start < 10
    assert launcher.router is not None and launcher.router.proc.returncode == -signal.SIGKILL
    assert_all_gone(launcher, plan)


def test_progress_is_logged_while_shards_load(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    plan, events = make_plan(tmp_path, [[], ["--load-s", "0.8"]], progress_s=0.3)
    launcher = Launcher(plan)
    when(events, router_ready, signal_self())
    with caplog.at_level(logging.INFO, logger="tgictl"):
        launcher.run()
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for shards")]
    # Shard 1 loads 0.8 s, shard 0 at once; on a busy machine shard 0's start-up can outlast the first
    # 0.3 s report, so only the reports once it is up are pinned down.
    assert progress and all("shard 1)" in m for m in progress)
    assert progress[-1].startswith("waiting for shards to load: 1/2 ready after ")
    assert progress[-1].endswith("(pending: shard 1)")


def test_children_get_sigterm_when_the_launcher_is_killed(tmp_path: Path) -> None:
    """SIGKILL of the launcher leaves it no chance to clean up; the kernel tells the children."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    driver = subprocess.Popen([sys.executable, str(FAKES), "launcher", str(tmp_path)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    events = tmp_path / "events"
    pids: dict[str, int] = {}
    try:
        deadline = time.monotonic() + 30
        while not router_ready(read_events(events)):
            assert driver.poll() is None and time.monotonic() < deadline, "the launcher did not start its children"
            time.sleep(0.05)
        pids = {label: pid_of(read_events(events), label) for label in ("shard 0", "shard 1", "router")}
        driver.kill()
        driver.wait()
        deadline = time.monotonic() + 10
        while any(pid_alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert {label: pid_alive(pid) for label, pid in pids.items()} == dict.fromkeys(pids, False)
        assert {"shard 0 term", "shard 1 term", "router term"} <= set(read_events(events))
    finally:
        driver.kill()
        driver.wait()
        for pid in pids.values():  # only if the test failed: do not leave orphans behind
            if pid_alive(pid):
                os.killpg(pid, signal.SIGKILL)


def pid_alive(pid: int) -> bool:
    """Exists and is not a zombie: an orphan's zombie is reaped by init, not by us."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def test_stale_socket_is_removed_and_a_live_one_refused(tmp_path: Path) -> None:
    stale = tmp_path / "stale-0"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(stale))  # bound, never listening, closed: what a killed shard leaves
    clear_stale_socket(stale)
    assert not stale.exists()

    live = tmp_path / "live-0"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(live))
        s.listen()
        with pytest.raises(ConfigError, match="another server is already listening on"):
            clear_stale_socket(live)
    assert live.exists()

    regular = tmp_path / "file-0"
    regular.write_text("")
    with pytest.raises(ConfigError, match="exists and is not a socket"):
        clear_stale_socket(regular)


def test_a_port_in_use_is_refused_before_anything_starts() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}: Address already in use; "):
            check_port_free("127.0.0.1", port)
    check_port_free("127.0.0.1", port)  # free again once closed
