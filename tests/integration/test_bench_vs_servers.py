"""scripts/bench_vs_servers.py end to end on the tiny llama against tgictl and `transformers serve
--continuous-batching` (both installed here): each server started, loaded, stopped, compared."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_script_compares_servers(tiny_model_dir: Path, tmp_path: Path) -> None:
    output = tmp_path / "servers.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="200")
    done = subprocess.run(
        [sys.executable, "scripts/bench_vs_servers.py", "--servers", "tgictl,transformers-cb", "--model-id",
         str(tiny_model_dir), "--clients", "2", "--requests-per-client", "1", "--input-len", "10",
         "--output-len", "4", "--runs", "1", "--threads", "1", "--dtype", "float32", "--output", str(output)],
        capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-4000:]
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
