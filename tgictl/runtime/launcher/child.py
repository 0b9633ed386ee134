"""One supervised child of `tgictl launch`: spawned in its own process group, its output relayed.

Each child runs in a new session (its own process group), so a Ctrl-C in the terminal reaches only
the launcher, which then stops the children in its own order; signals go to the whole group, so
nothing a child started outlives it. On Linux the child also gets SIGTERM if the launcher dies
without cleaning up (SIGKILL, OOM killer), so a killed launcher leaves no orphan serving.

Children log JSON lines (the launcher sets that in their environment); a reader thread per stream
parses each line, re-logs it under the launcher's logger with the child's level and a `[shard 0]`
/ `[router]` prefix, and keeps the last lines in a ring buffer for the failure message.
"""

from __future__ import annotations

import collections
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO

log = logging.getLogger("tgictl.launcher")
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@dataclass(frozen=True)
class ChildSpec:
    """What to run. `rank` is None for the router and the gateway; `replica` is set under --replicas."""

    role: str  # "shard", "router" or "gateway"
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(repr=False)  # may hold secrets (TGICTL_API_KEY, HF_TOKEN)
    rank: int | None = None
    replica: int | None = None
    cpus: tuple[int, ...] = ()  # pinned to these cores from its first instruction (empty: inherited)

    @property
    def label(self) -> str:
        own = self.role if self.rank is None else f"{self.role} {self.rank}"
        return own if self.replica is None else f"replica {self.replica} {own}"


@dataclass(frozen=True)
class LogLine:
    """One relayed line: the child's level and its message (a traceback may span lines)."""

    level: int
    message: str


def parse_line(raw: str, fallback_level: int) -> LogLine:
    """A child's JSON log record (tgictl's JsonLinesFormatter, or cli.py's error line) or a plain line
    (an uncaught traceback, a library's print), which keeps `fallback_level`."""
    text = raw.rstrip("\r\n")
    if text.startswith("{"):
        try:
            record = json.loads(text)
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict) and isinstance(record.get("message"), str):
            level = logging.getLevelName(str(record.get("level", "info")).upper())
            message = record["message"]
            if isinstance(record.get("exception"), str):
                message = f"{message}\n{record['exception']}"
            return LogLine(level if isinstance(level, int) else fallback_level, message)
    return LogLine(fallback_level, text)


def describe_exit(code: int) -> str:
    """"exited with code 2" or "was killed by SIGKILL" (Popen reports a signal as a negative code)."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _die_with_parent(cpus: tuple[int, ...] = ()) -> Callable[[], None] | None:
    """A preexec function asking Linux to SIGTERM the child when the launcher dies (and pinning it to
    `cpus`, so every thread it ever starts inherits them); None elsewhere.

    libc is loaded here, before fork, so the function run in the child only makes C calls (no import,
    no allocation that could wait on a lock another thread held at fork time).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pinned = frozenset(cpus)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if pinned:
            os.sched_setaffinity(0, pinned)

    return preexec


def _one_line(message: str) -> str:
    """The last line of a (possibly multi-line) message: a traceback's last line names the error."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[-1] if lines else ""


class ChildProcess:
    """A running child, its output relay and the tail of its log."""

    def __init__(self, spec: ChildSpec, proc: subprocess.Popen[bytes], tail_lines: int) -> None:
        self.spec = spec
        self.proc = proc
        self._tail: collections.deque[LogLine] = collections.deque(maxlen=tail_lines)
        self._tail_lock = threading.Lock()
        self._readers = [
            threading.Thread(target=self._relay, args=(stream, level), name=f"relay {spec.label}", daemon=True)
            for stream, level in ((proc.stdout, logging.INFO), (proc.stderr, logging.WARNING))
            if stream is not None
        ]
        for reader in self._readers:
            reader.start()

    @classmethod
    def start(cls, spec: ChildSpec, tail_lines: int = 40) -> ChildProcess:
        proc = subprocess.Popen(
            list(spec.argv),
            env=dict(spec.env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: we decide when it gets a signal
            preexec_fn=_die_with_parent(spec.cpus),
        )
        child = cls(spec, proc, tail_lines)
        log.info("started %s: pid %d", spec.label, proc.pid, extra={"role": spec.role, "rank": spec.rank,
                                                                    "replica": spec.replica, "child_pid": proc.pid})
        return child

    @property
    def label(self) -> str:
        return self.spec.label

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def signal_group(self, signum: int) -> None:
        """Send `signum` to the child's process group (everything it started); no-op once it is gone."""
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            # Gone already (PermissionError: macOS answers so for a group of zombies).
            pass

    def wait(self, timeout_s: float) -> int | None:
        """The exit code, or None if it is still running after `timeout_s`."""
        try:
            return self.proc.wait(timeout=max(timeout_s, 0.0))
        except subprocess.TimeoutExpired:
            return None

    def join_relay(self, timeout_s: float = 2.0) -> None:
        """Wait until the child's last lines are relayed (its pipes close when the group is gone)."""
        for reader in self._readers:
            reader.join(timeout_s)

    def tail(self) -> list[LogLine]:
        with self._tail_lock:
            return list(self._tail)

    def last_words(self) -> str:
        """The child's own account of its end: its last error line, else its last line."""
        lines = self.tail()
        errors = [line for line in lines if line.level >= logging.ERROR]
        if errors:
            return f"its last error: {_one_line(errors[-1].message)}"
        if lines:
            return f"its last log line: {_one_line(lines[-1].message)}"
        return "it logged nothing"

    def _relay(self, stream: IO[bytes], fallback_level: int) -> None:
        extra = {"role": self.spec.role, "rank": self.spec.rank, "replica": self.spec.replica,
                 "child_pid": self.proc.pid}
        for raw in iter(stream.readline, b""):
            line = parse_line(raw.decode("utf-8", errors="replace"), fallback_level)
            if not line.message.strip():
                continue
            with self._tail_lock:
                self._tail.append(line)
            log.log(line.level, "[%s] %s", self.spec.label, line.message, extra=extra)
        stream.close()
