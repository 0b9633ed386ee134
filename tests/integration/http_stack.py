"""A real `tgictl shard` plus a real `tgictl router` on a tiny model, as the HTTP tests use them.

Each test module starts one stack (module-scoped fixture) and shares it across its tests; the
processes are killed in teardown. Small warmup and KV settings keep start-up to a few seconds.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai

from tgictl.runtime.launcher.plan import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 90.0



def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["HF_HUB_OFFLINE"] = "1"
    return env


@dataclass
class Stack:
    url: str
    shard: subprocess.Popen[bytes]
    router: subprocess.Popen[bytes]
    log_dir: Path

    def openai(self) -> openai.OpenAI:
        """The openai SDK pointed at this stack, without retries (a retry would hide a failure)."""
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)

    def logs(self) -> str:
        return "\n".join(
            f"--- {name} ---\n" + (self.log_dir / f"{name}.log").read_text(errors="replace")[-4000:]
            for name in ("shard", "router")
        )


def _wait_socket(shard: subprocess.Popen[bytes], socket_path: Path, logs: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not socket_path.exists():
        if shard.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"shard did not start:\n{logs.read_text(errors='replace')[-4000:]}")
        time.sleep(0.1)


def _wait_healthy(stack: Stack) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if stack.router.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"router did not start\n{stack.logs()}")
        try:
            if httpx.get(f"{stack.url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s: test cleanup that never leaves a process behind."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def http_stack(
    model_dir: Path, work_dir: Path, router_args: Sequence[str] = (), shard_args: Sequence[str] = ()
) -> Iterator[Stack]:
    uds = Path("/tmp") / f"tgictl-test-{os.getpid()}-{free_port()}" / "s"
    port = free_port()
    env = _env()
    shard_log = open(work_dir / "shard.log", "wb")
    router_log = open(work_dir / "router.log", "wb")
    shard = subprocess.Popen(
        [sys.executable, "-m", "tgictl", "shard", "--model-id", str(model_dir), "--uds-path", str(uds),
         "--kv-cache-memory", "8MiB", "--dtype", "float32", *shard_args],
        stdout=shard_log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT,
    )
    processes: list[subprocess.Popen[bytes]] = [shard]
    try:
        # The router attaches to running shards only: start it once the shard's socket exists.
        _wait_socket(shard, Path(f"{uds}-0"), work_dir / "shard.log")
        router = subprocess.Popen(
            [sys.executable, "-m", "tgictl", "router", "--master-shard-uds-path", f"{uds}-0",
             "--tokenizer-name", str(model_dir), "--port", str(port), "--max-batch-prefill-tokens", "256",
             "--max-total-tokens", "512", "--graceful-termination-timeout", "2", *router_args],
            stdout=router_log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT,
        )
        processes.insert(0, router)
        stack = Stack(url=f"http://127.0.0.1:{port}", shard=shard, router=router, log_dir=work_dir)
        _wait_healthy(stack)
        yield stack
    finally:
        for process in processes:  # router first: it drains before the shard goes away
            stop_process(process)
        shard_log.close()
        router_log.close()
        shutil.rmtree(uds.parent, ignore_errors=True)
