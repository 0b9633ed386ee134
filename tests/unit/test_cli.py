"""The command line: help tree, global options, bad arguments, error → exit code mapping."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tgictl import __version__
from tgictl.cli import COMMAND_MODULES, main
from tgictl.config import SpeculationConfig

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


def test_download_and_convert_are_registered(capsys: pytest.CaptureFixture[str]) -> None:
    assert "tgictl.commands.download" in COMMAND_MODULES
    assert "tgictl.commands.convert" in COMMAND_MODULES
    assert main(["convert", "--help"]) == 0
    out = capsys.readouterr().out
    for option in ("--dtype", "--output", "--force"):
        assert option in out


def test_known_error_is_one_line_with_its_exit_code(tmp_path: Path) -> None:
    result = run_tgictl("convert", str(tmp_path / "absent.gguf"))
    assert result.returncode == 2
    assert result.stderr == f"Error: No such file or directory: {tmp_path / 'absent.gguf'}\n"
    assert result.stdout == ""


def test_known_error_as_json_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["--json-output", "convert", str(tmp_path / "absent.bin")]) == 2
    err = capsys.readouterr().err.strip()
    assert json.loads(err) == {
        "level": "error",
        "error_type": "conversion",
        "message": f"No such file or directory: {tmp_path / 'absent.bin'}",
    }


def test_debug_level_shows_the_traceback(tmp_path: Path) -> None:
    result = run_tgictl("--log-level", "debug", "convert", str(tmp_path / "absent.bin"))
    assert result.returncode == 2
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.splitlines()[-1] == f"Error: No such file or directory: {tmp_path / 'absent.bin'}"


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--log-level", "loud", "convert", "x"], {}, "Error: --log-level must be one of debug, info, warning, error, critical, got 'loud'"),
        (["convert", "x"], {"TGICTL_JSON_OUTPUT": "maybe"}, "Error: TGICTL_JSON_OUTPUT must be a boolean"),
        (["convert", "--dtype", "int4", "x"], {}, "Error: --dtype must be one of float32, bfloat16, float16, got 'int4'"),
        (["convert"], {}, "Error: Missing argument"),
    ],
)
def test_bad_arguments_and_settings_exit_2(
    args: list[str], env: dict[str, str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(message), err
    assert "Traceback" not in err


def test_speculation_flags_and_the_environment_variable_reach_the_shard_config() -> None:
    from tgictl.commands.speculation_options import speculation_config
    from tgictl.env import Env

    env = Env.from_environ({"HOME": "/h", "SPECULATE": "3"})
    assert speculation_config(None, 1, 3, 4, env).tokens == 3  # TGI's SPECULATE when no flag is given
    assert speculation_config(0, 2, 5, 8, env) == SpeculationConfig(tokens=0, ngram_min=2, ngram_max=5, max_batch=8)


def test_a_bad_speculate_value_is_one_line() -> None:
    result = run_tgictl("shard", "--speculate", "17", "--model-id", "/nonexistent")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == ["Error: --speculate must be in 0 .. 16, got 17"]


def test_building_the_cli_leaves_the_benchmark_libraries_unimported() -> None:
    # Every shard and router process builds the whole CLI: the bench command's HTTP client, tokenizer and
    # report libraries (~10 MiB of RSS) load only when `tgictl bench` runs.
    code = (
        "import sys; from tgictl.cli import _RunState, build_app; build_app(_RunState()); "
        "print(sorted(m for m in ('httpx', 'tokenizers', 'jinja2', 'tgictl.runtime.bench.report') if m in sys.modules))"
    )
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                          env=env, cwd=repo)
    assert done.stdout.strip() == "[]"
