"""`tgictl shard` flag and environment handling that fails before anything is loaded."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tgictl.cli import main


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["shard", *args])
    return code, capsys.readouterr().err


def test_world_size_without_rendezvous_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    code, err = _run(capsys, "--model-id", "/nonexistent", "--uds-path", "/tmp/tgictl-test/server")
    assert code == 2
    assert "MASTER_ADDR and MASTER_PORT must be set when WORLD_SIZE > 1" in err


def test_rank_outside_the_world_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "1")
    code, err = _run(capsys, "--model-id", "/nonexistent")
    assert code == 2
    assert "RANK must be in 0 .. WORLD_SIZE - 1, got RANK=1, WORLD_SIZE=1" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--dtype", "float64"), "--dtype must be one of float32, bfloat16, float16"),
        (("--block-size", "0"), "--block-size must be >= 1"),
        (("--kv-cache-memory", "lots"), "--kv-cache-memory must be a size"),
        (("--uds-path", "relative/server"), "--uds-path must be an absolute path"),
    ],
)
def test_bad_flags_are_usage_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    code, err = _run(capsys, "--model-id", "/nonexistent", *args)
    assert code == 2
    assert message in err


def test_the_cli_has_not_loaded_torch_when_the_shard_sets_openmps_defaults() -> None:
    """libgomp reads GOMP_SPINCOUNT once, when torch loads it: every command module the CLI registers must leave
    torch unimported until `tgictl shard` has set the variable (env.apply_shard_openmp_defaults)."""
    probe = "import sys; from tgictl.cli import build_app; build_app(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
