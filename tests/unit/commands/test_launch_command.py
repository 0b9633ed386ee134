"""`tgictl launch` flag handling: every bad value is refused in one line before anything is resolved
or started (the end-to-end runs are in tests/integration/test_launch.py)."""

from __future__ import annotations

import pytest
import typer

from tgictl.cli import main
from tgictl.commands.launch import launch
from tgictl.runtime.launcher.plan import ROUTER_FLAGS


@pytest.fixture(autouse=True)
def _isolate_exported_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """main() exports the logging setup for child processes; let monkeypatch undo it after each test."""
    monkeypatch.setenv("TGICTL_LOG_LEVEL", "info")
    monkeypatch.setenv("TGICTL_JSON_OUTPUT", "0")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--num-shard", "0"], "--num-shard must be >= 1, got 0"),
        (["--dtype", "int4"], "--dtype must be one of float32, bfloat16, float16, got 'int4'"),
        (["--kv-cache-memory", "lots"],
         "--kv-cache-memory must be a size such as 4GiB, 512MiB or 1000000, got 'lots'"),
        (["--port", "0"], "--port must be >= 1, got 0"),
        (["--master-port", "70000"], "--master-port must be in 1 .. 65535, got 70000"),
        (["--max-input-tokens", "10", "--max-total-tokens", "10"],
         "--max-input-tokens (10) must be < --max-total-tokens (10)"),
        (["--graceful-termination-timeout", "-1"], "--graceful-termination-timeout must be >= 0 seconds, got -1.0"),
        (["--model-id", " "], "--model-id must not be empty"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch", *args]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"Error: {message}\n"
    assert captured.out == ""


def test_every_router_option_is_a_launch_option_too() -> None:
    app = typer.Typer()
    app.command()(launch)
    params = typer.main.get_command(app).params
    launch_flags = {opt for param in params if param.param_type_name == "option" for opt in param.opts}
    launcher_owned = {"--master-shard-uds-path", "--tokenizer-name"}
    assert set(ROUTER_FLAGS.values()) - launcher_owned <= launch_flags
    assert {"--num-shard", "--shard-uds-path", "--master-addr", "--master-port", "--dtype", "--block-size",
            "--kv-cache-memory", "--model-id", "--revision"} <= launch_flags
