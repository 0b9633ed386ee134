"""scripts/bench_1b.py end to end on the tiny llama with `--busy`: tgictl and its before-binding variant each
measured quiet and beside a spinning process, every asked token served, the loaded-over-quiet table, and no
spinner or server left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Benchmark scripts end to end: run by .ci/run after the README's test line (`pytest -m slow`).
pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
HANG_S = 900  # only a hang guard: two tiny servers start in well under a minute each
SPINNER = "while True: pass"  # bench_common.busy_cores' process


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "scripts/bench_1b.py", *args], capture_output=True, text=True,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"), cwd=REPO_ROOT, timeout=HANG_S)


@pytest.fixture
def bench_dir(tiny_model_dir: Path, smollm2_gguf: Path, tmp_path: Path) -> Path:
    """The layout make_bench_models.py writes: hf/ and a GGUF beside it (only llama rows would read the GGUF)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "hf").symlink_to(tiny_model_dir)
    (model / smollm2_gguf.name).symlink_to(smollm2_gguf)
    return model


def test_busy_measures_each_load_quiet_and_shared(bench_dir: Path, tmp_path: Path) -> None:
    rounds_json, table = tmp_path / "round.json", tmp_path / "table.md"
    done = run_script("--model", str(bench_dir), "--servers", "tgictl,tgictl-before", "--clients", "1",
                      "--input-len", "8", "--output-len", "4", "--threads", "1", "--busy", "1",
                      "--no-llama-bench", "--json-out", str(rounds_json), "--markdown-out", str(table))
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-4000:]
    (round_,) = json.loads(rounds_json.read_text())["rounds"]
    for name in ("tgictl", "tgictl-before"):
        assert set(round_[name]) == {"1", "1+1busy"}
        for figures in round_[name].values():
            assert figures["tokens"] == figures["asked"] == 4 and figures["tok_s"] > 0
    text = table.read_text()
    assert "| tgictl | 1+1busy |" in text and "| tgictl-before | 1+1busy |" in text
    share = round_["tgictl"]["1+1busy"]["tok_s"] / round_["tgictl"]["1"]["tok_s"]
    assert f"- tgictl: 1 client(s) +1busy {share:.2f}" in text
    assert subprocess.run(["pgrep", "-f", SPINNER], capture_output=True, text=True).stdout == ""
    assert subprocess.run(["pgrep", "-f", f"launch.*{bench_dir}"], capture_output=True, text=True).stdout == ""


@pytest.mark.parametrize("busy", ["0", "x", "1,-1"])
def test_a_bad_busy_count_is_a_usage_error(bench_dir: Path, busy: str) -> None:
    done = run_script("--model", str(bench_dir), "--servers", "tgictl", "--busy", busy)
    assert done.returncode == 2
    assert "--busy" in done.stderr.splitlines()[-1]
