"""Adapters loaded and unloaded at runtime, through the real router and HTTP app on the fake shard: vLLM's
routes exist only with --allow-lora-loading and need the API key; a loaded adapter becomes a `model` requests
may name and /v1/models, /info and the gateway metric list it; unloading one a request still uses is a 409, an
unloaded slot is reused by the next load and its cached prefixes are dropped; errors are OpenAI's shape."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from tgictl.config import RouterConfig
from tgictl.runtime.router.http.app import create_app
from tgictl.runtime.router.request import ErrorEvent
from tgictl.runtime.router.service import RouterService
from tgictl.runtime.router.validation import GenerationInput
from tgictl.testing.fake_shard import FakeServiceClient

Scenario = Callable[[RouterService, FakeServiceClient, httpx.AsyncClient], Awaitable[None]]


def run(tokenizer_dir: Path, scenario: Scenario, **config: object) -> None:
    async def main() -> None:
        fake = FakeServiceClient()
        settings = RouterConfig(master_shard_uds_path="/tmp/x-0", tokenizer_name="m", **config)  # type: ignore[arg-type]
        service = await RouterService.start(settings, tokenizer_dir, fake, "tiny")
        transport = httpx.ASGITransport(app=create_app(service))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://router", timeout=30) as http:
                await scenario(service, fake, http)
        finally:
            await service.close()

    asyncio.run(main())


def chat(model: str, tokens: int = 2) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens}


def test_the_routes_are_off_by_default(tiny_tokenizer_dir: Path) -> None:
    async def scenario(service: RouterService, fake: FakeServiceClient, http: httpx.AsyncClient) -> None:
        answer = await http.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/tmp"})
        assert answer.status_code == 404 and answer.json()["error"]["type"] == "not_found_error"
        assert fake.adapter_calls == []

    run(tiny_tokenizer_dir, scenario)


def test_load_use_unload_and_reuse_a_slot(tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    async def scenario(service: RouterService, fake: FakeServiceClient, http: httpx.AsyncClient) -> None:
        load = await http.post("/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": str(tmp_path)})
        assert load.status_code == 200 and load.text == "Success: LoRA adapter 'sql' added successfully."
        assert fake.adapter_calls == [("load", 1)]
        models = [m["id"] for m in (await http.get("/v1/models")).json()["data"]]
        assert models == ["tiny", "sql"] and (await http.get("/info")).json()["lora_adapters"] == ["sql"]
        assert 'max_lora="1"' in (await http.get("/metrics")).text
        answer = await http.post("/v1/chat/completions", json=chat("sql"))
        assert answer.status_code == 200 and answer.json()["model"] == "sql"
        again = await http.post("/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": str(tmp_path)})
        assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
        # A request of the adapter publishes its prompt's blocks under slot 1; unloading drops them.
        long = {**chat("sql"), "messages": [{"role": "user", "content": "the quick brown fox " * 12}]}
        assert (await http.post("/v1/chat/completions", json=long)).status_code == 200
        cached = service.allocator.cached_blocks
        assert cached > 0
        unload = await http.post("/v1/unload_lora_adapter", json={"lora_name": "sql"})
        assert unload.status_code == 200 and fake.adapter_calls[-1] == ("unload", 1)
        assert service.allocator.cached_blocks == 0 < cached
        service.allocator.check_integrity()
        gone = await http.post("/v1/chat/completions", json=chat("sql"))
        assert gone.status_code == 200  # no adapter loaded: `model` names nothing, as without adapters
        assert [m["id"] for m in (await http.get("/v1/models")).json()["data"]] == ["tiny"]
        missing = await http.post("/v1/unload_lora_adapter", json={"lora_name": "sql"})
        assert missing.status_code == 404 and "cannot be found" in missing.json()["error"]["message"]
        # The next adapter takes the free slot, and a later one a new slot.
        for name in ("chat", "code"):
            ok = await http.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(tmp_path)})
            assert ok.status_code == 200
        assert fake.adapter_calls[-2:] == [("load", 1), ("load", 2)]
        assert (await http.post("/v1/chat/completions", json=chat("sql"))).status_code == 422
        assert (await http.post("/v1/chat/completions", json=chat("code"))).json()["model"] == "code"

    run(tiny_tokenizer_dir, scenario, allow_lora_loading=True)


def test_bad_loads_are_400_and_leave_no_slot(tiny_tokenizer_dir: Path) -> None:
    async def scenario(service: RouterService, fake: FakeServiceClient, http: httpx.AsyncClient) -> None:
        for body, words in [
            ({"lora_name": "x", "lora_path": "/no/such/dir"}, "is not a directory"),
            ({"lora_name": "", "lora_path": "/tmp"}, "letters, digits"),
            ({"lora_name": "tgi", "lora_path": "/tmp"}, "letters, digits"),
            ({"lora_name": "a\ud800", "lora_path": "/tmp"}, "letters, digits"),
            ({"lora_name": "a b", "lora_path": "/tmp"}, "letters, digits"),
            ({"lora_name": "x", "lora_path": ""}, "PEFT adapter directory"),
            ({"lora_name": "x", "lora_path": "/tmp/\ud800"}, "PEFT adapter directory"),
            ({"lora_name": "x"}, "lora_path"),
        ]:
            answer = await http.post("/v1/load_lora_adapter", content=json.dumps(body).encode(),  # "\\ud800" as is
                                     headers={"content-type": "application/json"})
            assert 400 <= answer.status_code < 500 and words in answer.json()["error"]["message"], body
        # The shard's refusal was undone on every rank; no slot was taken.
        assert fake.adapter_calls == [("load", 1), ("unload", 1)]
        assert service.adapters.slots.names == ()

    run(tiny_tokenizer_dir, scenario, allow_lora_loading=True)


def test_an_adapter_in_use_is_not_unloaded(tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    async def scenario(service: RouterService, fake: FakeServiceClient, http: httpx.AsyncClient) -> None:
        await http.post("/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": str(tmp_path)})
        fake.step_delay_s = 0.02
        running = asyncio.ensure_future(http.post("/v1/chat/completions", json=chat("sql", tokens=40)))
        while not service.batcher.entries():
            await asyncio.sleep(0.01)
        refused = await http.post("/v1/unload_lora_adapter", json={"lora_name": "sql"})
        assert refused.status_code == 409 and "in use by 1 " in refused.json()["error"]["message"]
        finished = await running  # the request in flight keeps its adapter to the end
        assert finished.status_code == 200 and finished.json()["usage"]["completion_tokens"] == 40
        assert (await http.post("/v1/unload_lora_adapter", json={"lora_name": "sql"})).status_code == 200

    run(tiny_tokenizer_dir, scenario, allow_lora_loading=True)


def test_the_api_key_guards_the_routes(tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    async def scenario(service: RouterService, fake: FakeServiceClient, http: httpx.AsyncClient) -> None:
        body = {"lora_name": "sql", "lora_path": str(tmp_path)}
        assert (await http.post("/v1/load_lora_adapter", json=body)).status_code == 401
        ok = await http.post("/v1/load_lora_adapter", json=body, headers={"Authorization": "Bearer k"})
        assert ok.status_code == 200
        # Anthropic's header works too.
        assert (await http.post("/v1/unload_lora_adapter", json={"lora_name": "sql"},
                                headers={"x-api-key": "k"})).status_code == 200

    run(tiny_tokenizer_dir, scenario, allow_lora_loading=True, api_key="k")


def test_a_request_validated_before_its_adapter_was_unloaded_ends_as_a_422(tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    async def scenario(service: RouterService, fake: FakeServiceClient, http: httpx.AsyncClient) -> None:
        await http.post("/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": str(tmp_path)})
        admission = service.admit()
        validated = await service.validate(admission, GenerationInput(inputs="hi", max_new_tokens=2, model="sql"))
        assert validated.adapter_index == 1
        assert (await http.post("/v1/unload_lora_adapter", json={"lora_name": "sql"})).status_code == 200
        channel = service.open([admission], [validated])  # the slot it names is free now: nothing is queued
        item = await channel.next()
        assert item is not None and isinstance(item[1], ErrorEvent) and item[1].error.http_status == 422
        assert "was unloaded" in item[1].error.message and channel.closed and len(service.queue) == 0
        admission.release()

    run(tiny_tokenizer_dir, scenario, allow_lora_loading=True)
