#!/usr/bin/env python
"""Soak test (not in CI): N minutes of mixed load with disconnects against a launched server.

    python scripts/soak.py --minutes 10                      # tiny random llama, launched here
    python scripts/soak.py --model-id DIR --minutes 30       # a real model, launched here
    python scripts/soak.py --url http://127.0.0.1:8080       # an existing server (no RSS figures)

Workers loop over /generate, /generate_stream, /v1/chat/completions, /v1/completions and /tokenize
with random prompt lengths, token counts and streaming; a share of them leaves early (after a random
delay or a random number of streamed tokens). Every window (--window-s) prints the requests, errors
by kind, disconnects, p50/p99 latency of completed requests, and the RSS of the router and every
shard (read from /proc). At the end: the p99 drift (last window / first window), RSS growth, and the
KV blocks leaked once the server is idle (free + cached must equal the total). Exit 1 on any error
or leak. --json writes the whole report as JSON too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # run from a checkout without installing tgictl

from tgictl.runtime.launcher.plan import free_port  # noqa: E402

WORDS = ("amber", "basalt", "cobalt", "dune", "ember", "fjord", "garnet", "harbor", "indigo", "jasper", "kelp")
ROUTES = ("/generate", "/generate_stream", "/v1/chat/completions", "/v1/completions", "/tokenize")


@dataclass(frozen=True)
class SoakConfig:
    minutes: float
    window_s: float
    concurrency: int
    disconnect_ratio: float
    max_new_tokens: int
    max_prompt_words: int
    seed: int


@dataclass
class Window:
    """Figures of one reporting window."""

    start_s: float
    requests: int = 0
    completed: int = 0
    disconnects: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    slowest: tuple[float, str] = (0.0, "")  # (ms, "route stream? tokens") of the slowest completion
    rss_mib: dict[str, float] = field(default_factory=dict)

    def percentile(self, q: float) -> float | None:
        if not self.latencies_ms:
            return None
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- the server ------------------------------------------------------------------------------------



def launch(model_dir: Path, work: Path, extra: list[str]) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    env.setdefault("HF_HUB_OFFLINE", "1")
    log_path = work / "launch.log"
    command = [sys.executable, "-m", "tgictl", "--json-output", "launch", "--model-id", str(model_dir),
               "--port", str(port), *extra]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the launcher exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url, log_path
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("the server did not become healthy within 300 s")


def children(log_path: Path) -> dict[str, int]:
    """{"shard 0": pid, "router": pid} from the launcher's JSON "started ..." records."""
    found = {}
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "child_pid" in record and record.get("message", "").startswith("started "):
            found[record["message"].split(":")[0].removeprefix("started ")] = int(record["child_pid"])
    return found


def rss_mib(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    return int(match.group(1)) / 1024 if match else None


def kv_blocks(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    values = {}
    for name in ("tgictl_kv_blocks_total", "tgictl_kv_blocks_free", "tgictl_kv_blocks_cached", "tgi_queue_size"):
        match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        values[name] = float(match.group(1)) if match else float("nan")
    return values


# --- the load ---------------------------------------------------------------------------------------


def request(rng: random.Random, config: SoakConfig) -> tuple[str, dict[str, Any], bool]:
    route = rng.choice(ROUTES)
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, config.max_prompt_words)))
    tokens = rng.randint(1, config.max_new_tokens)
    stream = route == "/generate_stream" or (route.startswith("/v1/") and rng.random() < 0.5)
    if route in ("/generate", "/generate_stream", "/tokenize"):
        parameters = {"max_new_tokens": tokens, "do_sample": rng.random() < 0.5}
        body: dict[str, Any] = {"inputs": prompt, "parameters": parameters}
    elif route == "/v1/chat/completions":
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "stream": stream}
    else:
        body = {"prompt": prompt, "max_tokens": tokens, "stream": stream}
    return route, body, stream


def classify_error(status: int, content: bytes) -> str:
    try:
        return f"{status} {json.loads(content).get('error_type')}"
    except (ValueError, AttributeError):
        return f"{status} (not JSON)"


async def one(http: httpx.AsyncClient, rng: random.Random, config: SoakConfig, window: Window) -> None:
    route, body, stream = request(rng, config)
    leave = rng.random() < config.disconnect_ratio
    window.requests += 1
    start = time.monotonic()
    try:
        if stream:
            leave_after = rng.randint(0, 8) if leave else None
            async with http.stream("POST", route, json=body) as response:
                if response.status_code != 200:
                    window.errors[classify_error(response.status_code, await response.aread())] += 1
                    return
                events = 0
                async for line in response.aiter_lines():
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    event = json.loads(line[5:])
                    if isinstance(event, dict) and "error" in event and "error_type" in event:
                        window.errors[f"event {event['error_type']}"] += 1
                        return
                    events += 1
                    if leave_after is not None and events > leave_after:
                        window.disconnects += 1
                        return
        else:
            task = asyncio.ensure_future(http.post(route, json=body))
            if leave:
                done, _ = await asyncio.wait({task}, timeout=rng.uniform(0.0, 0.5))
                if not done:
                    task.cancel()
                    window.disconnects += 1
                    return
            response = await task
            if response.status_code != 200:
                window.errors[classify_error(response.status_code, response.content)] += 1
                return
    except httpx.HTTPError as err:
        window.errors[f"transport {type(err).__name__}"] += 1
        return
    window.completed += 1
    elapsed_ms = (time.monotonic() - start) * 1000
    window.latencies_ms.append(elapsed_ms)
    if elapsed_ms > window.slowest[0]:
        window.slowest = (elapsed_ms, f"{route} stream={stream} {json.dumps(body)[:80]}")


