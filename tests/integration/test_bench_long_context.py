"""scripts/bench_long_context.py end to end on the tiny llama: tgictl in both KV formats started, loaded with one
client and with a concurrent batch, stopped; every figure present, the decode window inside the load, and
--combine's table with the int8-against-bf16 ratio."""

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


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "scripts/bench_long_context.py", *args], capture_output=True, text=True,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"), cwd=REPO_ROOT, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-4000:]
    return done


def test_script_measures_both_kv_formats_and_combines(tiny_model_dir: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run_script("--servers", "tgictl,tgictl-kv8", "--model", str(tiny_model_dir), "--prompt-len", "48",
               "--new-tokens", "12", "--clients", "3", "--threads", "1", "--kv-cache-memory", "64MiB",
               "--seed", "7", "--json-dir", str(runs))
    for name in ("tgictl", "tgictl-kv8"):
        run = json.loads((runs / f"{name}.json").read_text())
        figures = run["figures"]
        assert run["server"] == name and run["prompt_len"] == 48 and run["clients"] == 3
        assert figures["tokens_1"] == 12 and figures["tokens_n"] == 3 * 12  # ignore_eos: every asked token
        assert figures["ttft_1_s"] > 0 and figures["prefill_1_tok_s"] == pytest.approx(48 / figures["ttft_1_s"])
        assert 0 < figures["ttft_p50_s"] <= figures["ttft_max_s"] < figures["load_n_s"]
        # the window lies inside the load and holds at most the tokens after every stream's first
        assert 0 <= figures["window_s"] < figures["load_n_s"]
        assert 0 <= figures["window_tokens"] <= 3 * (12 - 1)
        assert figures["rss_bytes"] > 0
    assert "--kv-cache-dtype" in json.loads((runs / "tgictl-kv8.json").read_text())["command"]

    table = tmp_path / "table.md"
    done = run_script("--combine", str(runs / "tgictl.json"), str(runs / "tgictl-kv8.json"),
                      "--markdown-out", str(table))
    text = table.read_text()
    assert text in done.stdout
    assert "| tgictl | " in text and "| tgictl-kv8 | " in text
    assert "| tgictl-kv8 / tgictl | TTFT, 1 client |" in text  # the ratio rows where both servers ran
    assert "llama-server" not in text  # no row, no ratio for a server that was not measured
    leftover = subprocess.run(["pgrep", "-f", f"launch.*{tiny_model_dir}"], capture_output=True, text=True)
    assert leftover.stdout == ""  # both servers were stopped
