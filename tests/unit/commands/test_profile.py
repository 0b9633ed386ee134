"""`tgictl profile`: the report built from described hardware (exact), and the real command line on a
model directory that holds only a config.json (figures that do not depend on this host's hardware)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tgictl.commands.profile import profile_report, read_model_files, render_report
from tgictl.errors import ModelNotFoundError
from tgictl.runtime.host import CpuHost
from tgictl.runtime.profile.budgets import BudgetSettings, compute_budgets
from tgictl.runtime.profile.model_shape import model_shape
from tgictl.runtime.profile.hardware import GpuDevice, Hardware, discover_gpus

REPO = Path(__file__).resolve().parents[3]
GIB = 1 << 30
TINY: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 512,
    "tie_word_embeddings": False, "max_position_embeddings": 256, "torch_dtype": "float32",
}


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 200}))
    return tmp_path


def run_tgictl(*args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env |= extra_env or {}
    return subprocess.run(
        [sys.executable, "-m", "tgictl", *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_read_model_files(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    assert read_model_files(model_dir) == (TINY, 200)
    (model_dir / "tokenizer_config.json").write_text("{not json")
    assert read_model_files(model_dir) == (TINY, None)  # a broken tokenizer file only drops that bound
    empty = tmp_path_factory.mktemp("empty")
    with pytest.raises(ModelNotFoundError, match="has no config.json"):
        read_model_files(empty)
    (empty / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelNotFoundError, match="JSON object"):
        read_model_files(empty)


def test_report_for_two_described_gpus(model_dir: Path) -> None:
    config, tokenizer_max_length = read_model_files(model_dir)
    shape = model_shape(config)
    hardware = Hardware(
        gpus=(GpuDevice(0, "NVIDIA L4", 24 * GIB, 24 * GIB), GpuDevice(1, "NVIDIA L4", 24 * GIB, 24 * GIB)),
        gpu_note="",
        cpu=CpuHost(cores=8, total_memory_bytes=64 * GIB, available_memory_bytes=60 * GIB),
        cpu_matmul=(),
    )
    settings = BudgetSettings(num_shard=2, dtype="bfloat16", kv_cache_memory_bytes=1 << 20)
    budgets = compute_budgets(shape, hardware, settings, tokenizer_max_length)
    report = profile_report("tiny", model_dir, shape, hardware, budgets)
    assert json.loads(json.dumps(report)) == report  # plain JSON all the way down
    assert report["devices"]["gpus"][1] == {
        "index": 1, "name": "NVIDIA L4", "total_memory_bytes": 24 * GIB, "free_memory_bytes": 24 * GIB,
        "dense_16bit_flops": 121e12, "flops_source": "TGI launcher FLOPs table (reference §4.3)",
    }
    assert report["model"]["path"] == str(model_dir) and report["model"]["num_kv_heads"] == 2
    figures = {name: figure["value"] for name, figure in report["budgets"].items()}
    assert figures == {
        "target": "cuda: 2 × NVIDIA L4",
        "dtype": "bfloat16",
        "weight_bytes_per_shard": 139904,  # 69952 parameters per shard (see test_budgets) · 2
        "model_flops_per_token": 163840,
        "attention_heads_per_shard": [2, 2],
        "kv_heads_per_shard": 1,
        "kv_bytes_per_token_per_shard": 128,  # 2 · 2 layers · 1 kv head · 16 · 2 bytes
        "kv_bytes_per_block_per_shard": 2048,
        "windowed_kv_bytes_per_token_per_shard": 128,  # no sliding windows
        "pooled_kv_bytes_per_token_per_shard": 128,  # one layer group: the pool keeps what every layer needs
        "activation_bytes_per_token_per_shard": 640,  # (2·64 + 3·64) · 2
        "device_flops": 242e12,  # 2 × 121 TFLOP/s
        "max_batch_prefill_tokens": 256,  # 242e12 / 163840 ≫ max_position_embeddings 256
        "kv_cache_memory_bytes_per_shard": 1 << 20,  # the flag caps what 24 GiB would allow
        "kv_blocks": 512,  # 1 MiB / 2048
        "max_batch_total_tokens": 8192,
        "max_total_tokens": 200,  # tokenizer_config.json's model_max_length is the tightest bound
        "max_input_tokens": 199,
        "cuda_graphs": [1, 2, 4, 8, 16, 32],
    }
    assert report["problems"] == []


def test_table_for_two_described_gpus(model_dir: Path) -> None:
    config, tokenizer_max_length = read_model_files(model_dir)
    shape = model_shape(config)
    hardware = Hardware(
        gpus=(
            GpuDevice(0, "NVIDIA L4", 24 * GIB, 20 * GIB),
            GpuDevice(1, "NVIDIA GeForce GTX 1080", 8 * GIB, 8 * GIB),
        ),
        gpu_note="",
        cpu=CpuHost(cores=8, total_memory_bytes=64 * GIB, available_memory_bytes=60 * GIB),
        cpu_matmul=(),
    )
    budgets = compute_budgets(shape, hardware, BudgetSettings(num_shard=1), tokenizer_max_length)
    out = io.StringIO()
    render_report(profile_report("tiny", model_dir, shape, hardware, budgets), Console(file=out, width=200))
    lines = out.getvalue().splitlines()
    assert "No GPU" not in out.getvalue()
    row = next(line for line in lines if "NVIDIA L4" in line)
    assert "25,769,803,776 (24.0 GiB)" in row and "21,474,836,480 (20.0 GiB)" in row and "121 TFLOP/s" in row
    row = next(line for line in lines if "GTX 1080" in line)
    assert "unknown" in row and "not in the FLOPs table" in row
    row = next(line for line in lines if "kv_bytes_per_block_per_shard" in line)
    assert "4,096 (4.0 KiB)" in row  # bfloat16 on CUDA: 16 · 2 · 2 · 2 · 16 · 2
    row = next(line for line in lines if "cuda_graphs" in line)
    assert "1, 2, 4, 8, 16, 32" in row


def test_cli_json_output(model_dir: Path) -> None:
    result = run_tgictl(
        "--json-output", "profile", "--model-id", str(model_dir), "--dtype", "float32", "--kv-cache-memory", "1MiB"
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {"model", "devices", "budgets", "problems"}
    figures = {name: figure["value"] for name, figure in report["budgets"].items()}
    # Figures that hold on any host: float32 is forced, the KV budget is given (and on a GPU only caps).
    assert figures["weight_bytes_per_shard"] == 558336  # 139584 parameters · 4
    assert figures["kv_bytes_per_block_per_shard"] == 8192
    assert figures["kv_blocks"] == 128  # 1 MiB / 8192
    assert figures["max_batch_total_tokens"] == 2048
    assert (figures["max_total_tokens"], figures["max_input_tokens"]) == (200, 199)
    assert figures["max_batch_prefill_tokens"] == 256
    assert all(set(figure) == {"value", "source"} and figure["source"] for figure in report["budgets"].values())
    if not report["devices"]["gpus"]:
        assert report["devices"]["gpu_note"]
        assert [m["dtype"] for m in report["devices"]["cpu_matmul"]] == ["float32", "bfloat16"]
        assert figures["cuda_graphs"] == []


def test_cli_quantize_sizes_the_quantized_weights(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    result = run_tgictl(
        "--json-output", "profile", "--model-id", str(model_dir), "--dtype", "float32", "--kv-cache-memory", "1MiB",
        "--quantize", "int8",
    )
    assert result.returncode == 0, result.stderr
    figures = {name: figure["value"] for name, figure in json.loads(result.stdout)["budgets"].items()}
    # float32 scales: q, k, v, gate, up, o read 64 inputs, 57344 · (1 + 4/64) = 60928; down 16384 ·
    # (1 + 4/128) = 16896; embedding and LM head 65536 · (1 + 4/64) = 69632; norms 320 · 4 = 1280
    assert figures["weight_bytes_per_shard"] == 148736
    assert figures["kv_blocks"] == 128  # the KV budget is given: the same blocks as unquantized
    for args, message in [
        (("--quantize-group-size", "32"), "Error: --quantize-group-size needs --quantize int4"),
        (("--quantize", "int3"), "Error: --quantize must be one of int8, int4, got 'int3'"),
    ]:
        result = run_tgictl("profile", "--model-id", str(model_dir), *args)
        assert result.returncode != 0
        assert result.stderr.strip() == message


def test_cli_gguf_model_sizes_its_file_and_refuses_quantize(tmp_path_factory: pytest.TempPathFactory) -> None:
    from tgictl.runtime.gguf_reader import read_gguf
    from tgictl.testing.tiny_gguf import every_projection, write_tiny_gguf

    root = tmp_path_factory.mktemp("gguf-profile")
    gguf = write_tiny_gguf(root / "tiny-q4_0.gguf", "llama", types=every_projection("Q4_0"))
    env = {"TGICTL_CACHE_DIR": str(root / "cache")}
    result = run_tgictl("--json-output", "profile", "--model-id", str(gguf), "--kv-cache-memory", "64MiB", extra_env=env)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)["budgets"]
    assert figures["weight_bytes_per_shard"]["value"] == sum(t.nbytes for t in read_gguf(gguf).tensors.values())
    assert "GGUF" in figures["weight_bytes_per_shard"]["source"]
    result = run_tgictl("profile", "--model-id", str(gguf), "--quantize", "int4", extra_env=env)
    assert result.returncode != 0
    assert result.stderr.strip().startswith("Error: --quantize applies to safetensors models; tiny-q4_0.gguf")
    assert len(result.stderr.strip().splitlines()) == 1


def test_cli_table_then_exit_code_for_a_setup_that_would_not_start(model_dir: Path) -> None:
    # 64 KiB holds 8 blocks = 128 tokens: --max-total-tokens 150 cannot be served
    result = run_tgictl(
        "profile", "--model-id", str(model_dir), "--dtype", "float32", "--kv-cache-memory", "64KiB",
        "--max-total-tokens", "150",
    )
    assert result.returncode == 2
    assert "max_batch_total_tokens" in result.stdout and "kv_bytes_per_block_per_shard" in result.stdout
    if not discover_gpus().devices:
        assert "No GPU" in result.stdout and "sizing for the CPU" in result.stdout
    error_lines = result.stderr.strip().splitlines()
    assert len(error_lines) == 1
    assert "Not enough memory to handle --max-total-tokens 150: the KV cache holds 128 tokens" in error_lines[0]


def test_cli_errors_are_one_line(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    empty = tmp_path_factory.mktemp("no-config")
    result = run_tgictl("profile", "--model-id", str(empty))
    assert result.returncode == 2
    assert result.stderr.strip() == f"Error: {empty} has no config.json; it is not a model directory"
    result = run_tgictl("profile", "--model-id", str(model_dir), "--num-shard", "5")
    assert result.returncode == 2
    assert result.stderr.strip() == "Error: 5 shards are more than the model's 4 attention heads: every shard needs one"


def test_cli_measure_loads_the_model_and_runs_the_warmup_probe(tiny_model_dir: Path) -> None:
    result = run_tgictl(
        "--json-output", "profile", "--model-id", str(tiny_model_dir), "--dtype", "float32",
        "--kv-cache-memory", "2MiB", "--max-batch-prefill-tokens", "512", "--measure",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    measured = report["measured"]
    pairs = {name: (row["estimate"], row["measured"]) for name, row in measured.items()}
    # The same 2 MiB budget on both sides: 2 MiB // 8192 bytes per block (2 layers · 2 kv heads · 16 · 4
    # bytes · K,V · 16 tokens) = 256 blocks, block 0 included; one request gets the other 255, then the
    # tiny model's 2048 positions bound it.
    assert pairs["kv_blocks"] == (256, 256)
    assert pairs["max_batch_total_tokens"] == (4096, 4096)
    assert pairs["max_total_tokens"] == (2048, 2048)
    assert pairs["max_input_tokens"] == (2047, 2047)
    assert pairs["max_batch_prefill_tokens"] == (512, 512)  # the router's probe holds exactly that many
    for name in ("load_seconds", "warmup_seconds", "probe_forward_seconds", "prefill_tokens_per_s"):
        estimate, value = pairs[name]
        assert estimate is None and value > 0, name
    seconds = measured["probe_forward_seconds"]["measured"]
    assert measured["prefill_tokens_per_s"]["measured"] == pytest.approx(512 / seconds)
    # torch, the model and a 2 MiB cache: more than 50 MiB resident, and not the whole machine
    assert 50 << 20 < pairs["peak_rss_bytes"][1] < report["devices"]["cpu"]["total_memory_bytes"]
    if not report["devices"]["gpus"]:
        assert pairs["peak_device_bytes"] == (None, None)
    assert all(row["source"] for row in measured.values())


def test_table_is_readable_at_80_columns(model_dir: Path) -> None:
    config, tokenizer_max_length = read_model_files(model_dir)
    shape = model_shape(config)
    hardware = Hardware(gpus=(), gpu_note="NVML unavailable: test host",
                        cpu=CpuHost(cores=2, total_memory_bytes=8 * GIB, available_memory_bytes=6 * GIB),
                        cpu_matmul=())
    report = profile_report("tiny", model_dir, shape, hardware, compute_budgets(shape, hardware, BudgetSettings(),
                                                                               tokenizer_max_length))
    out = io.StringIO()
    render_report(report, Console(file=out, width=80))
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text  # nothing truncated: every source is there in full, wrapped
    words = " ".join(text.replace("│", " ").split())
    for figure in report["budgets"].values():
        assert " ".join(figure["source"].split()) in words, figure["source"]


def test_cli_measure_table(tiny_model_dir: Path) -> None:
    result = run_tgictl(
        "profile", "--model-id", str(tiny_model_dir), "--dtype", "float32", "--kv-cache-memory", "2MiB",
        "--max-batch-prefill-tokens", "64", "--measure",
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    title = next(i for i, line in enumerate(lines) if "Measured (model loaded, the router's warmup probe run)" in line)
    row = next(line for line in lines[title:] if line.startswith("│ kv_blocks"))
    assert row.count("│ 256 ") == 2  # estimate and measurement side by side
    assert max(len(line) for line in lines) <= 80  # piped: rich's 80 columns, nothing cut


def test_cli_measure_needs_one_shard(tiny_model_dir: Path) -> None:
    result = run_tgictl("profile", "--model-id", str(tiny_model_dir), "--num-shard", "2", "--measure")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "Error: --measure loads the model in this process as a single shard, so it needs --num-shard 1 (got 2); "
        "the estimates alone are available for 2 shards"
    )


def test_cli_reads_cuda_visible_devices(model_dir: Path) -> None:
    result = run_tgictl("profile", "--model-id", str(model_dir), extra_env={"CUDA_VISIBLE_DEVICES": "0;1"})
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "Error: CUDA_VISIBLE_DEVICES must be a comma-separated list of GPU indices such as 0,1, got '0;1'"
    )
    # "" hides every GPU from CUDA, so profile sizes for the CPU even on a GPU host
    result = run_tgictl("--json-output", "profile", "--model-id", str(model_dir), "--dtype", "float32",
                        extra_env={"CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["devices"]["gpus"] == []
    assert report["budgets"]["target"]["value"].startswith("cpu: ")


def test_cli_measure_failure_still_prints_the_estimates(model_dir: Path) -> None:
    result = run_tgictl(
        "--json-output", "profile", "--model-id", str(model_dir), "--dtype", "float32", "--kv-cache-memory", "1MiB",
        "--measure",
    )
    assert result.returncode == 2
    report = json.loads(result.stdout)  # a config.json alone: estimates yes, a measurement no
    assert report["budgets"]["kv_blocks"]["value"] == 128 and "measured" not in report
    message = f"no *.safetensors files in {model_dir} (convert .bin/.pt or GGUF checkpoints first)"
    assert report["measure_error"] == message
    assert json.loads(result.stderr.strip().splitlines()[-1])["message"] == message