async def soak(url: str, config: SoakConfig, pids: dict[str, int]) -> list[Window]:
    rng = random.Random(config.seed)
    began = time.monotonic()
    end = began + config.minutes * 60
    windows = [Window(start_s=0.0)]
    limits = httpx.Limits(max_connections=config.concurrency * 2, max_keepalive_connections=config.concurrency)

    async def worker(index: int) -> None:
        worker_rng = random.Random(rng.random() + index)
        while time.monotonic() < end:
            await one(http, worker_rng, config, windows[-1])

    async def reporter() -> None:
        while time.monotonic() < end:
            await asyncio.sleep(min(config.window_s, max(end - time.monotonic(), 0.0)))
            current = windows[-1]
            current.rss_mib = {label: value for label, pid in pids.items() if (value := rss_mib(pid)) is not None}
            print_window(current)
            if time.monotonic() < end:
                windows.append(Window(start_s=time.monotonic() - began))

    async with httpx.AsyncClient(base_url=url, timeout=120.0, limits=limits) as http:
        await asyncio.gather(reporter(), *(worker(i) for i in range(config.concurrency)))
    return windows


def print_window(w: Window) -> None:
    p50, p99 = w.percentile(0.5), w.percentile(0.99)
    rss = " ".join(f"{label}={value:.0f}MiB" for label, value in sorted(w.rss_mib.items()))
    print(f"t={w.start_s:7.1f}s requests={w.requests:5d} completed={w.completed:5d} left={w.disconnects:4d} "
          f"errors={sum(w.errors.values()):3d} p50={p50 or 0:7.1f}ms p99={p99 or 0:7.1f}ms {rss}"
          + (f" {dict(w.errors)}" if w.errors else ""), flush=True)


def summary(windows: list[Window], leaked: int, kv: dict[str, float]) -> dict[str, Any]:
    full = [w for w in windows if w.latencies_ms]
    first, last = (full[0], full[-1]) if full else (windows[0], windows[-1])
    growth = {label: last.rss_mib[label] - first.rss_mib[label] for label in first.rss_mib if label in last.rss_mib}
    errors: Counter[str] = Counter()
    for w in windows:
        errors.update(w.errors)
    p99_first, p99_last = first.percentile(0.99), last.percentile(0.99)
    return {
        "requests": sum(w.requests for w in windows),
        "completed": sum(w.completed for w in windows),
        "disconnects": sum(w.disconnects for w in windows),
        "errors": dict(errors),
        "p99_first_ms": p99_first,
        "p99_last_ms": p99_last,
        "p99_drift": (p99_last / p99_first) if p99_first and p99_last else None,
        "rss_first_mib": first.rss_mib,
        "rss_last_mib": last.rss_mib,
        "rss_growth_mib": growth,
        "kv_blocks_leaked": leaked,
        "kv_at_end": kv,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--window-s", type=float, default=30.0, help="Seconds per reporting window.")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--disconnect-ratio", type=float, default=0.3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-prompt-words", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--url", help="Soak an existing server instead of launching one (no RSS figures).")
    parser.add_argument("--model-id", help="Model to launch (default: a tiny random llama written to a temp dir).")
    parser.add_argument("--launch-arg", action="append", default=[], help="Extra `tgictl launch` argument (repeat).")
    parser.add_argument("--json", type=Path, help="Also write the report here as JSON.")
    args = parser.parse_args()
    config = SoakConfig(args.minutes, args.window_s, args.concurrency, args.disconnect_ratio, args.max_new_tokens,
                        args.max_prompt_words, args.seed)

    with tempfile.TemporaryDirectory(prefix="tgictl-soak-") as tmp:
        work = Path(tmp)
        proc = None
        pids: dict[str, int] = {}
        url = args.url
        if url is None:
            model = Path(args.model_id) if args.model_id else tiny_model(work / "model")
            extra = args.launch_arg or ["--max-total-tokens", "512", "--kv-cache-memory", "16MiB"]
            proc, url, log_path = launch(model, work, extra)
            pids = children(log_path)
            print(f"launched {url} (children {pids})", flush=True)
        try:
            windows = asyncio.run(soak(url, config, pids))
            deadline = time.monotonic() + 30
            while True:  # idle: every block free or cached, nothing queued
                kv = kv_blocks(url)
                leaked = int(kv["tgictl_kv_blocks_total"] - kv["tgictl_kv_blocks_free"] - kv["tgictl_kv_blocks_cached"])
                if (leaked == 0 and kv["tgi_queue_size"] == 0) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            healthy = httpx.get(f"{url}/health", timeout=10).status_code == 200
        finally:
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=120)
        report = {"config": asdict(config), **summary(windows, leaked, kv), "healthy_at_end": healthy,
                  "launcher_exit": proc.returncode if proc is not None else None,
                  "windows": [{**asdict(w), "errors": dict(w.errors), "latencies_ms": None,
                               "p50_ms": w.percentile(0.5), "p99_ms": w.percentile(0.99)} for w in windows]}
    print(json.dumps({k: v for k, v in report.items() if k != "windows"}, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return 0 if not report["errors"] and leaked == 0 and healthy else 1


def tiny_model(path: Path) -> Path:
    sys.path.insert(0, str(REPO_ROOT))
    from tgictl.testing.tiny_models import write_tiny_model

    path.mkdir(parents=True)
    return write_tiny_model(path, "llama")


if __name__ == "__main__":
    sys.exit(main())
