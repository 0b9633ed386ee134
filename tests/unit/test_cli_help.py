"""`--help` of every command reads at 80 columns: every flag's name appears whole (descriptions wrap,
names never), no line is wider than the terminal, and no word is broken at a hyphen."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

from tgictl.cli import build_app, main

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _isolate_exported_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """main() exports the logging setup for child processes; let monkeypatch undo it after each test."""
    monkeypatch.setenv("TGICTL_LOG_LEVEL", "info")
    monkeypatch.setenv("TGICTL_JSON_OUTPUT", "0")


def _commands() -> dict[str, Any]:
    """The click commands typer builds (its own vendored click in recent versions), by name."""
    return dict(typer.main.get_command(build_app()).commands)  # type: ignore[attr-defined]


def _flags(command: Any) -> list[str]:
    return [name for param in command.params if param.param_type_name == "option"
            for name in (*param.opts, *param.secondary_opts)] + ["-h", "--help"]


def _assert_readable(text: str, flags: list[str], columns: int) -> None:
    for flag in flags:
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), f"{flag} is not whole in:\n{text}"
    for line in text.splitlines():
        assert len(line) <= columns, line
        assert "…" not in line, line
        assert not re.search(r"\w-$", line), f"a word broken at its hyphen: {line!r}"


@pytest.mark.parametrize("name", sorted(_commands()))
@pytest.mark.parametrize("columns", [80, 60])
def test_every_flag_name_is_whole_in_narrow_help(
    name: str, columns: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main([name, "--help"]) == 0
    flags = _flags(_commands()[name])
    assert len(flags) >= 4  # the command's own options besides -h/--help
    _assert_readable(capsys.readouterr().out, flags, columns)


def test_top_level_help_at_80_columns(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    _assert_readable(out, ["--log-level", "--json-output", "--no-json-output", "--version", "--help"], 80)
    for name in _commands():
        assert re.search(rf"^  {name} ", out, re.MULTILINE), name


def test_piped_help_is_the_plain_layout() -> None:
    """Through a pipe (no terminal, no COLUMNS) as `tgictl launch --help | less` gets it."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    result = subprocess.run([sys.executable, "-m", "tgictl", "launch", "--help"], capture_output=True, text=True,
                            env=env, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    _assert_readable(result.stdout, _flags(_commands()["launch"]), 80)
    assert "--max-batch-prefill-tokens" in result.stdout and "╭" not in result.stdout
