"""Multi-LoRA over real HTTP: `tgictl launch --lora-adapters` (real shard and router processes) on a
tiny model with two random PEFT adapters. Each request's greedy output equals transformers + peft
(float32), requests of different adapters and the base model running together; TGI's adapter_id
through huggingface_hub's InferenceClient and OpenAI's model through the openai client; an unknown
adapter is a 422 naming the adapters; the radix cache is keyed by adapter; metrics per adapter; a bad
adapter stops start-up with one clear error."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from huggingface_hub import InferenceClient

from tests.integration.launch_procs import LaunchProc, start_launch
from tests.lora_adapters import peft_greedy, write_random_adapter

NEW_TOKENS = 8
PROMPTS = ("the quick brown fox", "numbers: 1 2 3", "def add(a, b):", "plain English prose")
# A prompt of more than one KV block (16 tokens), so a repeat can hit the radix cache.
LONG_PROMPT = "Every block of sixteen tokens that was computed under one adapter is cached under that adapter only."


@dataclass
class Served:
    launch: LaunchProc
    model_dir: Path
    adapters: dict[str, Path]


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    work = tmp_path_factory.mktemp("lora-http")
    adapters = {
        "sql": write_random_adapter(tiny_model_dir, work / "sql", rank=8, seed=11),
        "chat": write_random_adapter(tiny_model_dir, work / "chat", rank=4, targets=("q_proj", "v_proj", "down_proj"),
                                     use_rslora=True, seed=12),
    }  # fmt: skip
    flag = ",".join(f"{name}={path}" for name, path in adapters.items())
    launch = start_launch(tiny_model_dir, work, extra_args=("--lora-adapters", flag))
    try:
        with httpx.Client() as client:
            launch.wait_healthy(client)
        yield Served(launch, tiny_model_dir, adapters)
    finally:
        launch.stop()


def _ids(model_dir: Path, text: str) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)(text)["input_ids"]


def _expected(served: Served, text: str, adapter: str | None) -> list[int]:
    return peft_greedy(served.model_dir, served.adapters[adapter] if adapter else None, _ids(served.model_dir, text), NEW_TOKENS)


def test_tgi_adapter_id_matches_peft_in_a_mixed_batch(served: Served) -> None:
    client = InferenceClient(base_url=served.launch.url)
    cases = [(text, adapter) for text in PROMPTS for adapter in (None, "sql", "chat")]

    def generate(case: tuple[str, str | None]) -> list[int]:
        out = client.text_generation(case[0], max_new_tokens=NEW_TOKENS, details=True, adapter_id=case[1], stop=[])
        return [t.id for t in out.details.tokens]

    with ThreadPoolExecutor(len(cases)) as pool:  # concurrent: the adapters share forwards
        got = list(pool.map(generate, cases))
    want = [_expected(served, text, adapter) for text, adapter in cases]
    for case, g, w in zip(cases, got, want):
        assert g == w[: len(g)] and (len(g) == NEW_TOKENS or len(g) == len(w)), case
    assert len({tuple(w) for (text, _), w in zip(cases, want) if text == PROMPTS[0]}) == 3  # adapters matter


def test_openai_model_selects_the_adapter_and_is_echoed(served: Served) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(served.model_dir)
    client = openai.OpenAI(base_url=f"{served.launch.url}/v1", api_key="-")
    for model in ("sql", "chat", "tgi"):
        out = client.completions.create(model=model, prompt=PROMPTS[2], max_tokens=NEW_TOKENS, temperature=0)
        expected = _expected(served, PROMPTS[2], None if model == "tgi" else model)
        assert out.choices[0].text == tokenizer.decode(expected, skip_special_tokens=True)
        assert out.model == (model if model != "tgi" else served.model_dir.name)  # a local directory: served under its name


def test_models_and_info_list_the_adapters(served: Served) -> None:
    models = httpx.get(f"{served.launch.url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == [served.model_dir.name, "sql", "chat"]
    assert httpx.get(f"{served.launch.url}/info").json()["lora_adapters"] == ["sql", "chat"]


def test_an_unknown_adapter_is_a_422_naming_the_known_ones(served: Served) -> None:
    body = {"inputs": "hi", "parameters": {"adapter_id": "nope", "max_new_tokens": 2}}
    response = httpx.post(f"{served.launch.url}/generate", json=body, timeout=30)
    assert response.status_code == 422
    error = response.json()
    assert error["error_type"] == "validation" and "adapters: `sql`, `chat`" in error["error"]
    client = openai.OpenAI(base_url=f"{served.launch.url}/v1", api_key="-")
    with pytest.raises(openai.UnprocessableEntityError) as info:
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert "`model` `gpt-4` is not a loaded LoRA adapter" in info.value.response.json()["error"]["message"]


def test_the_prefix_cache_is_kept_per_adapter(served: Served) -> None:
    def cached(adapter: str | None) -> int:
        body = {"inputs": LONG_PROMPT, "parameters": {"adapter_id": adapter, "max_new_tokens": 2, "details": True}}
        response = httpx.post(f"{served.launch.url}/generate", json=body, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()["details"]["cached_tokens"]

    assert len(_ids(served.model_dir, LONG_PROMPT)) > 17
    assert cached("sql") == 0
    assert cached("sql") > 0  # the same prompt under the same adapter shares its KV
    assert cached("chat") == 0  # but never another adapter's
    assert cached(None) == 0


def test_metrics_count_requests_and_tokens_per_adapter(served: Served) -> None:
    def counter(name: str, adapter: str) -> float:
        text = httpx.get(f"{served.launch.url}/metrics").text
        match = re.search(rf'^{name}_total{{adapter="{adapter}"}} (\S+)$', text, re.MULTILINE)
        assert match, name
        return float(match[1])

    before = counter("tgictl_adapter_requests", "chat"), counter("tgictl_adapter_generated_tokens", "chat")
    body = {"inputs": "hi", "parameters": {"adapter_id": "chat", "max_new_tokens": 3, "stop": []}}
    response = httpx.post(f"{served.launch.url}/generate", json=body, timeout=30)
    assert response.status_code == 200
    generated = len(_ids(served.model_dir, "hi" + response.json()["generated_text"])) >= 1
    assert counter("tgictl_adapter_requests", "chat") == before[0] + 1
    assert generated and counter("tgictl_adapter_generated_tokens", "chat") > before[1]


def test_a_bad_adapter_stops_start_up_with_one_clear_error(served: Served, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(served.adapters["sql"], bad)
    config = json.loads((bad / "adapter_config.json").read_text())
    (bad / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    launch = start_launch(served.model_dir, tmp_path, extra_args=("--lora-adapters", f"bad={bad}"))
    try:
        assert launch.wait_exit(120) != 0
        assert "LoRA adapter 'bad': use_dora=True is not supported" in launch.log()
        assert "Traceback" not in launch.log()
    finally:
        launch.stop()
