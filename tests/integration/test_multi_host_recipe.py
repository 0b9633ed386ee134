"""docs/replicas.md's recipe for more than one host, tested here: two `tgictl launch` standing for two hosts,
the SGLang Model Gateway with file discovery in front, a worker added to the manifest and another removed
while clients keep sending requests, and not one request fails.

    host A: tgictl launch ...            host B: tgictl launch ...
    gateway: smg launch --discovery-provider file --discovery-file workers.json --model-alias tgi=MODEL
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from launch_procs import LaunchProc, start_launch

from tgictl.runtime.launcher.plan import free_port

SWITCH_WITHIN_S = 60.0


def _served(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    match = re.search(r"^tgi_request_success(?:_total)? (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _write_manifest(path: Path, urls: list[str]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"version": 1, "workers": [{"url": url} for url in urls]}))
    tmp.replace(path)  # atomically: the gateway never reads half a file


@pytest.fixture(scope="module")
def hosts(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LaunchProc, LaunchProc]]:
    launches = [start_launch(tiny_model_dir, tmp_path_factory.mktemp(f"host-{name}")) for name in "ab"]
    try:
        with httpx.Client() as client:
            for launch in launches:
                launch.wait_healthy(client)
        yield launches[0], launches[1]
    finally:
        for launch in launches:
            launch.stop()


def test_workers_join_and_leave_the_file_while_serving_without_a_failed_request(
    hosts: tuple[LaunchProc, LaunchProc], tiny_model_dir: Path, tmp_path: Path
) -> None:
    a, b = hosts
    manifest = tmp_path / "workers.json"
    _write_manifest(manifest, [a.url])
    port = free_port()
    gateway_log = tmp_path / "gateway.log"
    command = [
        sys.executable, "-m", "smg", "launch", "--host", "127.0.0.1", "--port", str(port),
        "--discovery-provider", "file", "--discovery-file", str(manifest), "--discovery-check-interval-secs", "1",
        "--policy", "round_robin", "--model-alias", f"tgi={tiny_model_dir.name}",  # served under its directory's name
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--log-json",
    ]  # fmt: skip
    with gateway_log.open("wb") as log:
        gateway = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    outcomes: list[int | str] = []
    stop = threading.Event()

    def clients() -> None:
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                body = {"model": "tgi", "prompt": f"request {len(outcomes)}", "max_tokens": 3}
                try:
                    outcomes.append(client.post(f"{url}/v1/completions", json=body).status_code)
                except httpx.HTTPError as err:
                    outcomes.append(repr(err))

    try:
        deadline = time.monotonic() + 60
        while True:  # serving through host A
            try:
                if httpx.post(f"{url}/v1/completions", json={"model": "tgi", "prompt": "hi", "max_tokens": 1},
                              timeout=10).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and gateway.poll() is None, gateway_log.read_text()[-4000:]
            time.sleep(0.2)
        worker = threading.Thread(target=clients)
        worker.start()
        try:
            b_before = _served(b.url)
            _write_manifest(manifest, [a.url, b.url])  # host B joins
            _wait(lambda: _served(b.url) > b_before, "host B never got a request", gateway_log)
            _write_manifest(manifest, [b.url])  # host A leaves
            time.sleep(3)  # what was already on its way to A ends there
            a_after = _served(a.url)
            count = len(outcomes)
            _wait(lambda: len(outcomes) >= count + 20, "requests stopped flowing", gateway_log)
            assert _served(a.url) == a_after, "host A still gets requests after it left the manifest"
        finally:
            stop.set()
            worker.join(60)
        failed = [o for o in outcomes if o != 200]
        assert len(outcomes) > 40 and not failed, (failed[:5], gateway_log.read_text()[-4000:])
    finally:
        gateway.terminate()
        gateway.wait(30)


def _wait(condition: object, message: str, log: Path) -> None:
    deadline = time.monotonic() + SWITCH_WITHIN_S
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{message}:\n{log.read_text()[-4000:]}"
        time.sleep(0.2)
