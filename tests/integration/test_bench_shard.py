"""`tgictl bench --shard` against a real `tgictl shard` process on the tiny llama: static batches
straight through gRPC, every batch size measured, figures consistent with one another."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from http_stack import stop_process

REPO_ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, HF_HUB_OFFLINE="1", COLUMNS="200")


@pytest.fixture(scope="module")
def shard_socket(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    work = tmp_path_factory.mktemp("bench-shard")
    uds = Path("/tmp") / f"tgictl-bench-{os.getpid()}" / "s"
    log = (work / "shard.log").open("wb")
    shard = subprocess.Popen(
        [sys.executable, "-m", "tgictl", "shard", "--model-id", str(tiny_model_dir), "--uds-path", str(uds),
         "--kv-cache-memory", "1MiB", "--dtype", "float32"],  # the block arithmetic below is float32's
        stdout=log, stderr=subprocess.STDOUT, env=_env(), cwd=REPO_ROOT,
    )
    socket_path = Path(f"{uds}-0")
    try:
        deadline = time.monotonic() + 90
        while not socket_path.exists():
            if shard.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((work / "shard.log").read_text(errors="replace")[-4000:])
            time.sleep(0.1)
        yield socket_path
    finally:
        stop_process(shard)
        log.close()
        shutil.rmtree(uds.parent, ignore_errors=True)  # the temp dir stays as clean as it was


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tgictl", "bench", *args], capture_output=True, text=True,
                          env=_env(), cwd=REPO_ROOT, timeout=120)


def test_static_batches_through_grpc(shard_socket: Path, tmp_path: Path) -> None:
    output = tmp_path / "shard.json"
    done = bench("--shard", str(shard_socket), "--batch-size", "1,3", "--sequence-length", "20",
                 "--decode-length", "3", "--runs", "3", "--warmups", "1", "--output", str(output))
    assert done.returncode == 0, done.stderr + done.stdout
    assert "prefill latency p50 ms" in done.stdout and "batch 3" in done.stdout
    document = json.loads(output.read_text())
    assert document["mode"] == "shard" and document["info"]["model_type"] == "llama"
    assert [b["batch_size"] for b in document["batches"]] == [1, 3]
    for figures in document["batches"]:
        size = figures["batch_size"]
        assert figures["prefill_latency"]["count"] == 3  # warm-up runs are not measured
        assert figures["decode_token_latency"]["count"] == 3 * 3
        assert figures["decode_total_latency"]["count"] == 3
        assert len(figures["prefill_s"]) == 3 and [len(run) for run in figures["decode_steps_s"]] == [3, 3, 3]
        assert figures["decode_total_latency"]["mean"] == pytest.approx(sum(map(sum, figures["decode_steps_s"])) / 3)
        prefill = figures["prefill_latency"]
        assert prefill["p50"] <= prefill["p90"] <= prefill["p99"]
        # Throughput is tokens / latency per sample; with an odd count the median is one sample, so the
        # median throughput is tokens over the median latency.
        assert figures["prefill_throughput"]["p50"] == pytest.approx(size * 20 / figures["prefill_latency"]["p50"])
        assert figures["decode_throughput"]["p50"] == pytest.approx(size / figures["decode_token_latency"]["p50"])


def test_a_batch_beyond_the_kv_cache_is_refused(shard_socket: Path) -> None:
    # 1 MiB holds 128 blocks of the tiny llama; two requests of ceil(1020 / 16) = 64 blocks do not fit.
    done = bench("--shard", str(shard_socket), "--batch-size", "2", "--sequence-length", "20",
                 "--decode-length", "1000", "--runs", "1")
    assert done.returncode == 2
    assert "batch size 2 needs 129 KV blocks (block 0 included) but the shard holds 128" in done.stderr
    done = bench("--shard", str(shard_socket), "--batch-size", "1", "--sequence-length", "20",
                 "--decode-length", "100000", "--runs", "1")
    assert done.returncode == 2 and "exceeds the model's max_position_embeddings" in done.stderr
