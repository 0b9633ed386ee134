"""`tgictl router` flags: bad combinations fail before anything connects; no shard is one clear line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tgictl.cli import main


def test_inconsistent_limits_are_a_usage_error(tiny_tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["router", "--tokenizer-name", str(tiny_tokenizer_dir), "--max-input-tokens", "10",
                 "--max-total-tokens", "10"])
    assert code == 2
    assert "--max-input-tokens (10) must be < --max-total-tokens (10)" in capsys.readouterr().err


def test_missing_shard_is_one_line(tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["router", "--tokenizer-name", str(tiny_model_dir),
                 "--master-shard-uds-path", str(tmp_path / "nothing-0"), "--port", "1"])
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("Error: Could not connect to Text Generation server") and "\n" not in err


def test_help_lists_tgi_router_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["router", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--master-shard-uds-path", "--max-concurrent-requests", "--max-batch-prefill-tokens",
                 "--prefix-caching", "--max-client-batch-size", "--api-key", "--cors-allow-origin",
                 "--payload-limit", "--validation-workers", "--graceful-termination-timeout"):
        assert flag in out, flag
