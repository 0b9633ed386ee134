"""`tgictl launch --replicas 2` end to end on the tiny llama, as a user runs it: two replicas (real shards
and routers) behind the real SGLang Model Gateway on the public port.

One launch serves the module, in order: both APIs through the public port (the model named `tgi` and by
its id; the openai SDK and huggingface_hub's client unchanged), each replica pinned to its own core, a
replica's shard killed with SIGKILL (the next requests all answer, the replica serves again within 60 s),
then SIGTERM in the middle of a stream (it ends cleanly, exit 0, nothing left).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from huggingface_hub import InferenceClient
from launch_procs import LaunchProc, pid_alive, start_launch

RESTART_WITHIN_S = 60.0


@dataclass
class Fleet:
    launch: LaunchProc
    model: str

    def replicas(self) -> dict[int, tuple[str, str]]:
        """{index: (url, cores)} from the launcher's "starting 2 replicas ..." record."""
        for record in self.launch.records():
            message = record.get("message", "")
            if message.startswith("starting 2 replicas"):
                return {int(i): (url, cores) for i, url, cores in
                        re.findall(r"replica (\d+): (http://\S+) on cores (\S+?)(?:;|$)", message)}
        raise AssertionError(f"no replica plan logged:\n{self.launch.log()}")

    def pids(self, label: str) -> list[int]:
        """Every pid the launcher started under `label` (a restarted child appears again)."""
        return [int(r["child_pid"]) for r in self.launch.records()
                if r.get("message", "").startswith(f"started {label}:")]


@pytest.fixture(scope="module")
def fleet(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("replicas")
    launch = start_launch(tiny_model_dir, tmp, extra_args=("--replicas", "2", "--gateway-policy", "round_robin"))
    try:
        with httpx.Client() as client:
            launch.wait_healthy(client)
            deadline = time.monotonic() + 60
            while "ready: http" not in launch.log() and time.monotonic() < deadline:
                time.sleep(0.2)
        yield Fleet(launch, str(tiny_model_dir))
    finally:
        launch.stop()


def _completion(url: str, prompt: str) -> httpx.Response:
    body = {"model": "tgi", "prompt": prompt, "max_tokens": 4, "temperature": 0}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60)


