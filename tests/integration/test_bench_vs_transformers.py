"""scripts/bench_vs_transformers.py end to end on the tiny llama: it launches tgictl itself, times
both engines on one workload and prints tgictl's ratio to each transformers mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_script_compares_both_engines(tiny_model_dir: Path, tmp_path: Path) -> None:
    output = tmp_path / "vs.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="200")
    done = subprocess.run(
        [sys.executable, "scripts/bench_vs_transformers.py", "--model-id", str(tiny_model_dir), "--num-prompts", "3",
         "--input-len", "12", "--output-len", "5", "--runs", "2", "--threads", "1", "--kv-cache-memory", "8MiB",
         "--output", str(output)],
        capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-4000:]
    assert "tgictl / transformers: sequential" in done.stdout
    result = json.loads(output.read_text())
    assert result["torch_threads"] == 1
    assert set(result["timings_s"]) == {"hf_sequential", "hf_batch", "tgictl_sequential", "tgictl_concurrent"}
    for name, timings in result["timings_s"].items():
        assert len(timings) == 2 and all(t > 0 for t in timings)
        # 3 prompts x 5 tokens over the median (of two: their mean) time
        assert result["output_tokens_per_s"][name] == pytest.approx(15 / ((timings[0] + timings[1]) / 2))
