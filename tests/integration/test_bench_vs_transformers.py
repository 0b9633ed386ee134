"""scripts/bench_vs_transformers.py end to end on the tiny llama: it launches tgictl itself, times
both engines on each scenario's workload and prints tgictl's ratio to each transformers mode."""

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

SCENARIOS = {
    "uniform": (["--num-prompts", "3", "--output-len", "5", "--sequential-prompts", "2"],
                {"hf_sequential", "hf_batch", "tgictl_sequential", "tgictl_concurrent", "tgictl_concurrent_shard_share"}),
    "mixed": (["--num-prompts", "5", "--output-len", "2:6", "--concurrency", "2"],
              {"hf_static_batches", "tgictl_concurrent", "tgictl_concurrent_shard_share"}),
    "ttft": (["--input-len", "40"], {"hf", "tgictl"}),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_script_compares_both_engines(scenario: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    output = tmp_path / "vs.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="200")
    extra, modes = SCENARIOS[scenario]
    done = subprocess.run(
        [sys.executable, "scripts/bench_vs_transformers.py", "--scenario", scenario, "--model-id", str(tiny_model_dir),
         "--input-len", "12", *extra, "--runs", "2", "--threads", "1", "--kv-cache-memory", "8MiB", "--dtype",
         "float32", "--output", str(output)],
        capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=HANG_S,
    )
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-4000:]
    result = json.loads(output.read_text())
    assert result["torch_threads"] == 1
    assert set(result["timings_s"]) == modes
    for timings in result["timings_s"].values():
        assert len(timings) == 2 and all(t > 0 for t in timings)
    if scenario != "ttft":  # the shard's forward+sampling is a part of the concurrent run's wall time
        assert all(0 < share < 1 for share in result["timings_s"]["tgictl_concurrent_shard_share"])
        assert "router, IPC, scheduling and idle" in done.stdout
    if scenario == "uniform":
        assert (result["asked_tokens"], result["sequential_tokens"]) == (15, 10)  # 3 x 5 and 2 x 5
        assert "concurrent: tgictl all at once vs static padded batch" in done.stdout
    if scenario == "mixed":
        assert 5 * 2 <= result["asked_tokens"] <= 5 * 6
    if scenario == "ttft":
        assert "time to first token" in done.stdout
