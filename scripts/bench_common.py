"""What the comparison scripts share: a server started for the run and always stopped, and one timed
load of streamed requests through tgictl bench's own client.

A server is started in its own process group and stopped (SIGTERM, then SIGKILL) when the block
ends, also when the script itself gets SIGTERM or SIGHUP (turned into SystemExit so the cleanup runs);
only SIGKILL of the script can leave one behind.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # run from a checkout without installing tgictl

from tgictl.runtime.bench.client import ApiSettings, RequestRecord, send  # noqa: E402
from tgictl.runtime.bench.load_shapes import LoadPlan, run_load  # noqa: E402
from tgictl.runtime.bench.server_metrics import SHARD_FORWARD_S, parse_samples  # noqa: E402
from tgictl.runtime.bench.workloads import BenchPrompt  # noqa: E402
from tgictl.runtime.launcher.plan import free_port  # noqa: E402, F401  (re-exported to the scripts)


def repo_env(threads: int | None = None) -> dict[str, str]:
    """The environment for a `python -m tgictl` child: the checkout importable, threads pinned if asked."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p))
    if threads is not None:  # torch and OpenMP read it at start-up
        env["OMP_NUM_THREADS"] = str(threads)
    return env


# tgictl's rows: name -> the launch arguments that make the variant (besides the model and --dtype bfloat16).
TGICTL_VARIANTS: dict[str, list[str]] = {
    "tgictl": [],
    "tgictl-gguf": [],
    "tgictl-kv8": ["--kv-cache-dtype", "int8"],
    "tgictl-q8": ["--quantize", "int8"],
    "tgictl-q4": ["--quantize", "int4"],
    "tgictl-before": [],
}
# Variants that differ by environment: tgictl-before runs the shard's OpenMP threads as tgictl did before it bound
# them to cores and shortened libgomp's spin (runtime/shard/cpu_threads.py, env.SHARD_SPIN_COUNT): unbound, and
# libgomp's default 300,000 spins (the A/B of docs/benchmarks.md's "Sharing the cores").
TGICTL_VARIANT_ENV: dict[str, dict[str, str]] = {"tgictl-before": {"TGICTL_BIND_THREADS": "0",
                                                                   "GOMP_SPINCOUNT": "300000"}}


@dataclass(frozen=True)
class ServerSpec:
    """What every server of a comparison is given: the same weights (hf/ bf16, or the GGUF), threads, and room
    for `slots` sequences of `max_len` tokens each at once."""

    hf: Path
    gguf: Path
    threads: int
    max_len: int  # prompt + generated tokens of one request
    slots: int  # requests at once
    vllm_python: str
    llama_bin: Path
    tgictl_args: tuple[str, ...] = ()  # extra `tgictl launch` arguments for every tgictl row
    vllm_kv_gib: int = 2  # VLLM_CPU_KVCACHE_SPACE


def server_command(name: str, spec: ServerSpec, port: int) -> tuple[list[str], dict[str, str], str]:
    """(argv, environment, the `model` field requests name) of server `name`."""
    if name in TGICTL_VARIANTS:
        model = spec.gguf if name == "tgictl-gguf" else spec.hf
        return ([sys.executable, "-m", "tgictl", "launch", "--model-id", str(model), "--port", str(port),
                 "--dtype", "bfloat16", *TGICTL_VARIANTS[name], *spec.tgictl_args],
                {**repo_env(spec.threads), **TGICTL_VARIANT_ENV.get(name, {})}, "tgictl")
    if name == "vllm":  # both cores compute (its default keeps one for serving)
        env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=f"0-{spec.threads - 1}",
                   VLLM_CPU_KVCACHE_SPACE=str(spec.vllm_kv_gib))
        return ([spec.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(spec.hf), "--port",
                 str(port), "--host", "127.0.0.1", "--dtype", "bfloat16", "--max-model-len", str(spec.max_len),
                 "--served-model-name", "bench"], env, "bench")
    if name == "llama-server":  # one slot per client; -c is shared by the slots
        return ([str(spec.llama_bin / "llama-server"), "-m", str(spec.gguf), "--host", "127.0.0.1", "--port",
                 str(port), "-np", str(spec.slots), "-c", str((spec.max_len + 16) * spec.slots), "-t",
                 str(spec.threads), "--no-webui"], dict(os.environ), "bench")
    raise SystemExit(f"unknown server {name!r}")


