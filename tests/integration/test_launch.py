"""`tgictl launch` end to end on the tiny llama, as a user runs it: real shards, real router, HTTP.

Two launches serve the whole module (each costs seconds on two cores): one shard, then two. The
single-shard launch serves a hub id from an offline HF cache (as after `tgictl download`) behind an
API key given in TGICTL_API_KEY, records the name the API reports, how the key guards it and where
the key shows, and greedy outputs, and is stopped with SIGTERM in the middle of a stream;
the two-shard launch (a local directory) must give the same outputs and is ended by `kill -9` of a shard.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from launch_procs import REPO_ROOT, LaunchProc, hub_cache_holding, start_launch

from tgictl.runtime.launcher.plan import free_port

HUB_ID = "tgictl-test/tiny-llama"
API_KEY = "launch-s3cret-key"
PROMPTS = ("hello world", "the quick brown fox", "a b c d e f g")
GREEDY = {"max_new_tokens": 12, "decoder_input_details": False, "details": True}


def greedy_outputs(launch: LaunchProc, client: httpx.Client) -> list[tuple[str, list[int]]]:
    outputs = []
    for prompt in PROMPTS:
        response = client.post(f"{launch.url}/generate", json={"inputs": prompt, "parameters": GREEDY}, timeout=60)
        assert response.status_code == 200, response.text
        body = response.json()
        outputs.append((body["generated_text"], [t["id"] for t in body["details"]["tokens"]]))
    return outputs


def served_names(launch: LaunchProc, client: httpx.Client) -> dict[str, Any]:
    """The model name as /info, /v1/models and an OpenAI completion report it."""
    completion = client.post(f"{launch.url}/v1/completions", json={"model": "tgi", "prompt": "hi", "max_tokens": 1},
                             timeout=60)  # fmt: skip
    assert completion.status_code == 200, completion.text
    return {
        "info": client.get(f"{launch.url}/info").json()["model_id"],
        "models": [m["id"] for m in client.get(f"{launch.url}/v1/models").json()["data"]],
        "completion": completion.json()["model"],
    }


def api_key_use(launch: LaunchProc, client: httpx.Client) -> dict[str, Any]:
    """What the key guards, and where it shows: in no command line (`ps` shows those to every local
    user), only in the router's environment (readable by its owner alone)."""
    body = {"inputs": "hi", "parameters": {"max_new_tokens": 1}}
    url = f"{launch.url}/generate"
    pids = {"launcher": launch.proc.pid, **launch.child_pids()}
    router_environ = Path(f"/proc/{pids['router']}/environ").read_bytes().split(b"\0")
    return {
        "without_key": httpx.post(url, json=body, timeout=60).status_code,
        "wrong_key": httpx.post(url, json=body, headers={"Authorization": "Bearer wrong"}, timeout=60).status_code,
        "with_key": client.post(url, json=body, timeout=60).status_code,
        "command_lines_with_key": sorted(
            label for label, pid in pids.items() if API_KEY.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
        ),
        "router_environ_has_key": f"TGICTL_API_KEY={API_KEY}".encode() in router_environ,
        "processes": sorted(pids),
    }


@dataclass
class SingleShardRun:
    served: dict[str, Any]
    api_key: dict[str, Any]
    outputs: list[tuple[str, list[int]]]
    stream_events: list[dict[str, Any]]
    exit_code: int
    stop_s: float
    launch: LaunchProc


