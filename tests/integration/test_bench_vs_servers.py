"""scripts/bench_vs_servers.py end to end on the tiny llama against tgictl and `transformers serve
--continuous-batching` (both installed here): each server started, loaded, stopped, compared."""

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
# Only a hang guard: `transformers serve` alone takes a minute and 8 GB here, far longer on a loaded machine.
HANG_S = 1800


def run_script(model_dir: Path, output: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The script on tiny requests (10 prompt tokens, 4 new, float32, one thread); it must succeed."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="200")
    done = subprocess.run(
        [sys.executable, "scripts/bench_vs_servers.py", "--model-id", str(model_dir), "--input-len", "10",
         "--output-len", "4", "--threads", "1", "--dtype", "float32", "--output", str(output), *args],
        capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=HANG_S,
    )
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-4000:]
    return done


def test_script_compares_servers(tiny_model_dir: Path, tmp_path: Path) -> None:
    output = tmp_path / "servers.json"
    done = run_script(tiny_model_dir, output, "--servers", "tgictl,transformers-cb", "--clients", "2",
                      "--requests-per-client", "1", "--runs", "1")
    result = json.loads(output.read_text())
    assert set(result["runs"]) == {"tgictl", "transformers-cb"}
    for runs in result["runs"].values():
        (run,) = runs
        # every asked token arrived: ignore_eos for tgictl, EOS banned by logit_bias for transformers
        assert run["output_tokens"] == run["asked_tokens"] == 8
        assert run["output_tokens_per_s"] > 0 and run["ttft_p50_s"] > 0
    assert "this / tgictl" in done.stdout  # no llama-server here: every row against the first tgictl row
    leftover = subprocess.run(["pgrep", "-f", f"serve.*{tiny_model_dir}"], capture_output=True, text=True)
    assert leftover.stdout == ""  # both servers were stopped


def test_interleaved_runs_go_round_the_servers(tiny_model_dir: Path, tmp_path: Path) -> None:
    output = tmp_path / "servers.json"
    done = run_script(tiny_model_dir, output, "--servers", "tgictl,tgictl-int8", "--clients", "1",
                      "--requests-per-client", "1", "--runs", "2", "--interleave")
    runs = json.loads(output.read_text())["runs"]
    assert {name: len(r) for name, r in runs.items()} == {"tgictl": 2, "tgictl-int8": 2}
    order = [line.split(":")[0] for line in done.stdout.splitlines() if " run " in line and "/2:" in line]
    assert order == ["tgictl run 1/2", "tgictl-int8 run 1/2", "tgictl run 2/2", "tgictl-int8 run 2/2"]
    assert "round 1: tgictl" in done.stdout and "round 2: tgictl" in done.stdout
    leftover = subprocess.run(["pgrep", "-f", f"launch.*{tiny_model_dir}"], capture_output=True, text=True)
    assert leftover.stdout == ""  # both servers were stopped
