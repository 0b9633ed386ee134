"""LoRA adapters loaded while serving, over real HTTP: `tgictl launch --num-shard 2 --allow-lora-loading` (two
tensor-parallel ranks, each loading its slice) on a tiny model. An adapter loaded through vLLM's route
answers exactly as transformers + peft, beside one given at start-up; a bad directory is a 400 that leaves
every rank serving; after an unload its slot takes another adapter, whose answers are that adapter's (no
cached prefix of the old one is reused); /v1/models and the gateway metric follow."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.launch_procs import start_launch
from tests.integration.test_lora_http import Served, _ids
from tests.lora_adapters import peft_greedy, write_random_adapter

NEW_TOKENS = 6
# More than one KV block (16 tokens), so a repeat would hit the radix cache.
PROMPT = "Every block of sixteen tokens that was computed under one adapter is cached under that adapter only."


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    work = tmp_path_factory.mktemp("lora-runtime")
    adapters = {
        "boot": write_random_adapter(tiny_model_dir, work / "boot", rank=4, seed=31),
        "sql": write_random_adapter(tiny_model_dir, work / "sql", rank=8, seed=32),
        "chat": write_random_adapter(tiny_model_dir, work / "chat", rank=16, targets=("q_proj", "down_proj"), seed=33),
    }
    launch = start_launch(tiny_model_dir, work, num_shard=2,
                          extra_args=("--allow-lora-loading", "--lora-adapters", f"boot={adapters['boot']}"))
    try:
        with httpx.Client() as client:
            launch.wait_healthy(client)
        yield Served(launch, tiny_model_dir, adapters)
    finally:
        launch.stop()


def generate(served: Served, adapter: str | None) -> tuple[list[int], int]:
    """(greedy token ids, prompt tokens read from the cache) of PROMPT under `adapter`."""
    body = {"inputs": PROMPT, "parameters": {"adapter_id": adapter, "max_new_tokens": NEW_TOKENS, "details": True,
                                             "stop": []}}
    answer = httpx.post(f"{served.launch.url}/generate", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    details = answer.json()["details"]
    return [t["id"] for t in details["tokens"]], details["cached_tokens"]


def expected(served: Served, adapter: str | None) -> list[int]:
    path = served.adapters[adapter] if adapter else None
    return peft_greedy(served.model_dir, path, _ids(served.model_dir, PROMPT), NEW_TOKENS)


def post(served: Served, route: str, body: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{served.launch.url}{route}", json=body, timeout=60)


def models(served: Served) -> list[str]:
    return [m["id"] for m in httpx.get(f"{served.launch.url}/v1/models").json()["data"]][1:]


def max_lora(served: Served) -> str:
    match = re.search(r'max_lora="(\d+)"', httpx.get(f"{served.launch.url}/metrics").text)
    assert match
    return match[1]


def test_adapters_come_and_go_on_every_rank(served: Served) -> None:
    assert models(served) == ["boot"] and max_lora(served) == "1"
    loaded = post(served, "/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": str(served.adapters["sql"])})
    assert loaded.status_code == 200, loaded.text
    assert models(served) == ["boot", "sql"] and max_lora(served) == "2"
    for adapter in ("sql", "boot", None):
        tokens, _ = generate(served, adapter)
        assert tokens == expected(served, adapter), adapter
    assert generate(served, "sql")[1] > 0  # its prompt is cached under its slot

    bad = post(served, "/v1/load_lora_adapter", {"lora_name": "bad", "lora_path": str(served.model_dir / "nope")})
    assert bad.status_code == 400 and "does not exist" in bad.json()["error"]["message"]
    assert generate(served, "sql")[0] == expected(served, "sql")  # both ranks still serve, in step

    assert post(served, "/v1/unload_lora_adapter", {"lora_name": "sql"}).status_code == 200
    assert models(served) == ["boot"]
    reloaded = post(served, "/v1/load_lora_adapter", {"lora_name": "chat", "lora_path": str(served.adapters["chat"])})
    assert reloaded.status_code == 200  # into the slot "sql" left
    tokens, cached = generate(served, "chat")
    assert cached == 0 and tokens == expected(served, "chat")
    assert models(served) == ["boot", "chat"]
    assert "Traceback" not in served.launch.log()