def test_both_apis_through_the_public_port(fleet: Fleet) -> None:
    url = fleet.launch.url
    sdk = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    for model in ("tgi", fleet.model):
        chat = sdk.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert chat.usage is not None and chat.usage.completion_tokens == 4 and chat.model == fleet.model
        completion = sdk.completions.create(model=model, prompt="hello", max_tokens=3)
        assert completion.usage is not None and completion.usage.completion_tokens == 3
    streamed = sdk.chat.completions.create(model="tgi", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                           stream=True)
    assert sum(1 for chunk in streamed if chunk.choices and chunk.choices[0].delta.content is not None) >= 1
    # huggingface_hub's client as TGI documents it for the Messages API. Through a gateway the model must
    # be named (the id or `tgi`): SMG routes by model, where one replica alone takes any name.
    hub_chat = InferenceClient(base_url=f"{url}/v1/").chat.completions.create(
        model="tgi", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert hub_chat.usage.completion_tokens == 4
    # TGI's own API through the gateway's /generate, whole and streamed.
    body = {"inputs": "hello", "parameters": {"max_new_tokens": 3, "details": True}}
    whole = httpx.post(f"{url}/generate", json=body, timeout=60)
    assert whole.status_code == 200 and whole.json()["details"]["generated_tokens"] == 3
    with httpx.stream("POST", f"{url}/generate", json={**body, "stream": True}, timeout=60) as response:
        events = [json.loads(line[5:]) for line in response.iter_lines() if line.startswith("data:")]
    assert len(events) == 3 and events[-1]["generated_text"] is not None
    # TGI's text-generation client, pointed at the gateway's /generate (SMG has no `/` route).
    hub = InferenceClient(f"{url}/generate")
    assert isinstance(hub.text_generation("hello", max_new_tokens=3), str)
    assert len(list(hub.text_generation("hello", max_new_tokens=3, stream=True))) == 3


def test_bench_loads_the_gateway_by_the_name_it_routes(fleet: Fleet, tmp_path: Path) -> None:
    """The gateway has no /info: `tgictl bench` names the model /v1/models lists (a `model` no worker
    serves would fail every request)."""
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "-m", "tgictl", "bench", "--url", fleet.launch.url, "--api", "openai-completions",
         "--tokenizer", fleet.model, "--input-len", "8", "--output-len", "2", "--num-requests", "4",
         "--concurrency", "2", "--output", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(out.read_text())["runs"][0]["summary"]
    assert (summary["succeeded"], summary["failed"]) == (4, 0), summary["errors"]


def test_each_replica_runs_on_its_own_cores(fleet: Fleet) -> None:
    replicas = fleet.replicas()
    assert len(replicas) == 2 and replicas[0][1] != replicas[1][1]
    for index, (url, cores) in replicas.items():
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200  # private, but there
        for label in (f"replica {index} shard 0", f"replica {index} router"):
            (pid,) = fleet.pids(label)
            status = Path(f"/proc/{pid}/status").read_text()
            assert re.search(rf"^Cpus_allowed_list:\s+{re.escape(cores)}$", status, re.MULTILINE), (label, status)


def test_a_killed_shard_restarts_its_replica_while_the_gateway_serves(fleet: Fleet) -> None:
    (shard,) = fleet.pids("replica 0 shard 0")
    os.kill(shard, signal.SIGKILL)
    # Right away, before the launcher noticed: the gateway retries what the dying replica refuses.
    answers = [_completion(fleet.launch.url, f"after the kill {i}") for i in range(12)]
    assert [a.status_code for a in answers] == [200] * 12, [a.text for a in answers if a.status_code != 200]
    deadline = time.monotonic() + RESTART_WITHIN_S
    while fleet.launch.log().count("replica 0 serving on") < 2:
        assert time.monotonic() < deadline, f"replica 0 did not serve again:\n{fleet.launch.log()[-6000:]}"
        time.sleep(0.2)
    assert not pid_alive(shard)
    # The restarted replica serves through the gateway again (round robin reaches it).
    url, _ = fleet.replicas()[0]
    before = _served(url)
    deadline = time.monotonic() + RESTART_WITHIN_S
    while _served(url) == before:
        assert _completion(fleet.launch.url, "back again").status_code == 200
        assert time.monotonic() < deadline, "the gateway never sent the restarted replica a request"
    assert fleet.launch.proc.poll() is None


def _served(replica_url: str) -> float:
    text = httpx.get(f"{replica_url}/metrics", timeout=5).text
    match = re.search(r"^tgi_request_success(?:_total)? (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_sigterm_drains_a_stream_and_exits_0_leaving_nothing(fleet: Fleet) -> None:
    first = threading.Event()
    events: list[dict[str, object]] = []

    def stream() -> None:
        body = {"inputs": "a long answer", "parameters": {"max_new_tokens": 200, "ignore_eos": True}, "stream": True}
        with httpx.stream("POST", f"{fleet.launch.url}/generate", json=body, timeout=120) as response:
            for line in response.iter_lines():
                if line.startswith("data:"):
                    events.append(json.loads(line[5:]))
                    first.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert first.wait(60)
    fleet.launch.proc.send_signal(signal.SIGTERM)
    reader.join(120)
    assert len(events) == 200 and events[-1]["generated_text"] is not None  # finished, not cut
    assert fleet.launch.wait_exit(120) == 0
    started = [(r["message"].split(":")[0].removeprefix("started "), int(r["child_pid"]))
               for r in fleet.launch.records() if r.get("message", "").startswith("started ")]
    assert {label for label, _ in started} == {"gateway", *(f"replica {i} {c}" for i in (0, 1) for c in ("shard 0", "router"))}
    assert not [(label, pid) for label, pid in started if pid_alive(pid)]
    assert not list(fleet.launch.uds_base.parent.glob("*")), "sockets left"
