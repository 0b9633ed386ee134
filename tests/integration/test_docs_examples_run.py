"""Every HTTP example of README.md and docs/*.md (a block with a `curl` request or an SDK client) either runs as
written against a real server on a tiny model, or says in the page, where the reader sees it, why it is not run
(`*Not run by the docs tests: REASON.*` just above the block). docs/apis.md's examples have their own test
(test_docs_apis.py).

Running a block: its lines that start a server or write a model (`tgictl launch|shard|router`,
`python scripts/make_tiny_model.py`, `pip install`) are left out (the test's server stands in for them); the
server's address replaces `127.0.0.1:8080` and `localhost:8080`; every `curl` gets `-f` (an HTTP error fails);
bash runs with `-e -o pipefail`. A ```python block runs as a script."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs_examples import PAGES, REPO_ROOT, Block, activated_env, blocks
from tests.integration.http_stack import Stack, http_stack

RUN = "<!-- run -->"
NOT_RUN = re.compile(r"^\*Not run by the docs tests: .{8,}\*\s*$")
_HTTP = re.compile(r"^\s*curl |OpenAI\(|InferenceClient\(|Anthropic\(", re.MULTILINE)
_SETUP = re.compile(r"^\s*(tgictl (launch|shard|router)\b|python3? scripts/make_tiny_model\.py|pip install)")
_PYTHON = re.compile(r"^```python\s*\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks() -> list[Block]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        found += [Block(page, text.count("\n", 0, m.start()) + 1, "python", m[1]) for m in _PYTHON.finditer(text)]
    return found


def marker(block: Block) -> str:
    """`run`, `not run` or `` (unmarked): the nearest non-empty line above the block's fence."""
    above = [line for line in block.page.read_text(encoding="utf-8").splitlines()[:block.line - 1] if line.strip()]
    last = above[-1].strip() if above else ""
    return "run" if last == RUN else "not run" if NOT_RUN.match(last) else ""


HTTP_EXAMPLES = [b for b in (*blocks(), *python_blocks()) if b.page.name != "apis.md" and _HTTP.search(b.text)]
TO_RUN = [b for b in HTTP_EXAMPLES if marker(b) == "run"]


def test_every_http_example_runs_or_says_why_not() -> None:
    unmarked = [b.where for b in HTTP_EXAMPLES if not marker(b)]
    assert not unmarked, f"mark each `{RUN}` or `*Not run by the docs tests: REASON.*`: {unmarked}"
    assert len(TO_RUN) >= 10 and {b.page.name for b in TO_RUN} >= {"README.md", "guided-generation.md"}


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with http_stack(tiny_model_dir, tmp_path_factory.mktemp("docs-examples"),
                    router_args=["--max-total-tokens", "1024"]) as stack:
        yield stack


def runnable(block: Block, address: str) -> str:
    text = block.text.replace("127.0.0.1:8080", address).replace("localhost:8080", address)
    if block.language == "python":
        return text
    lines = [line for line in text.splitlines() if not _SETUP.match(line)]
    return "\n".join(re.sub(r"^(\s*)curl ", r"\1curl -f ", line) for line in lines) + "\n"


@pytest.mark.parametrize("block", TO_RUN, ids=[b.where for b in TO_RUN])
def test_example_runs_as_written(block: Block, server: Stack) -> None:
    code = runnable(block, server.url.removeprefix("http://"))
    command = [sys.executable, "-c", code] if block.language == "python" else ["bash", "-e", "-o", "pipefail", "-c", code]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, env=activated_env())
    assert result.returncode == 0, f"{block.where}\n{code}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    assert result.stdout.strip(), f"{block.where} printed nothing"
