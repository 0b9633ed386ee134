"""`--speculate` over real HTTP on the real model (float32): the same answers as a server without it,
on both APIs, greedy and seeded, streamed and not, stop strings inside accepted runs; the drafts are
visible in /metrics and /info."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from huggingface_hub import InferenceClient

from tests.integration.http_stack import Stack, http_stack

PARAGRAPH = (
    "The committee met on Tuesday to review the budget for the coming year. After a long discussion, members "
    "agreed to increase funding for the public library, reduce spending on road repairs, and set aside money "
    "for a new community garden near the river."
)
COPY = [{"role": "user", "content": "Repeat this paragraph exactly:\n\n" + PARAGRAPH}]
FREE = [{"role": "user", "content": "Write two sentences about the sea."}]
SETTINGS = ["--max-total-tokens", "1024", "--max-batch-prefill-tokens", "512"]
SHARD = ["--kv-cache-memory", "96MiB"]


@pytest.fixture(scope="module")
def stacks(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Stack]]:
    plain_dir, spec_dir = tmp_path_factory.mktemp("plain"), tmp_path_factory.mktemp("speculate")
    with http_stack(smollm2_dir, plain_dir, router_args=SETTINGS, shard_args=SHARD) as plain, \
            http_stack(smollm2_dir, spec_dir, router_args=SETTINGS, shard_args=[*SHARD, "--speculate", "4"]) as spec:
        yield plain, spec


def chat(stack: Stack, messages: list[dict[str, str]], **kwargs: object) -> tuple[str, str | None]:
    answer = stack.openai().chat.completions.create(model="tgi", messages=messages, max_tokens=80, **kwargs)  # type: ignore[arg-type]
    return answer.choices[0].message.content or "", answer.choices[0].finish_reason


def accepted_tokens(stack: Stack) -> float:
    text = httpx.get(f"{stack.url}/metrics").text
    match = re.search(r"^tgictl_speculative_accepted_tokens_total ([0-9.e+]+)$", text, re.M)
    assert match is not None, "the acceptance counter is exported"
    return float(match.group(1))


@pytest.mark.parametrize("messages", [COPY, FREE], ids=["copy", "free"])
def test_greedy_answers_equal_the_plain_server(stacks: tuple[Stack, Stack], messages: list[dict[str, str]]) -> None:
    plain, spec = stacks
    before = accepted_tokens(spec)
    expected = chat(plain, messages, temperature=0)
    assert chat(spec, messages, temperature=0) == expected
    if messages is COPY:
        assert PARAGRAPH[-80:] in expected[0]  # the model does copy: the case speculation is for
        assert accepted_tokens(spec) - before > 20


def test_seeded_sampling_and_streaming_equal_the_plain_server(stacks: tuple[Stack, Stack]) -> None:
    plain, spec = stacks
    assert chat(spec, COPY, temperature=0.8, seed=5) == chat(plain, COPY, temperature=0.8, seed=5)
    streams = []
    for stack in stacks:
        client = InferenceClient(base_url=stack.url)  # held while its stream is read
        chunks = client.chat_completion(messages=COPY, max_tokens=60, stream=True, temperature=0.0)
        streams.append("".join(chunk.choices[0].delta.content or "" for chunk in chunks))
    assert streams[0] == streams[1] and streams[0]


def test_stop_string_and_tgi_details_inside_an_accepted_run(stacks: tuple[Stack, Stack]) -> None:
    body = {
        "inputs": "Repeat: " + PARAGRAPH + "\nAgain: " + PARAGRAPH[:40],
        "parameters": {"max_new_tokens": 60, "stop": ["library"], "details": True, "decoder_input_details": False},
    }
    answers = [httpx.post(f"{stack.url}/generate", json=body, timeout=120).json() for stack in stacks]
    plain, spec = answers
    assert spec["generated_text"] == plain["generated_text"]
    assert spec["details"]["finish_reason"] == plain["details"]["finish_reason"] == "stop_sequence"
    assert [t["id"] for t in spec["details"]["tokens"]] == [t["id"] for t in plain["details"]["tokens"]]
    for ours, theirs in zip(spec["details"]["tokens"], plain["details"]["tokens"], strict=True):
        assert ours["logprob"] == pytest.approx(theirs["logprob"], abs=1e-4)


def test_info_reports_the_setting(stacks: tuple[Stack, Stack]) -> None:
    assert [httpx.get(f"{stack.url}/info").json()["speculate"] for stack in stacks] == [0, 4]
