"""`--lora-adapters` / LORA_ADAPTERS entries: name=PATH or a hub id[@revision]; bad lists are one error."""

from __future__ import annotations

import pytest

from tgictl.config import LoraAdapterSpec, parse_lora_adapters
from tgictl.env import Env
from tgictl.errors import ConfigError


def test_entries_in_order() -> None:
    assert parse_lora_adapters(" sql=/a/sql , org/chat@v2,") == (
        LoraAdapterSpec("sql", "/a/sql"), LoraAdapterSpec("org/chat", "org/chat", "v2")
    )
    assert parse_lora_adapters(None) == () == parse_lora_adapters("")


@pytest.mark.parametrize(("text", "message"), [
    ("=/a", "entries are name=PATH"),
    ("x=", "entries are name=PATH"),
    ("tgi=/a", "'tgi' is reserved for the base model"),
    ("base=/a", "'base' is reserved"),
    ("a=/x,a=/y", "'a' is given twice"),
])
def test_bad_lists_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_lora_adapters(text)


def test_lora_adapters_is_read_from_the_environment() -> None:
    env = Env.from_environ({"HOME": "/h", "LORA_ADAPTERS": "a=/x"})
    assert parse_lora_adapters(env.lora_adapters) == (LoraAdapterSpec("a", "/x"),)
