"""Every example of docs/apis.md marked `<!-- run -->` runs as written (curl, the `anthropic` SDK, the `openai`
SDK) against a real server, as the page's launch lines start them: the tiny llama with --allow-lora-loading
for `<!-- run -->`, the tiny reasoning model with --reasoning-parser qwen3 for `<!-- run: reasoning -->`. Two
things are substituted: the server's address for `localhost:8080`, and a random PEFT adapter made for the
tiny llama for `/srv/adapters/sql`. The examples run in the page's order (the adapter one loads, uses and
unloads)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs_examples import activated_env
from tests.integration.http_stack import REPO_ROOT, Stack, http_stack
from tests.lora_adapters import write_random_adapter

PAGE = REPO_ROOT / "docs" / "apis.md"
EXAMPLE = re.compile(r"<!-- run(: reasoning)? -->\n```(bash|python)\n(.*?)```", re.DOTALL)
ADAPTER_PATH = "/srv/adapters/sql"


def examples() -> list[tuple[bool, str, str]]:
    """(for the reasoning server, language, code) of every example to run, in the page's order."""
    return [(bool(m[1]), m[2], m[3]) for m in EXAMPLE.finditer(PAGE.read_text(encoding="utf-8"))]


@pytest.fixture(scope="module")
def servers(tiny_model_dir: Path, thinking_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[dict[bool, Stack]]:
    """{False: the plain server, True: the reasoning one}."""
    limits = ["--max-total-tokens", "1024"]
    with http_stack(tiny_model_dir, tmp_path_factory.mktemp("docs-plain"),
                    router_args=["--allow-lora-loading", *limits]) as plain:
        with http_stack(thinking_model_dir, tmp_path_factory.mktemp("docs-reasoning"),
                        router_args=["--reasoning-parser", "qwen3", *limits]) as reasoning:
            yield {False: plain, True: reasoning}


@pytest.fixture(scope="module")
def adapter(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_adapter(tiny_model_dir, tmp_path_factory.mktemp("docs-adapter") / "sql", rank=4, seed=5)


def test_the_page_has_examples_of_every_kind() -> None:
    code = "\n".join(text for _, _, text in examples())
    assert {kind for _, kind, _ in examples()} == {"bash", "python"}
    assert {reasoning for reasoning, _, _ in examples()} == {False, True}
    for needle in ("import anthropic", "from openai import OpenAI", "curl -sf localhost:8080/v1/messages",
                   "/v1/responses", "/v1/load_lora_adapter", "max_reasoning_tokens", "previous_response_id"):
        assert needle in code, needle


@pytest.mark.parametrize("index", range(len(examples())))
def test_example_runs_as_written(index: int, servers: dict[bool, Stack], adapter: Path) -> None:
    reasoning, kind, code = examples()[index]
    stack = servers[reasoning]
    code = code.replace("localhost:8080", stack.url.removeprefix("http://")).replace(ADAPTER_PATH, str(adapter))
    command = ["bash", "-euo", "pipefail", "-c", code] if kind == "bash" else [sys.executable, "-c", code]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False, env=activated_env())
    assert done.returncode == 0, f"example {index} ({kind}) failed:\n{code}\n--- stderr ---\n{done.stderr[-3000:]}"
    assert done.stdout.strip(), f"example {index} printed nothing"