@contextmanager
def busy_cores(count: int) -> Iterator[None]:
    """`count` processes that each spin on a core until the block ends: a machine shared with other work (a
    neighbour's job, a Kubernetes pod beside this one) as a script can make it. 0: nothing is started."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
                for _ in range(count)]
    try:
        time.sleep(0.5 if spinners else 0.0)  # let the scheduler see them before the load starts
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def tree_rss_bytes(root: int) -> int:
    """VmRSS of `root` and every process below it (the server and its children: shards, workers)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:  # /proc/PID/stat: "pid (name) state ppid ..."; the name may hold spaces
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, grown = {root}, True
    while grown:
        below = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= below
        grown = bool(below)
    total = 0
    for pid in tree:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, ValueError):
            continue
    return total


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _stop(process: subprocess.Popen[bytes], grace_s: float) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)  # the whole group: a launcher's shards too
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


@contextmanager
def managed_server(name: str, command: Sequence[str], health_url: str, env: dict[str, str] | None = None,
                   ready_timeout_s: float = 600.0, grace_s: float = 60.0,
                   cwd: Path = REPO_ROOT) -> Iterator[subprocess.Popen[bytes]]:
    """Run `command` until the block ends; yields its process (the leader of its group) once GET
    `health_url` answers 200.

    Its output goes to a temporary log, kept (and named) when it fails to start, deleted otherwise.
    """
    previous = {s: signal.signal(s, _exit_on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    log = tempfile.NamedTemporaryFile(prefix=f"bench-{name}-", suffix=".log", delete=False)  # noqa: SIM115
    process = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                               start_new_session=True)
    ok = False
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if process.poll() is not None:
                raise SystemExit(f"{name} exited with {process.returncode} before it was ready; see {log.name}")
            if time.monotonic() > deadline:
                raise SystemExit(f"{name} not ready after {ready_timeout_s:.0f} s; see {log.name}")
            try:
                if httpx.get(health_url, timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        yield process
        ok = True
    finally:
        _stop(process, grace_s)
        log.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if ok:
            Path(log.name).unlink()
        else:
            print(f"{name}'s log: {log.name}", file=sys.stderr)


async def _load(url: str, settings: ApiSettings, prompts: Sequence[BenchPrompt],
                concurrency: int) -> tuple[list[RequestRecord], float]:
    timeout = httpx.Timeout(1200.0, connect=10.0)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        start = time.perf_counter()
        return await run_load(LoadPlan(concurrency=concurrency, num_requests=len(prompts)),
                              lambda i: send(client, settings, prompts[i], i, start), lambda r: None)


def shard_seconds(url: str) -> float | None:
    """The shard's forward+sampling seconds so far, from the server's /metrics; None where it has no such series."""
    try:
        samples = parse_samples(httpx.get(f"{url}/metrics", timeout=10.0).text)
    except (httpx.HTTPError, ValueError):
        return None
    return samples.get(SHARD_FORWARD_S)


def timed_load(url: str, settings: ApiSettings, prompts: Sequence[BenchPrompt],
               concurrency: int) -> tuple[list[RequestRecord], float]:
    """Every prompt streamed with `concurrency` clients: (records, seconds from first send to last answer).
    A failed request ends the script: a comparison with missing answers would flatter the server."""
    records, duration = asyncio.run(_load(url, settings, prompts, concurrency))
    for record in records:
        if not record.ok:
            raise SystemExit(f"request {record.index} to {url} failed: {record.error}")
    return records, duration
