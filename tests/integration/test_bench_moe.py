"""scripts/bench_moe.py end to end on a small block: every implementation is timed at each row count, the grouped
path's steps add up, and the active experts are those a batch of that size reaches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Benchmark scripts end to end: run by .ci/run after the README's test line (`pytest -m slow`).
pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
HANG_S = 600  # only a hang guard


def test_script_times_both_layers_and_splits_ours(tmp_path: Path) -> None:
    output = tmp_path / "moe.json"
    done = subprocess.run(
        [sys.executable, "scripts/bench_moe.py", "--hidden", "64", "--intermediate", "32", "--experts", "16",
         "--top-k", "4", "--rows", "1", "8", "--repeats", "3", "--threads", "1", "--json", str(output)],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=HANG_S,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(output.read_text())["results"]
    assert [r["rows"] for r in results] == [1, 8]
    for result in results:
        assert set(result["ms"]) == {"transformers grouped_mm", "transformers eager", "tgictl grouped",
                                     "tgictl reference loop"}
        assert all(value > 0 for value in result["ms"].values())
        assert set(result["breakdown_ms"]) == {"router", "grouping", "experts", "combine"}
        assert result["expert_bytes_read"] == result["active_experts"] * 3 * 64 * 32 * 2
    assert results[0]["active_experts"] == 4  # one row reads its 4 experts only
    assert 4 < results[1]["active_experts"] <= 16
    assert "where the time goes" in done.stdout
