"""Helpers for the `tgictl launch` tests: start the real launcher as a user would, find the children it
logged, talk HTTP to it, and check that nothing is left once it exits.

The launcher runs with --json-output, so each of its log lines is a JSON object; "started shard 0:
pid N" records carry `role`, `rank` and `child_pid`, which is how tests find the children without
psutil.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tgictl.runtime.launcher.plan import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120.0


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (/proc, no psutil)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


@dataclass
class LaunchProc:
    proc: subprocess.Popen[bytes]
    port: int
    uds_base: Path
    log_path: Path
    num_shard: int
    started_at: float = field(default_factory=time.monotonic)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def records(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                out.append(record)
        return out

    def child_pids(self) -> dict[str, int]:
        """{"shard 0": pid, ..., "router": pid} from the launcher's "started ..." records."""
        return {
            r["message"].split(":")[0].removeprefix("started "): int(r["child_pid"])
            for r in self.records()
            if r.get("message", "").startswith("started ") and "child_pid" in r
        }

    def wait_healthy(self, client: httpx.Client, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"launcher exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if client.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"not healthy after {timeout_s} s:\n{self.log()}")

    def wait_exit(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"launcher still running after {timeout_s} s:\n{self.log()}") from None

    def assert_nothing_left(self) -> None:
        pids = self.child_pids()
        assert len(pids) >= self.num_shard, f"children not logged:\n{self.log()}"
        alive = {label: pid for label, pid in pids.items() if pid_alive(pid)}
        assert not alive, f"children left running: {alive}"
        left = [Path(f"{self.uds_base}-{rank}") for rank in range(self.num_shard)]
        assert not [p for p in left if p.exists()], f"socket files left: {left}"
        assert not list(self.uds_base.parent.glob("*.tmp")), "temporary socket names left"

    def stop(self) -> None:
        """Test cleanup: whatever happened, end the launcher (which ends its children)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in self.child_pids().values():
            if pid_alive(pid):
                os.killpg(pid, signal.SIGKILL)


def start_launch(
    model: Path | str, tmp_path: Path, *, num_shard: int = 1, extra_args: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
) -> LaunchProc:
    """`model`: a local directory, or a hub id that `extra_env`'s HF_HUB_CACHE holds."""
    port = free_port()
    socket_dir = tmp_path / "sockets"
    uds_base = socket_dir / "s"
    env = {k: v for k, v in os.environ.items() if k not in ("TGICTL_LOG_LEVEL", "TGICTL_JSON_OUTPUT", "LOG_LEVEL")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"  # several processes share two cores
    env["HF_HUB_OFFLINE"] = "1"
    env.update(extra_env or {})
    command = [
        sys.executable, "-m", "tgictl", "--json-output", "launch", "--model-id", str(model),
        "--num-shard", str(num_shard), "--port", str(port), "--shard-uds-path", str(uds_base),
        "--dtype", "float32", "--kv-cache-memory", "8MiB", "--max-total-tokens", "1024", *extra_args,
    ]  # fmt: skip
    log_path = tmp_path / f"launch-{num_shard}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    return LaunchProc(proc, port, uds_base, log_path, num_shard)


def hub_cache_holding(model_dir: Path, repo_id: str, cache_dir: Path) -> Path:
    """An HF hub cache (the layout huggingface_hub writes) holding `model_dir` as `repo_id` at main, so
    a launch resolves a hub id offline as it would after `tgictl download`. Returns the snapshot."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache_dir / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(model_dir, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot
