"""The tiny model's vocabulary as llguidance sees it, and a check that a text follows a grammar."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import llguidance
import pytest
from tokenizers import Tokenizer

from tgictl.runtime.guidance import load_tokenizer

Follows = Callable[[str, str], bool]


@pytest.fixture(scope="session")
def ll_tokenizer(tiny_model_dir: Path) -> llguidance.LLTokenizer:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    return load_tokenizer(tiny_model_dir, config["vocab_size"], (config["eos_token_id"],))


@pytest.fixture(scope="session")
def follows(tiny_model_dir: Path, ll_tokenizer: llguidance.LLTokenizer) -> Follows:
    """follows(grammar, text): the model's tokens of `text` are all allowed and the grammar accepts there."""
    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))

    def check(grammar: str, text: str) -> bool:
        matcher = llguidance.LLMatcher(ll_tokenizer, grammar, log_level=0)
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        return matcher.consume_tokens(ids) and matcher.is_accepting()

    return check
