"""`tgictl bench --url` against a real router and shard on the tiny llama, run as users run it.

The JSON it writes must add up: every request succeeded, its token counts are the server's own
(usage / details) and equal the tokens streamed, prompts have the exact length the tokenizer
promised, and the run's totals equal the server's /metrics counters over the same run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.http_stack import REPO_ROOT, Stack, http_stack
from tgictl.runtime.bench.server_metrics import parse_samples


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with http_stack(tiny_model_dir, tmp_path_factory.mktemp("bench-http")) as running:
        yield running


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
               HF_HUB_OFFLINE="1", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "tgictl", *args], capture_output=True, text=True, env=env,
                          cwd=REPO_ROOT, timeout=120)


def run_bench(tmp_path: Path, *args: str) -> dict[str, Any]:
    output = tmp_path / "result.json"
    done = bench("bench", *args, "--output", str(output))
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(output.read_text())


def generated_tokens_sum(url: str) -> float:
    return parse_samples(httpx.get(f"{url}/metrics").text)["tgi_request_generated_tokens_sum"]


def check_run(run: dict[str, Any], requests: int, output_len: tuple[int, int]) -> None:
    summary, records = run["summary"], run["requests"]
    assert summary["requests"] == summary["succeeded"] == len(records) == requests
    assert summary["failed"] == 0 and summary["errors"] == {}
    assert [r["index"] for r in records] == list(range(requests))
    for r in records:
        assert r["error"] is None and r["status"] == 200
        assert r["output_tokens_source"] == "server" and r["prompt_tokens_source"] == "server"
        # --ignore-eos: exactly the asked tokens, each streamed as its own event.
        assert r["output_tokens"] == r["max_new_tokens"] == r["stream_events"]
        assert output_len[0] <= r["output_tokens"] <= output_len[1]
        # Per token: one value per token after the first read; per burst: one per read after the first.
        assert len(r["itl_burst_s"]) <= len(r["itl_s"]) <= r["output_tokens"] - 1 and r["itl_burst_s"]
        assert sum(r["itl_s"]) == pytest.approx(sum(r["itl_burst_s"]))  # the same waits, spread or not
        assert 0 < r["ttft_s"] <= r["e2e_s"]
    assert summary["output_tokens"] == sum(r["output_tokens"] for r in records)
    assert summary["prompt_tokens"] == sum(r["prompt_tokens"] for r in records)
    assert summary["ttft_s"]["count"] == requests
    assert summary["itl_s"]["count"] == sum(len(r["itl_s"]) for r in records)
    assert summary["itl_burst_s"]["count"] == sum(len(r["itl_burst_s"]) for r in records)
    assert summary["output_tokens_per_s"] == pytest.approx(summary["output_tokens"] / summary["duration_s"])


def test_tgi_sweep_counts_match_the_server(stack: Stack, tmp_path: Path, tiny_model_dir: Path) -> None:
    before = generated_tokens_sum(stack.url)
    result = run_bench(tmp_path, "--url", stack.url, "--tokenizer", str(tiny_model_dir), "--input-len", "8:24",
                       "--output-len", "2:6", "--num-requests", "6", "--concurrency", "1,3", "--ignore-eos",
                       "--slo", "ttft=30,tpot=30")
    after = generated_tokens_sum(stack.url)
    assert result["mode"] == "http" and [r["plan"]["concurrency"] for r in result["runs"]] == [1, 3]
    for run in result["runs"]:
        check_run(run, 6, (2, 6))
        for r in run["requests"]:  # the tokenizer's exact lengths are what the server counted
            assert r["tokenizer_prompt_tokens"] == r["prompt_tokens"] and 8 <= r["prompt_tokens"] <= 24
        assert run["summary"]["goodput"]["good_requests"] == 6  # generous bounds: everyone is good
        server = run["summary"]["server"]
        assert server["prompt_tokens"] == run["summary"]["prompt_tokens"]
        assert server["kv_blocks_total"] > 0
    assert after - before == sum(run["summary"]["output_tokens"] for run in result["runs"])
    assert "api_key" not in result["config"]


@pytest.mark.parametrize("api", ["openai-completions", "openai-chat"])
def test_openai_apis_count_usage(stack: Stack, tmp_path: Path, api: str) -> None:
    # No --tokenizer: the bench takes the model the server names in /info (here its directory).
    result = run_bench(tmp_path, "--url", stack.url, "--api", api, "--input-len", "10", "--output-len", "3",
                       "--num-requests", "3", "--concurrency", "2", "--ignore-eos")
    (run,) = result["runs"]
    check_run(run, 3, (3, 3))
    for r in run["requests"]:
        if api == "openai-completions":
            assert r["prompt_tokens"] == r["tokenizer_prompt_tokens"] == 10
        else:  # the chat template wraps the 10-token message
            assert r["prompt_tokens"] > 10


def test_shared_prefix_hits_the_prefix_cache(stack: Stack, tmp_path: Path, tiny_model_dir: Path) -> None:
    result = run_bench(tmp_path, "--url", stack.url, "--tokenizer", str(tiny_model_dir), "--workload",
                       "shared-prefix", "--groups", "2", "--prompts-per-group", "3", "--prefix-len", "48",
                       "--input-len", "4", "--output-len", "2", "--ignore-eos", "--concurrency", "1", "--seed", "11")
    (run,) = result["runs"]
    check_run(run, 6, (2, 2))
    assert [r["group"] for r in run["requests"]] == [0, 0, 0, 1, 1, 1]
    server = run["summary"]["server"]
    # One at a time: the 2nd and 3rd prompt of each group find at least the prefix's 3 full blocks.
    assert server["prefix_cache_hit_tokens"] >= 2 * 2 * 48
    assert server["prefix_cache_hit_rate"] == pytest.approx(server["prefix_cache_hit_tokens"] / (6 * 52))


def test_open_loop_and_json_summary_on_stdout(stack: Stack, tiny_model_dir: Path) -> None:
    done = bench("--json-output", "bench", "--url", stack.url, "--tokenizer", str(tiny_model_dir), "--input-len",
                 "6", "--output-len", "2", "--request-rate", "20", "--num-requests", "4", "--ignore-eos")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    (run,) = document["runs"]
    assert run["plan"]["request_rate"] == 20.0 and "requests" not in run  # records only in --output
    assert run["summary"]["succeeded"] == 4 and run["summary"]["output_tokens"] == 8


def test_errors_are_counted_not_raised(stack: Stack, tmp_path: Path, tiny_model_dir: Path) -> None:
    # 600 prompt tokens break the stack's max_total_tokens of 512: every request fails with 422.
    result = run_bench(tmp_path, "--url", stack.url, "--tokenizer", str(tiny_model_dir), "--input-len", "600",
                       "--output-len", "2", "--num-requests", "2")
    summary = result["runs"][0]["summary"]
    assert (summary["succeeded"], summary["failed"]) == (0, 2)
    assert all(r["error"] and r["output_tokens"] == 0 for r in result["runs"][0]["requests"])


def test_bad_flags_exit_2_with_one_line(stack: Stack) -> None:
    for args, message in (
        (["--url", stack.url, "--shard", "/tmp/x"], "exactly one of --url"),
        (["--url", stack.url, "--slo", "ttft=-1"], "--slo ttft must be > 0"),
        (["--url", stack.url, "--workload", "file"], "needs --dataset"),
        (["--url", stack.url, "--concurrency", "1,x"], "--concurrency must be comma-separated"),
        (["--url", "http://127.0.0.1:9", "--tokenizer", "."], "cannot reach --url http://127.0.0.1:9"),
    ):
        done = bench("bench", *args)
        assert done.returncode == 2, done.stderr
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_api_key_reaches_every_call(tiny_model_dir: Path, tmp_path: Path) -> None:
    with http_stack(tiny_model_dir, tmp_path, router_args=["--api-key", "sesame"]) as locked:
        result = run_bench(tmp_path, "--url", locked.url, "--api-key", "sesame", "--input-len", "6",
                           "--output-len", "2", "--num-requests", "2", "--ignore-eos")
        (run,) = result["runs"]
        check_run(run, 2, (2, 2))
        # The served model was found through the protected /info (no --tokenizer given).
        assert all(r["tokenizer_prompt_tokens"] == 6 for r in run["requests"])
        refused = run_bench(tmp_path, "--url", locked.url, "--tokenizer", str(tiny_model_dir), "--input-len", "6",
                            "--output-len", "2", "--num-requests", "2")
        assert refused["runs"][0]["summary"]["failed"] == 2
        assert all(r["status"] == 401 for r in refused["runs"][0]["requests"])


def test_html_report_opens_in_chromium(stack: Stack, tmp_path: Path, tiny_model_dir: Path) -> None:
    from tests.integration.chromium import chromium, probe_page

    chromium()  # skips, saying why, where no browser is installed (unless .ci/run requires one)

    report = tmp_path / "report.html"
    result = run_bench(tmp_path, "--url", stack.url, "--tokenizer", str(tiny_model_dir), "--input-len", "8:16",
                       "--output-len", "4", "--ignore-eos", "--concurrency", "1,4", "--num-requests", "8",
                       "--report", str(report))
    html = report.read_text()
    assert "http://" not in html.replace(stack.url, "").replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "<script" not in html  # nothing to run, nothing to fetch
    page = probe_page(report)
    assert page["external"] == 0 and page["title"] == f"tgictl bench: {stack.url}"
    titles = [c["title"] for c in page["charts"]]
    assert titles[:5] == ["Throughput", "Requests per second", "Time to first token percentiles",
                          "Inter-token latency percentiles", "End-to-end latency percentiles"]
    assert titles[5:] == ["concurrency 1: time to first token", "concurrency 1: inter-token latency",
                          "concurrency 4: time to first token", "concurrency 4: inter-token latency"]
    for chart in page["charts"]:
        assert chart["width"] > 300 and chart["height"] > 200, chart
        assert chart["shapes"] >= 4, chart  # axes and at least two drawn marks
    assert page["tables"] == 3  # figures, settings, the server's /info
    assert result["server_info"]["model_id"] == str(tiny_model_dir)
    assert f"<td>max_total_tokens</td><td>{result['server_info']['max_total_tokens']}</td>" in html
