"""A family other than Llama over real HTTP: `tgictl launch` (real shard and router processes) on a tiny Gemma 3
whose local layers' window (5 positions) is shorter than every prompt; concurrent greedy requests through
huggingface_hub's InferenceClient and the openai client equal transformers' greedy tokens, a repeat of a prompt
longer than a KV block (a radix-cache hit past the window) included, and so do two tensor-parallel shards on the
two KV layer groups; a config setting no family implements stops start-up with one line naming it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import torch
from huggingface_hub import InferenceClient
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.integration.launch_procs import LaunchProc, start_launch

NEW_TOKENS = 10
PROMPTS = ("the quick brown fox jumps over the lazy dog", "numbers: 1 2 3 4 5 6 7 8 9 10 11 12",
           "Every block of sixteen tokens that was computed is published to the radix cache for later requests.")


@dataclass
class Served:
    launch: LaunchProc
    model_dir: Path


@pytest.fixture(scope="module")
def served(make_tiny_model: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    model_dir = make_tiny_model("gemma3_text", num_layers=4, sliding_window=5)
    launch = start_launch(model_dir, tmp_path_factory.mktemp("gemma3-http"))
    try:
        with httpx.Client() as client:
            launch.wait_healthy(client)
        yield Served(launch, model_dir)
    finally:
        launch.stop()


def _transformers_greedy(model_dir: Path, text: str) -> list[int]:
    ids = AutoTokenizer.from_pretrained(model_dir)(text, return_tensors="pt")["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS)
    return out[0, ids.shape[1]:].tolist()


def test_concurrent_greedy_requests_equal_transformers(served: Served) -> None:
    client = InferenceClient(base_url=served.launch.url)
    tokenizer = AutoTokenizer.from_pretrained(served.model_dir)
    assert all(len(tokenizer(text)["input_ids"]) > 5 for text in PROMPTS)  # past the window

    def generate(text: str) -> list[int]:
        out = client.text_generation(text, max_new_tokens=NEW_TOKENS, details=True, stop=[],
                                     decoder_input_details=False)
        return [t.id for t in out.details.tokens]

    cases = [*PROMPTS, PROMPTS[2]]  # the long prompt twice: the repeat finds its first block cached
    with ThreadPoolExecutor(len(cases)) as pool:
        got = list(pool.map(generate, cases))
    again = generate(PROMPTS[2])  # after the first finished: a radix-cache hit for sure
    for text, tokens in zip([*cases, PROMPTS[2]], [*got, again]):
        expected = _transformers_greedy(served.model_dir, text)
        assert tokens == expected[: len(tokens)] and len(tokens) >= 1, text
    # Local and global layers: the server keeps a KV pool per layer group (docs/scheduling.md, Sliding windows).
    assert "KV layer groups" in served.launch.log()


def test_openai_completion_equals_transformers(served: Served) -> None:
    tokenizer = AutoTokenizer.from_pretrained(served.model_dir)
    client = openai.OpenAI(base_url=f"{served.launch.url}/v1", api_key="-")
    out = client.completions.create(model="tgi", prompt=PROMPTS[1], max_tokens=NEW_TOKENS, temperature=0)
    expected = _transformers_greedy(served.model_dir, PROMPTS[1])
    assert out.choices[0].text == tokenizer.decode(expected, skip_special_tokens=True)


def test_a_setting_no_family_implements_stops_start_up_in_one_line(
    make_tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    model_dir = tmp_path / "bidirectional"
    shutil.copytree(make_tiny_model("gemma3_text", num_layers=4, sliding_window=5), model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "use_bidirectional_attention": True}))
    launch = start_launch(model_dir, tmp_path)
    try:
        assert launch.wait_exit(120) != 0
        assert "use_bidirectional_attention=True is not supported (model_type 'gemma3_text')" in launch.log()
        assert "Traceback" not in launch.log()
    finally:
        launch.stop()


def test_two_shards_on_two_kv_layer_groups_equal_transformers_past_many_windows(
    served: Served, tmp_path: Path
) -> None:
    """Tensor parallel (--num-shard 2) on the same Gemma 3: each rank sizes its own two layer groups, the router
    takes the smaller of each; 60 greedy tokens (local blocks behind the window of 5 given back as they decode)
    equal transformers' and the one-shard server's."""
    launch = start_launch(served.model_dir, tmp_path, num_shard=2)
    try:
        with httpx.Client() as client:
            launch.wait_healthy(client)
        got = {}
        for name, url in (("two", launch.url), ("one", served.launch.url)):
            out = InferenceClient(base_url=url).text_generation(
                PROMPTS[2], max_new_tokens=60, details=True, stop=[], decoder_input_details=False)
            got[name] = [t.id for t in out.details.tokens]
        assert "KV layer groups" in launch.log()
    finally:
        launch.stop()
    ids = AutoTokenizer.from_pretrained(served.model_dir)(PROMPTS[2], return_tensors="pt")["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(served.model_dir, dtype=torch.float32, attn_implementation="eager")
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=60,
                             min_new_tokens=60)
    assert got["two"] == got["one"] == out[0, ids.shape[1]:].tolist()
