"""Every `tgictl` command in README.md and docs/*.md names a real subcommand and only flags it has, as the
real click app (tgictl.cli.build_app) declares them; a change of a flag's name fails here until the docs
follow. Global options are checked where they go: before the subcommand."""

from __future__ import annotations

from typing import Any

import pytest
import typer

from tests.docs_examples import Block, blocks, simple_commands, tgictl_commands
from tgictl.cli import build_app

GROUP: Any = typer.main.get_command(build_app())


def _flags(command: Any) -> set[str]:
    return {name for param in command.params if param.param_type_name == "option"
            for name in (*param.opts, *param.secondary_opts)} | {"-h", "--help"}


def _value_options(command: Any) -> set[str]:
    return {name for param in command.params if param.param_type_name == "option" and not param.is_flag
            for name in param.opts}


def check(words: list[str]) -> str | None:
    """What is wrong with one `tgictl ...` command line, or None."""
    index = 1
    while index < len(words) and words[index].startswith("-"):
        flag = words[index].split("=", 1)[0]
        if flag not in _flags(GROUP):
            return f"{flag} is no global option of tgictl"
        index += 2 if flag in _value_options(GROUP) and "=" not in words[index] else 1
    if index == len(words):
        return None  # `tgictl --help`, `tgictl --version`
    name = words[index]
    if name not in GROUP.commands:
        return f"`tgictl {name}`: no such command (commands: {', '.join(GROUP.commands)})"
    command = GROUP.commands[name]
    for word in words[index + 1:]:
        if word == "--":
            break
        if word.startswith("--"):
            flag = word.split("=", 1)[0]
            if flag not in _flags(command):
                return f"`tgictl {name}` has no {flag}"
    return None


EXAMPLES = [(block, words) for block in blocks() for words in tgictl_commands(block)]


def test_the_docs_have_commands_to_check() -> None:
    assert len(EXAMPLES) >= 30
    assert {words[1] for _, words in EXAMPLES if not words[1].startswith("-")} >= {
        "launch", "download", "convert", "profile", "bench", "shard"}


@pytest.mark.parametrize(("block", "words"), EXAMPLES, ids=[f"{b.where}:{w[1]}" for b, w in EXAMPLES])
def test_every_documented_command_and_flag_exists(block: Block, words: list[str]) -> None:
    problem = check(words)
    assert problem is None, f"{block.where}: {' '.join(words)}\n{problem}"


@pytest.mark.parametrize("words", [
    ["tgictl", "lanuch"], ["tgictl", "launch", "--num-shards", "2"], ["tgictl", "launch", "--json-output"],
    ["tgictl", "--jsonoutput", "launch"], ["tgictl", "bench", "--url", "x", "--concurency=4"],
])
def test_a_wrong_command_or_flag_is_caught(words: list[str]) -> None:
    assert check(words) is not None


def test_shell_lines_are_split_as_a_shell_would() -> None:
    assert simple_commands("A=1 tgictl launch --port 1 && curl -sf x | jq . # tgictl nope") == [
        ["A=1", "tgictl", "launch", "--port", "1"], ["curl", "-sf", "x"], ["jq", "."]]
    assert simple_commands("echo \"a && b\"; tgictl profile") == [["echo", "a && b"], ["tgictl", "profile"]]
