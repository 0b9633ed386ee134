"""Reasoning through all three chat APIs, on the real router and HTTP app with the fake shard scripted to
write think text whose end tag is split across tokens (`</` `th` `ink>`): chat completions' reasoning_content
and reasoning, Anthropic's thinking block and thinking_delta, the Responses API's reasoning item and
reasoning_text.delta, whole and streamed, agree; `enable_thinking: false` reaches the template."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer

from tgictl.config import RouterConfig
from tgictl.runtime.router.http.app import create_app
from tgictl.runtime.router.service import RouterService
from tgictl.runtime.router.text.tokenizer import RouterTokenizer
from tgictl.testing.fake_shard import FakeServiceClient, fake_info
from tgictl.testing.tiny_thinking import THINKING_VOCAB_SIZE

THINK, ANSWER = "Two and two", "It is four."
MESSAGES = [{"role": "user", "content": "What is 2+2?"}]


def script(model_dir: Path) -> tuple[int, ...]:
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    pieces = [THINK, "</", "th", "ink>", "\n\n", ANSWER]  # the tag spelled in three tokens, not as its own
    ids = [i for piece in pieces for i in tokenizer.encode(piece, add_special_tokens=False).ids]
    return (*ids, tokenizer.token_to_id("<|im_end|>"))


def run(model_dir: Path, scenario: Callable[[httpx.AsyncClient], Awaitable[None]]) -> None:
    async def main() -> None:
        fake = FakeServiceClient(info_reply=replace(fake_info(), vocab_size=THINKING_VOCAB_SIZE))
        prompt = RouterTokenizer(model_dir).apply_chat_template(MESSAGES)
        fake.shard.script = script(model_dir)
        fake.shard.script_prompt_len = len(RouterTokenizer(model_dir).encode(prompt, add_special_tokens=False))
        fake.shard.eos_token = fake.shard.script[-1]
        settings = RouterConfig(master_shard_uds_path="/tmp/x-0", tokenizer_name="m", reasoning_parser="qwen3")
        service = await RouterService.start(settings, model_dir, fake, "tiny")
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(service)),
                                         base_url="http://router", timeout=30) as http:
                await scenario(http)
        finally:
            await service.close()

    asyncio.run(main())


def events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and "[DONE]" not in line]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_completions(thinking_model_dir: Path, stream: bool) -> None:
    async def scenario(http: httpx.AsyncClient) -> None:
        answer = await http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 40, "stream": stream})
        assert answer.status_code == 200, answer.text
        if stream:
            deltas = [c["choices"][0]["delta"] for c in events(answer.text) if c["choices"]]
            reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
            assert reasoning == "".join(d.get("reasoning", "") for d in deltas)
            content = "".join(d.get("content") or "" for d in deltas)
            # The reasoning streamed as it came, token by token, from the first chunk on.
            first = deltas[0].get("reasoning_content", "")
            assert first and THINK.startswith(first) and first != THINK
        else:
            message = answer.json()["choices"][0]["message"]
            reasoning, content = message["reasoning_content"], message["content"]
            assert message["reasoning"] == reasoning
        assert (reasoning, content) == (THINK, ANSWER)

    run(thinking_model_dir, scenario)


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_thinking_blocks(thinking_model_dir: Path, stream: bool) -> None:
    async def scenario(http: httpx.AsyncClient) -> None:
        body = {"model": "tiny", "max_tokens": 40, "messages": MESSAGES, "stream": stream,
                "thinking": {"type": "enabled", "budget_tokens": 1024}}
        answer = await http.post("/v1/messages", json=body)
        assert answer.status_code == 200, answer.text
        if not stream:
            blocks = answer.json()["content"]
            assert blocks == [{"type": "thinking", "thinking": THINK, "signature": ""}, {"type": "text", "text": ANSWER}]
            return
        sent = events(answer.text)
        starts = [e["content_block"]["type"] for e in sent if e["type"] == "content_block_start"]
        thinking = "".join(e["delta"].get("thinking", "") for e in sent if e["type"] == "content_block_delta")
        text = "".join(e["delta"].get("text", "") for e in sent if e["type"] == "content_block_delta")
        assert starts == ["thinking", "text"] and (thinking, text) == (THINK, ANSWER)

    run(thinking_model_dir, scenario)


@pytest.mark.parametrize("stream", [False, True])
def test_responses_reasoning_items(thinking_model_dir: Path, stream: bool) -> None:
    async def scenario(http: httpx.AsyncClient) -> None:
        answer = await http.post("/v1/responses", json={"input": MESSAGES, "stream": stream})
        assert answer.status_code == 200, answer.text
        response = events(answer.text)[-1]["response"] if stream else answer.json()
        reasoning, message = response["output"]
        assert reasoning["type"] == "reasoning" and reasoning["content"][0]["text"] == THINK
        assert message["content"][0]["text"] == ANSWER
        # The think text's tokens and the end tag's: Two, and, two, </, th, ink>.
        assert response["usage"]["output_tokens_details"]["reasoning_tokens"] >= 6
        if stream:
            deltas = [e["delta"] for e in events(answer.text) if e["type"] == "response.reasoning_text.delta"]
            assert "".join(deltas) == THINK

    run(thinking_model_dir, scenario)


def test_template_kwargs_switch_thinking_off(thinking_model_dir: Path) -> None:
    prompt = RouterTokenizer(thinking_model_dir).apply_chat_template(MESSAGES, extra={"enable_thinking": False})
    assert prompt.endswith("<think>\n\n</think>\n\n")

    async def scenario(http: httpx.AsyncClient) -> None:
        body = {"messages": MESSAGES, "max_tokens": 3, "chat_template_kwargs": {"enable_thinking": False}}
        answer = await http.post("/v1/chat/completions", json=body)
        # No reasoning is split off: the answer is the model's text as written (the scripted text, from a
        # later position: the longer prompt moves where the fake shard's script starts).
        message = answer.json()["choices"][0]["message"]
        assert "reasoning_content" not in message and message["content"] in f"{THINK}</think>\n\n{ANSWER}"
        assert message["content"].strip()
        bad = await http.post("/v1/chat/completions", json={**body, "chat_template_kwargs": {"messages": []}})
        assert bad.status_code == 422 and "cannot set messages" in bad.json()["error"]["message"]

    run(thinking_model_dir, scenario)
