"""The command line: help tree, global options, bad arguments, error → exit code mapping."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tgictl import __version__
from tgictl.cli import COMMAND_MODULES, main

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_tgictl(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the real entry point (`python -m tgictl`) as a user would."""
    # Start from a neutral logging setup; the caller's `env` may set its own.
    inherited = {k: v for k, v in os.environ.items() if k not in ("TGICTL_LOG_LEVEL", "TGICTL_JSON_OUTPUT", "LOG_LEVEL")}
    full_env = {**inherited, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "tgictl", *args], capture_output=True, text=True, env=full_env, timeout=timeout
    )


@pytest.fixture(autouse=True)
def _isolate_exported_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """main() exports the logging setup for child processes; let monkeypatch undo it after each test."""
    monkeypatch.setenv("TGICTL_LOG_LEVEL", "info")
    monkeypatch.setenv("TGICTL_JSON_OUTPUT", "0")


def test_help_lists_global_options_and_every_registered_command() -> None:
    result = run_tgictl("--help")
    assert result.returncode == 0, result.stderr
    for option in ("--log-level", "--json-output", "--version"):
        assert option in result.stdout
    for module in COMMAND_MODULES:
        assert module.rsplit(".", 1)[1] in result.stdout


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"tgictl {__version__}\n"


def test_unknown_option_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--bogus"]) == 2
    err = capsys.readouterr().err
    assert err == "Error: No such option: --bogus (see 'tgictl --help')\n"


def test_unknown_command_is_one_line_exit_2_without_traceback() -> None:
    result = run_tgictl("frobnicate")
    assert result.returncode == 2
    assert result.stderr == "Error: No such command 'frobnicate'. (see 'tgictl --help')\n"
    assert "Traceback" not in result.stderr


def test_no_arguments_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    captured = capsys.readouterr()
    assert "Usage: tgictl" in captured.out + captured.err
    assert "Error" not in captured.err
