"""The request log through a real `tgictl launch` (shard + router processes, real HTTP): one JSON line per
finished request in the launcher's output with TGI's fields, a refused request (422) logged once with its
status, the client's X-Request-Id echoed; `--no-request-log` on `launch` reaches the router. The same launch
of a local directory checks its short served name (the directory's name; `tgi` too; the path in /info)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.launch_procs import LaunchProc, start_launch


def request_records(launch: LaunchProc) -> list[dict[str, Any]]:
    return [r for r in launch.records() if r.get("message", "").startswith("[router] request request_id=")]


@pytest.fixture
def launched(request: pytest.FixtureRequest, tiny_model_dir: Path, tmp_path: Path) -> Iterator[LaunchProc]:
    launch = start_launch(tiny_model_dir, tmp_path, extra_args=tuple(request.param))
    try:
        with httpx.Client(timeout=60) as client:
            launch.wait_healthy(client)
        yield launch
    finally:
        launch.stop()


@pytest.mark.parametrize("launched", [()], indirect=True)
def test_every_request_is_logged_once(launched: LaunchProc, tiny_model_dir: Path) -> None:
    with httpx.Client(base_url=launched.url, timeout=60) as client:
        assert client.get("/info").json()["model_id"] == str(tiny_model_dir)
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [tiny_model_dir.name]
        named = client.post("/v1/completions", json={"model": tiny_model_dir.name, "prompt": "hi", "max_tokens": 1})
        assert named.status_code == 200 and named.json()["model"] == tiny_model_dir.name
        ok = client.post("/generate", headers={"X-Request-Id": "job-7"},
                         json={"inputs": "hello there", "parameters": {"max_new_tokens": 4}})
        chat = client.post("/v1/chat/completions", json={
            "model": "tgi", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True})
        bad = client.post("/generate", headers={"X-Request-Id": "job-8"},
                          json={"inputs": "hello", "parameters": {"max_new_tokens": -1}})
    assert ok.status_code == 200 and ok.headers["x-request-id"] == "job-7"
    assert chat.status_code == 200 and bad.status_code == 422 and bad.headers["x-request-id"] == "job-8"
    launched.stop()  # the router flushes its log before it exits
    records = {r["request_id"]: r for r in request_records(launched)}
    assert len(request_records(launched)) == 4 == len(records), launched.log()
    first = records["job-7"]
    assert first["level"] == "info" and first["route"] == "/generate" and first["adapter"] == "base"
    assert first["generated_tokens"] == 4 and first["finish_reason"] == "length" and first["input_tokens"] > 0
    assert first["cached_tokens"] == 0
    assert 0 <= first["queue_time_s"] <= first["total_time_s"] and first["inference_time_s"] > 0
    streamed = records[chat.headers["x-request-id"]]
    assert streamed["route"] == "/v1/chat/completions" and streamed["generated_tokens"] == 3
    refused = records["job-8"]
    assert refused["status"] == 422 and refused["route"] == "/generate" and "generated_tokens" not in refused
    assert "hello" not in launched.log().split("request request_id=", 1)[1]  # never the text


@pytest.mark.parametrize("launched", [("--no-request-log",)], indirect=True)
def test_no_request_log_on_launch_reaches_the_router(launched: LaunchProc) -> None:
    with httpx.Client(base_url=launched.url, timeout=60) as client:
        assert client.post("/generate", json={"inputs": "hi", "parameters": {"max_new_tokens": 2}}).status_code == 200
        assert client.post("/generate", json={"inputs": "hi", "parameters": {"max_new_tokens": -1}}).status_code == 422
    launched.stop()
    assert "[router] " in launched.log() and request_records(launched) == []  # the router logs, but no requests