def stream_events(launch: LaunchProc, client: httpx.Client, first_event: threading.Event) -> list[dict[str, Any]]:
    """A long /generate_stream; sets `first_event` once the first token arrived."""
    events: list[dict[str, Any]] = []
    body = {"inputs": "once upon a time", "parameters": {"max_new_tokens": 900}}
    with client.stream("POST", f"{launch.url}/generate_stream", json=body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
                first_event.set()
    return events


@pytest.fixture(scope="module")
def single_shard(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SingleShardRun]:
    work = tmp_path_factory.mktemp("launch1")
    hub_cache_holding(tiny_model_dir, HUB_ID, work / "hub")
    launch = start_launch(
        HUB_ID, work, num_shard=1, extra_args=("--graceful-termination-timeout", "2"),
        extra_env={"HF_HUB_CACHE": str(work / "hub"), "TGICTL_API_KEY": API_KEY},
    )  # fmt: skip
    try:
        with httpx.Client(headers={"Authorization": f"Bearer {API_KEY}"}) as client:
            launch.wait_healthy(client)
            api_key = api_key_use(launch, client)
            served = served_names(launch, client)
            outputs = greedy_outputs(launch, client)
            first = threading.Event()
            result: list[list[dict[str, Any]]] = []
            reader = threading.Thread(target=lambda: result.append(stream_events(launch, client, first)))
            reader.start()
            assert first.wait(60), launch.log()
            launch.proc.send_signal(signal.SIGTERM)
            start = time.monotonic()
            reader.join(60)
            exit_code = launch.wait_exit(60)
            stop_s = time.monotonic() - start
        yield SingleShardRun(served, api_key, outputs, result[0] if result else [], exit_code, stop_s, launch)
    finally:
        launch.stop()


def test_sigterm_during_a_stream_ends_it_cleanly_and_exits_0(single_shard: SingleShardRun) -> None:
    events = single_shard.stream_events
    assert events, single_shard.launch.log()
    last = events[-1]
    # Either the stream finished within the graceful timeout or it ended with an error event.
    finished = last.get("generated_text") is not None  # TGI's last event carries the whole text
    ended_with_error = "error" in last
    assert finished or ended_with_error, last
    assert all("error" not in event for event in events[:-1])
    assert single_shard.exit_code == 0, single_shard.launch.log()
    assert single_shard.stop_s < 2 + 5 + 10  # graceful timeout, the router's margin, shard stop
    single_shard.launch.assert_nothing_left()
    messages = [r["message"] for r in single_shard.launch.records()]
    # The router was stopped before the shard.
    router_stop = next(i for i, m in enumerate(messages) if m.startswith("router (pid"))
    shard_stop = next(i for i, m in enumerate(messages) if m.startswith("shard 0 (pid"))
    assert router_stop < shard_stop


def test_the_api_names_the_model_as_the_user_did_not_by_its_cache_path(single_shard: SingleShardRun) -> None:
    assert single_shard.served == {"info": HUB_ID, "models": [HUB_ID], "completion": HUB_ID}


def test_an_api_key_from_the_environment_guards_the_api_and_shows_in_no_command_line(
    single_shard: SingleShardRun,
) -> None:
    assert single_shard.api_key == {
        "without_key": 401, "wrong_key": 401, "with_key": 200, "command_lines_with_key": [],
        "router_environ_has_key": True, "processes": ["launcher", "router", "shard 0"],
    }  # fmt: skip


def test_children_logs_carry_role_and_rank(single_shard: SingleShardRun) -> None:
    records = single_shard.launch.records()
    shard_lines = [r for r in records if r.get("role") == "shard" and r["message"].startswith("[shard 0] ")]
    router_lines = [r for r in records if r.get("role") == "router" and r["message"].startswith("[router] ")]
    assert shard_lines and all(r["rank"] == 0 for r in shard_lines)
    assert router_lines and all(r["rank"] is None for r in router_lines)


def test_two_shards_match_one_shard_and_a_killed_shard_takes_all_down(
    single_shard: SingleShardRun, tiny_model_dir: Path, tmp_path: Path
) -> None:
    launch = start_launch(tiny_model_dir, tmp_path, num_shard=2)
    try:
        with httpx.Client() as client:
            launch.wait_healthy(client)
            assert greedy_outputs(launch, client) == single_shard.outputs
        pids = launch.child_pids()
        assert set(pids) == {"shard 0", "shard 1", "router"}
        os.kill(pids["shard 1"], signal.SIGKILL)
        killed_at = time.monotonic()
        exit_code = launch.wait_exit(10)
        assert time.monotonic() - killed_at < 10
        assert exit_code == 1, launch.log()
        launch.assert_nothing_left()
        error = launch.records()[-1]
        assert error["level"] == "error" and error["error_type"] == "child_failed"
        assert error["message"].startswith(f"shard 1 (pid {pids['shard 1']}) was killed by SIGKILL; ")
    finally:
        launch.stop()


def test_a_bad_model_id_fails_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("TGICTL_LOG_LEVEL", "TGICTL_JSON_OUTPUT", "LOG_LEVEL")}
    env.update(PYTHONPATH=str(REPO_ROOT), HF_HUB_OFFLINE="1", TGICTL_CACHE_DIR=str(tmp_path / "cache"),
               HF_HUB_CACHE=str(tmp_path / "hub"))
    result = subprocess.run(
        [sys.executable, "-m", "tgictl", "launch", "--model-id", "nobody/no-such-model", "--port", "1"],
        capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("Error: model 'nobody/no-such-model' is not in the Hugging Face cache")
    assert result.stdout == ""
    assert "started" not in result.stderr


def test_heads_that_cannot_be_split_fail_before_any_process_starts(tiny_model_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("TGICTL_LOG_LEVEL", "TGICTL_JSON_OUTPUT", "LOG_LEVEL")}
    env.update(PYTHONPATH=str(REPO_ROOT), HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, "-m", "tgictl", "--log-level", "warning", "launch", "--model-id", str(tiny_model_dir),
         "--num-shard", "5", "--port", str(free_port())],  # a free port: the port is checked first
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == "Error: 5 shards are more than the model's 4 attention heads: every shard needs one\n"
