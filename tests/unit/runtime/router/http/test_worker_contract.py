"""The worker contract in process: the routes and fields a gateway reads (worker_contract.py's table),
on a real RouterService and HTTP app over a fake shard. What SMG itself makes of them is checked with
the real gateway in tests/integration/test_gateway_worker.py."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.unit.runtime.router.test_service import run
from tgictl import __version__
from tgictl.runtime.router.http.app import create_app
from tgictl.runtime.router.service import RouterService
from tgictl.testing.fake_shard import FakeServiceClient


async def _get(service: RouterService, path: str, **headers: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=create_app(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
        return await client.get(path, headers=headers)


def test_version_models_and_server_facts(tiny_tokenizer_dir: Path) -> None:
    async def body(service: RouterService, fake: FakeServiceClient) -> None:
        version = await _get(service, "/version")
        assert version.status_code == 200 and version.json() == {"version": __version__}

        models = (await _get(service, "/v1/models")).json()["data"]
        # The first entry is what SMG reads: a server that is not vLLM or SGLang by `owned_by` ...
        assert models[0] == {"id": "tiny", "object": "model", "created": 0, "owned_by": "tgictl",
                             "root": "m", "parent": None, "max_model_len": 300}
        for path in ("/server_info", "/get_server_info"):
            info = (await _get(service, path)).json()
            assert info["served_model_name"] == "tiny" and info["model_path"] == "m"
            assert info["context_length"] == 300 and info["tp_size"] == 1 and info["page_size"] == 16
            assert info["max_total_tokens"] == service.limits.max_batch_total_tokens
            assert info["max_running_requests"] == 7 and info["version"] == __version__
        for path in ("/model_info", "/get_model_info"):
            assert (await _get(service, path)).json()["is_generation"] is True

    run(tiny_tokenizer_dir, body, max_total_tokens=300, max_concurrent_requests=7)


def test_the_api_key_guards_what_reveals_the_model_but_not_the_version(tiny_tokenizer_dir: Path) -> None:
    async def body(service: RouterService, fake: FakeServiceClient) -> None:
        assert (await _get(service, "/version")).status_code == 200
        for path in ("/v1/models", "/server_info", "/model_info", "/get_server_info"):
            assert (await _get(service, path)).status_code == 401, path
            assert (await _get(service, path, authorization="Bearer k3y")).status_code == 200, path

    run(tiny_tokenizer_dir, body, api_key="k3y")


def test_generate_streams_when_a_gateway_forwards_stream_true(tiny_tokenizer_dir: Path) -> None:
    """SMG's /generate forwards TGI's body with its own fields added (`model`, `stream`, `log_metrics`);
    with `stream: true` the answer is /generate_stream's event stream."""

    async def body(service: RouterService, fake: FakeServiceClient) -> None:
        transport = httpx.ASGITransport(app=create_app(service))
        forwarded = {"inputs": "hello", "parameters": {"max_new_tokens": 3}, "model": "tgi", "log_metrics": True,
                     "return_text_in_logprobs": False, "return_hidden_states": False}
        async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
            whole = await client.post("/generate", json={**forwarded, "stream": False})
            streamed = await client.post("/generate", json={**forwarded, "stream": True})
        assert whole.status_code == 200 and "generated_text" in whole.json()
        assert streamed.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[5:]) for line in streamed.text.splitlines() if line.startswith("data:")]
        # The fake shard's tokens depend on the request id, so the two answers differ in text, not shape.
        assert [e["generated_text"] is not None for e in events] == [False, False, True]
        assert events[-1]["generated_text"] == "".join(e["token"]["text"] for e in events)
        assert isinstance(whole.json()["generated_text"], str)

    run(tiny_tokenizer_dir, body)
