"""Stand-ins for `tgictl shard` and `tgictl router` that start in milliseconds, for the launcher's
supervision tests. They behave like the real ones where the launcher looks (a shard's socket file
appears once "loaded"; SIGTERM makes them clean up and exit 0; log lines are tgictl JSON records)
and can misbehave on request. Each appends what it does to an events file, so tests can check order.

    python launcher_fakes.py shard BASE EVENTS [--load-s S] [--crash-before-ready CODE] [--ignore-term]
    python launcher_fakes.py router PORT EVENTS [--drain-s S] [--exit-after-s S]
    python launcher_fakes.py launcher DIR      # the real Launcher on two fake shards and a fake router
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the fakes themselves run without tgictl on their path
    from tgictl.runtime.launcher.plan import LaunchPlan

FAKES = Path(__file__).resolve()


def _log(message: str, level: str = "info") -> None:
    print(json.dumps({"level": level, "message": message, "logger": "fake"}), flush=True)


def _event(events: Path, text: str) -> None:
    with events.open("a") as f:
        f.write(f"{time.monotonic():.6f} {text}\n")


def shard(args: argparse.Namespace) -> int:
    rank = int(os.environ["RANK"])
    name = f"shard {rank}"
    _log(f"rank {rank}/{os.environ['WORLD_SIZE']} rendezvous {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}")
    print(f"plain stdout line from {name}", flush=True)
    time.sleep(args.load_s)
    if args.crash_before_ready is not None:
        _log("some progress", "info")
        _log(f"{name}: out of memory while loading", "error")
        print("Traceback (most recent call last):\nFakeError: boom", file=sys.stderr, flush=True)
        return int(args.crash_before_ready)
    path = f"{args.base}-{rank}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()

    def on_term(signum: int, frame: FrameType | None) -> None:
        _event(args.events, f"{name} term")
        if args.ignore_term:
            return
        os.unlink(path)
        _log(f"{name} stopped")
        _event(args.events, f"{name} exit")
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    _log(f"{name} serving on {path}")
    _event(args.events, f"{name} ready pid={os.getpid()}")
    while True:
        time.sleep(0.05)


def router(args: argparse.Namespace) -> int:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", args.port))
    server.listen()
    _log("router warning for the relay", "warning")

    def on_term(signum: int, frame: FrameType | None) -> None:
        _event(args.events, "router term")
        time.sleep(args.drain_s)
        _event(args.events, "router exit")
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    _event(args.events, f"router ready pid={os.getpid()}")
    start = time.monotonic()
    while args.exit_after_s is None or time.monotonic() - start < args.exit_after_s:
        time.sleep(0.05)
    _log("router gave up", "error")
    return 4


def make_plan(
    tmp_path: Path,
    shard_flags: list[list[str]],
    router_flags: Sequence[str] = (),
    *,
    graceful_s: float = 10.0,
    shard_stop_s: float = 5.0,
    crash_stop_s: float = 2.0,
    progress_s: float = 5.0,
) -> tuple[LaunchPlan, Path]:
    """A plan running these fakes: one shard per entry of `shard_flags`; returns it and the events file."""
    from tgictl.runtime.launcher.child import ChildSpec
    from tgictl.runtime.launcher.plan import LaunchPlan, free_port

    events = tmp_path / "events"
    base = tmp_path / "s"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    shards = tuple(
        ChildSpec(
            role="shard",
            rank=rank,
            argv=(sys.executable, str(FAKES), "shard", str(base), str(events), *flags),
            env={**env, "RANK": str(rank), "WORLD_SIZE": str(len(shard_flags)), "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "29999"},
        )
        for rank, flags in enumerate(shard_flags)
    )
    router = ChildSpec(role="router", argv=(sys.executable, str(FAKES), "router", str(port), str(events),
                                            *router_flags), env=env)
    plan = LaunchPlan(
        shards=shards,
        socket_paths=tuple(Path(f"{base}-{rank}") for rank in range(len(shard_flags))),
        router=router,
        router_address=("127.0.0.1", port),
        graceful_termination_timeout_s=graceful_s,
        shard_stop_timeout_s=shard_stop_s,
        crash_stop_timeout_s=crash_stop_s,
        progress_interval_s=progress_s,
    )
    return plan, events


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="role", required=True)
    s = sub.add_parser("shard")
    s.add_argument("base")
    s.add_argument("events", type=Path)
    s.add_argument("--load-s", type=float, default=0.0)
    s.add_argument("--crash-before-ready", type=int, default=None)
    s.add_argument("--ignore-term", action="store_true")
    r = sub.add_parser("router")
    r.add_argument("port", type=int)
    r.add_argument("events", type=Path)
    r.add_argument("--drain-s", type=float, default=0.0)
    r.add_argument("--exit-after-s", type=float, default=None)
    d = sub.add_parser("launcher", help="run the real Launcher on fakes (needs tgictl on PYTHONPATH)")
    d.add_argument("dir", type=Path)
    args = parser.parse_args()
    if args.role == "launcher":
        from tgictl.runtime.launcher.supervisor import Launcher

        Launcher(make_plan(args.dir, [[], []])[0]).run()
        return 0
    return shard(args) if args.role == "shard" else router(args)


if __name__ == "__main__":
    raise SystemExit(main())
