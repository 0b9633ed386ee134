"""Budget arithmetic checked against numbers worked out by hand (the arithmetic is in the comments).

Hardware is described, not discovered: every test builds the `Hardware` it wants (fake GPUs by NVML
name, or a CPU host with a fixed matmul rate), so the figures are exact on any machine."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tgictl.errors import ConfigError, UnsupportedModelError
from tgictl.quantization import QuantizeSpec
from tgictl.runtime.host import CpuHost
from tgictl.runtime.profile.budgets import BudgetSettings, compute_budgets
from tgictl.runtime.profile.model_shape import model_flops_per_token, model_shape, parameters_per_shard
from tgictl.runtime.profile.hardware import GpuDevice, Hardware, MatmulMeasurement

GIB = 1 << 30
MIB = 1 << 20

TINY: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 512,
    "tie_word_embeddings": False, "max_position_embeddings": 256, "torch_dtype": "float32",
}
SMOLLM2: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152,
    "tie_word_embeddings": True, "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
}


def cpu_hardware(f32: float = 1e11, bf16: float = 2e11, native_bf16: bool = False) -> Hardware:
    """A CPU host: 4 cores, 8 GiB available, fixed matmul rates."""
    return Hardware(
        gpus=(),
        gpu_note="NVML unavailable: test host",
        cpu=CpuHost(cores=4, total_memory_bytes=16 * GIB, available_memory_bytes=8 * GIB, native_bf16=native_bf16),
        cpu_matmul=(
            MatmulMeasurement("float32", f32, 512, 10, 0.1),
            MatmulMeasurement("bfloat16", bf16, 512, 10, 0.1),
        ),
    )


def gpu_hardware(name: str, count: int, total: int, free: int | None = None) -> Hardware:
    gpus = tuple(GpuDevice(i, name, total, total if free is None else free) for i in range(count))
    cpu = CpuHost(cores=4, total_memory_bytes=16 * GIB, available_memory_bytes=8 * GIB)
    return Hardware(gpus=gpus, gpu_note="", cpu=cpu, cpu_matmul=())


def values(budgets: Any) -> dict[str, Any]:
    return {key: item["value"] for key, item in budgets.to_dict().items() if key != "problems"}


# --- shape and per-model figures ---------------------------------------------------------------------
def test_tiny_parameters_and_flops() -> None:
    shape = model_shape(TINY)
    # per layer: q 64·64 = 4096, k 64·32 = 2048, v 2048, o 4096 → 12288; MLP 3·64·128 = 24576; norms 128
    # → 36992 · 2 layers = 73984; embedding 512·64 = 32768, untied head 32768, final norm 64 → 139584
    assert parameters_per_shard(shape, 1) == 139584
    # 2 shards: q 64·32, k and v 64·16 each, o 32·64 → 6144; MLP 3·64·64 = 12288; norms 128 → 18560 · 2
    # = 37120; vocab 256·64 = 16384 for the embedding and again for the head; final norm 64 → 69952
    assert parameters_per_shard(shape, 2) == 69952
    # TGI: per layer 2·64·16·(3·4 + 2·2) = 32768 (q, k, v, attn, o) + 2·3·64·128 = 49152 → 81920 · 2
    assert model_flops_per_token(shape) == 163840


def test_smollm2_parameters_match_the_published_count() -> None:
    shape = model_shape(SMOLLM2)
    # per layer: q 576·576 = 331776, k = v = 576·192 = 110592, o 331776; MLP 3·576·1536 = 2654208;
    # norms 1152 → 3540096 · 30 = 106202880; tied embedding 49152·576 = 28311552; final norm 576
    assert parameters_per_shard(shape, 1) == 134515008  # SmolLM2-135M's own parameter count
    # per layer 2·576·64·(3·9 + 2·3) = 2433024 + 2·3·576·1536 = 5308416 → 7741440 · 30
    assert model_flops_per_token(shape) == 232243200


def test_vlm_config_reads_text_config_and_moe_counts_experts() -> None:
    vlm = model_shape({"model_type": "llava", "vision_config": {}, "text_config": dict(TINY)})
    assert vlm.is_vlm and vlm.hidden_size == 64 and vlm.num_layers == 2
    moe = model_shape(TINY | {"num_local_experts": 4, "num_experts_per_tok": 2})
    # MLP FLOPs follow the 2 routed experts: 2·3·64·128·2 = 98304, the router 2·64·4 = 512, attention 32768
    # → 131584 · 2
    assert model_flops_per_token(moe) == 263168
    # every expert's weights are resident: MLP 3·64·128·4 = 98304 + router 64·4 = 256 per layer
    assert parameters_per_shard(moe, 1) == 139584 + 2 * (98304 - 24576 + 256)


def test_qwen3_moe_dense_layers_have_their_own_width() -> None:
    """mlp_only_layers and decoder_sparse_step leave layers with the dense MLP of intermediate_size; the sparse
    ones hold every expert of moe_intermediate_size (and a router), and a token computes top_k of them."""
    config = TINY | {"model_type": "qwen3_moe", "num_hidden_layers": 4, "num_experts": 8, "num_experts_per_tok": 2,
                     "moe_intermediate_size": 32, "mlp_only_layers": [0], "decoder_sparse_step": 2}
    shape = model_shape(config)
    assert (shape.sparse_layers, shape.dense_mlp_layers, shape.intermediate_size) == (2, 2, 32)  # layers 1 and 3
    attention = 2 * 64 * 16 * (3 * 4 + 2 * 2)
    assert model_flops_per_token(shape) == (4 * attention + 2 * (2 * 3 * 64 * 32 * 2 + 2 * 64 * 8)
                                            + 2 * 2 * 3 * 64 * 128)
    dense = model_shape(TINY | {"model_type": "qwen3", "num_hidden_layers": 4})  # the same layers, dense MLPs of 128
    experts_minus_dense = 2 * (3 * 64 * 32 * 8 + 64 * 8 - 3 * 64 * 128)
    assert parameters_per_shard(shape, 1) == parameters_per_shard(dense, 1) + experts_minus_dense
    # Two shards: every expert's 32 features split 16 + 16, the dense layers' 128 as 64 + 64.
    assert parameters_per_shard(shape, 2) - parameters_per_shard(dense, 2) == 2 * (3 * 64 * 16 * 8 + 64 * 8
                                                                                    - 3 * 64 * 64)


def test_missing_or_bad_fields_are_named() -> None:
    with pytest.raises(ConfigError, match="config.json lacks num_hidden_layers / n_layer"):
        model_shape({k: v for k, v in TINY.items() if k != "num_hidden_layers"})
    with pytest.raises(ConfigError, match="hidden_size must be a non-negative integer, got '64'"):
        model_shape(TINY | {"hidden_size": "64"})
    with pytest.raises(ConfigError, match="num_key_value_heads must be positive"):
        model_shape(TINY | {"num_key_value_heads": 0})


# --- CPU hosts ---------------------------------------------------------------------------------------
def test_tiny_on_cpu() -> None:
    budgets = compute_budgets(model_shape(TINY), cpu_hardware(), BudgetSettings())
    assert values(budgets) == {
        "target": "cpu: 4 cores, 8.0 GiB available",
        "dtype": "float32",
        "weight_bytes_per_shard": 558336,  # 139584 · 4
        "model_flops_per_token": 163840,
        "attention_heads_per_shard": [4],
        "kv_heads_per_shard": 2,
        "kv_bytes_per_token_per_shard": 512,  # 2 · 2 layers · 2 kv heads · 16 · 4 bytes
        "kv_bytes_per_block_per_shard": 8192,  # 16 · 512
        "windowed_kv_bytes_per_token_per_shard": 512,  # no sliding windows
        "pooled_kv_bytes_per_token_per_shard": 512,
        "activation_bytes_per_token_per_shard": 2048,  # (2·64 + 3·128) · 4
        "device_flops": 1e11,  # the float32 measurement (no native bf16 on this host)
        # 1e11 / 163840 = 610351 → clamped to max_position_embeddings 256 (RAM would allow
        # (8 GiB · 0.95 − 558336) / (512 + 2048) = 3187452)
        "max_batch_prefill_tokens": 256,
        "kv_cache_memory_bytes_per_shard": 2 * GIB,  # min(25% of 8 GiB, 4 GiB)
        "kv_blocks": 262144,  # 2 GiB / 8192
        "max_batch_total_tokens": 4194304,  # 262144 · 16
        "max_total_tokens": 256,  # min(4194304, max_position_embeddings 256)
        "max_input_tokens": 255,
        "cuda_graphs": [],
    }
    assert budgets.problems == ()
    assert budgets.target.source == "no GPU (NVML unavailable: test host)"
    assert "clamped to max_position_embeddings" in budgets.max_batch_prefill_tokens.source
    assert json.loads(json.dumps(budgets.to_dict())) == budgets.to_dict()


def test_smollm2_on_cpu() -> None:
    hardware = cpu_hardware(native_bf16=True)
    budgets = compute_budgets(model_shape(SMOLLM2), hardware, BudgetSettings(), tokenizer_max_length=None)
    assert budgets.dtype.source == "shard default: bfloat16 on a CPU with native bf16 math (AVX512-BF16/AMX)"
    got = values(budgets)
    assert got["weight_bytes_per_shard"] == 269030016  # 134515008 · 2 (bfloat16)
    assert got["kv_bytes_per_token_per_shard"] == 23040  # 2 · 30 · 3 · 64 · 2
    assert got["kv_bytes_per_block_per_shard"] == 368640  # 16 · 23040
    assert got["activation_bytes_per_token_per_shard"] == 11520  # (2·576 + 3·1536) · 2
    assert got["device_flops"] == 2e11  # the bfloat16 measurement
    # What the launch uses, whatever the measured rate: TGI's FLOPs rule (int(2e11 / 232243200) = 861)
    # is only named in the source.
    assert got["max_batch_prefill_tokens"] == 4096
    assert budgets.max_batch_prefill_tokens.source == (
        "router default 4096 (TGI's FLOPs rule would give 861; tgictl does not use it)")
    assert got["kv_blocks"] == 5825  # 2147483648 // 368640 (5825 · 368640 = 2147328000)
    assert got["max_batch_total_tokens"] == 93200  # 5825 · 16
    assert got["max_total_tokens"] == 8192  # max_position_embeddings
    assert got["max_input_tokens"] == 8191
    assert budgets.problems == ()


@pytest.mark.parametrize(("kv_cache_dtype", "kv_token", "kv_blocks"), [
    ("auto", 23040, 5825),  # 2 · 30 · 3 · 64 · 2 (bf16)
    ("int8", 11880, 11297),  # 2 · 30 · 3 · (64 + a 2-byte scale): 1.94x the blocks in the same 2 GiB
    ("fp8_e4m3fn", 11520, 11650),  # 2 · 30 · 3 · 64, no scale
])
def test_the_kv_cache_dtype_sets_the_bytes_per_token_and_the_blocks(kv_cache_dtype: str, kv_token: int,
                                                                   kv_blocks: int) -> None:
    settings = BudgetSettings(kv_cache_dtype=kv_cache_dtype)
    got = values(compute_budgets(model_shape(SMOLLM2), cpu_hardware(native_bf16=True), settings))
    assert got["kv_bytes_per_token_per_shard"] == kv_token
    assert got["kv_blocks"] == kv_blocks == 2 * GIB // (16 * kv_token)
    assert got["max_batch_total_tokens"] == 16 * kv_blocks


def test_the_prefill_budget_does_not_follow_the_measured_rate() -> None:
    slow = compute_budgets(model_shape(SMOLLM2), cpu_hardware(bf16=2e10, native_bf16=True), BudgetSettings())
    fast = compute_budgets(model_shape(SMOLLM2), cpu_hardware(bf16=8e11, native_bf16=True), BudgetSettings())
    assert slow.max_batch_prefill_tokens.value == fast.max_batch_prefill_tokens.value == 4096


def test_three_cpu_shards_share_the_host_budget() -> None:
    budgets = compute_budgets(model_shape(SMOLLM2), cpu_hardware(native_bf16=True), BudgetSettings(num_shard=3))
    got = values(budgets)
    # 9 heads / 3 = 3 q heads, 3 kv heads / 3 = 1 per shard; per layer q 576·192 = 110592,
    # k = v = 576·64 = 36864, o 110592, MLP 3·576·512 = 884736, norms 1152 → 1180800 · 30 = 35424000;
    # vocab 16384·576 = 9437184 (tied); final norm 576 → 44861760 · 2 bytes
    assert got["weight_bytes_per_shard"] == 89723520
    assert got["kv_heads_per_shard"] == 1
    assert got["kv_bytes_per_block_per_shard"] == 122880  # 16 · 2 · 30 · 1 · 64 · 2
    # every shard applies the CPU rule itself (as the shard's warmup does): min(25% of 8 GiB, 4 GiB)
    assert got["kv_cache_memory_bytes_per_shard"] == 2 * GIB
    assert got["kv_blocks"] == 17476  # 2147483648 // 122880 (17476 · 122880 = 2147409920)
    assert got["max_batch_total_tokens"] == 279616  # 17476 · 16
    assert got["device_flops"] == 2e11  # shards share the cores: not multiplied by 3
    assert got["max_batch_prefill_tokens"] == 4096


def test_small_kv_budget_reports_problems() -> None:
    shape = model_shape(TINY)
    # 81920 bytes = 10 blocks of 8192 → 160 tokens
    budgets = compute_budgets(shape, cpu_hardware(), BudgetSettings(kv_cache_memory_bytes=81920))
    assert budgets.kv_cache_memory_bytes_per_shard.source == "--kv-cache-memory"
    assert (budgets.kv_blocks.value, budgets.max_batch_total_tokens.value) == (10, 160)
    # One request gets every block but block 0: 9 · 16 (the shard's warmup default)
    assert (budgets.max_total_tokens.value, budgets.max_input_tokens.value) == (144, 143)
    assert budgets.max_total_tokens.source.endswith(": KV capacity less block 0")
    assert budgets.problems == ("--max-batch-prefill-tokens (256) must be <= --max-batch-total-tokens (160)",)

    settings = BudgetSettings(kv_cache_memory_bytes=81920, max_total_tokens=200, max_input_tokens=100)
    budgets = compute_budgets(shape, cpu_hardware(), settings)
    assert budgets.max_input_tokens.source == "--max-input-tokens"
    assert budgets.problems[-1] == (
        "Not enough memory to handle --max-total-tokens 200: the KV cache holds 160 tokens"
    )


# --- GPU hosts (fake NVML device lists) --------------------------------------------------------------
def test_smollm2_on_one_h100() -> None:
    hardware = gpu_hardware("NVIDIA H100 80GB HBM3", 1, total=80 * GIB)
    budgets = compute_budgets(model_shape(SMOLLM2), hardware, BudgetSettings(), tokenizer_max_length=2048)
    got = values(budgets)
    assert got["target"] == "cuda: 1 × NVIDIA H100 80GB HBM3"
    assert got["device_flops"] == 900e12  # TGI's H100 figure
    # 900e12 / 232243200 = 3875220 → max_position_embeddings 8192; memory would allow
    # (80 GiB · 0.95 − 269030016) / (23040 + 11520) = 81335348608 / 34560 = 2353453
    assert got["max_batch_prefill_tokens"] == 8192
    # free 80 GiB − 0.10 · 80 GiB = 77309411328 − 512 MiB context 536870912 − weights 269030016
    # − prefill activations 8192 · 11520 = 94371840 → 76409138560
    assert got["kv_cache_memory_bytes_per_shard"] == 76409138560
    assert got["kv_blocks"] == 207273  # 76409138560 // 368640
    assert got["max_batch_total_tokens"] == 3316368  # 207273 · 16
    assert got["max_total_tokens"] == 2048  # the tokenizer's model_max_length is the tightest
    assert got["max_input_tokens"] == 2047
    assert got["cuda_graphs"] == [1, 2, 4, 8, 16, 32]
    assert budgets.max_total_tokens.source.endswith(": tokenizer model_max_length")
    assert budgets.problems == ()


@pytest.mark.parametrize(("spec", "weights", "kv_blocks"), [
    # int8: each projection's parameters · (1 + 2 bytes of bf16 scale / in_features): q, k, v, gate, up
    # and o read 576 inputs, 79626240 · (1 + 2/576) = 79902720; down 26542080 · (1 + 2/1536) = 26576640;
    # the tied vocabulary int8 too, 28311552 · (1 + 2/576) = 28409856; norms 35136 · 2 = 70272
    (QuantizeSpec("int8"), 134959488, 207636),
    # int4/g64: half a byte per weight + a bf16 scale and zero per 64 = 0.5625 bytes at 576 and 1536
    # inputs: 79626240 · 0.5625 + 26542080 · 0.5625 = 59719680; vocabulary and norms as under int8
    (QuantizeSpec("int4", 64), 88199808, 207763),
])
def test_quantize_weight_bytes_and_kv_blocks_follow(spec: QuantizeSpec, weights: int, kv_blocks: int) -> None:
    hardware = gpu_hardware("NVIDIA H100 80GB HBM3", 1, total=80 * GIB)
    budgets = compute_budgets(model_shape(SMOLLM2), hardware, BudgetSettings(quantize=spec), tokenizer_max_length=2048)
    got = values(budgets)
    assert got["weight_bytes_per_shard"] == weights
    # the bf16 case's 76409138560 + 269030016 of bf16 weights − these weights, // 368640 per block
    assert got["kv_cache_memory_bytes_per_shard"] == 76409138560 + 269030016 - weights
    assert got["kv_blocks"] == kv_blocks
    assert budgets.weight_bytes_per_shard.source.startswith(spec.label)


def test_gguf_weight_bytes_are_the_files_share() -> None:
    hardware = cpu_hardware(native_bf16=True)
    one = compute_budgets(model_shape(SMOLLM2), hardware, BudgetSettings(), gguf_tensor_bytes=90_000_000)
    assert one.weight_bytes_per_shard.value == 90_000_000
    three = compute_budgets(model_shape(SMOLLM2), hardware, BudgetSettings(num_shard=3), gguf_tensor_bytes=90_000_000)
    # rank 0 holds 44861760 of 134515008 parameters (test_three_cpu_shards_share_the_host_budget)
    assert three.weight_bytes_per_shard.value == 30015672  # int(90e6 · 44861760 / 134515008)
    assert "GGUF" in three.weight_bytes_per_shard.source


def test_smollm2_on_three_small_l4s_hits_the_memory_clamp() -> None:
    hardware = gpu_hardware("NVIDIA L4", 3, total=192 * MIB)
    budgets = compute_budgets(model_shape(SMOLLM2), hardware, BudgetSettings(num_shard=3))
    got = values(budgets)
    assert got["device_flops"] == 3 * 121e12  # TGI multiplies the card's figure by num_shard
    # FLOPs rule 363e12 / 232243200 = 1563016 → 8192; memory: (192 MiB · 0.95 − 89723520) /
    # (kv 7680 + activations (2·576 + 3·512)·2 = 5376) = 101536742.4 / 13056 = 7777.02 → 7777
    assert got["max_batch_prefill_tokens"] == 7777
    assert budgets.max_batch_prefill_tokens.source.endswith("clamped to what fits in GPU memory")
    # 0.9 · 192 MiB = 181193932.8 is less than the CUDA context alone: no KV cache at all
    assert (got["kv_cache_memory_bytes_per_shard"], got["kv_blocks"], got["max_total_tokens"]) == (0, 0, 0)
    assert budgets.problems == (
        "the KV cache holds 0 blocks per shard; at least 2 are needed (block 0 is reserved)",
        "--max-input-tokens (0) must be < --max-total-tokens (0)",
        "--max-batch-prefill-tokens (7777) must be <= --max-batch-total-tokens (0)",
    )


def test_kv_cache_memory_caps_gpu_memory_but_never_raises_it() -> None:
    hardware = gpu_hardware("NVIDIA H100 80GB HBM3", 1, total=80 * GIB)
    capped = compute_budgets(model_shape(SMOLLM2), hardware, BudgetSettings(kv_cache_memory_bytes=GIB))
    assert capped.kv_cache_memory_bytes_per_shard.value == GIB
    assert capped.kv_blocks.value == 2912  # 1073741824 // 368640
    uncapped = compute_budgets(model_shape(SMOLLM2), hardware, BudgetSettings(kv_cache_memory_bytes=100 * GIB))
    assert uncapped.kv_cache_memory_bytes_per_shard.value == 76409138560  # what memory allows (see above)


def test_cpu_overcommit_is_a_problem() -> None:
    budgets = compute_budgets(model_shape(TINY), cpu_hardware(), BudgetSettings(kv_cache_memory_bytes=8 * GIB))
    # 8 GiB KV + 558336 weights + 256 · 2048 activations > 8 GiB available
    assert budgets.problems == (
        f"weights, KV cache and activations need {8 * GIB + 558336 + 524288} bytes; {8 * GIB} available",
    )


def test_unknown_card_uses_tgi_default_prefill() -> None:
    hardware = gpu_hardware("NVIDIA GeForce GTX 1080", 1, total=8 * GIB)
    budgets = compute_budgets(model_shape(SMOLLM2), hardware, BudgetSettings())
    assert budgets.device_flops.value is None
    assert budgets.device_flops.source == "no FLOPs figure for 'NVIDIA GeForce GTX 1080'"
    assert budgets.max_batch_prefill_tokens.value == 4096
    assert budgets.max_batch_prefill_tokens.source == "TGI default 4096"


def test_gpu_kv_budget_uses_the_tightest_device_and_fraction() -> None:
    gpus = (GpuDevice(0, "NVIDIA L4", 24 * GIB, 24 * GIB), GpuDevice(1, "NVIDIA L4", 24 * GIB, 12 * GIB))
    hardware = Hardware(gpus=gpus, gpu_note="", cpu=cpu_hardware().cpu, cpu_matmul=())
    settings = BudgetSettings(num_shard=1, dtype="float32", cuda_memory_fraction=0.5, max_batch_prefill_tokens=1000)
    budgets = compute_budgets(model_shape(TINY), hardware, settings)
    # only device 0 is used: 24 GiB free − (1 − 0.5·0.9)·24 GiB = 0.45 · 25769803776 = 11596411699.2
    # − context 536870912 − weights 558336 − activations 1000 · 2048 = 11056934451.2
    assert budgets.kv_cache_memory_bytes_per_shard.value == 11056934451
    settings = BudgetSettings(num_shard=2, dtype="float32", max_batch_prefill_tokens=1000)
    two = compute_budgets(model_shape(TINY), hardware, settings)
    # device 1 is the tighter: 12 GiB free 12884901888 − 0.1 · 24 GiB 2576980377.6 − 536870912
    # − weights 69952 · 4 = 279808 − activations 1000 · (2·64 + 3·64) · 4 = 1280000 → 9769490790.4
    assert two.kv_cache_memory_bytes_per_shard.value == 9769490790


def test_sizes_follow_the_shards_default_dtype_not_config_json() -> None:
    # SmolLM2's config says bfloat16; a CPU without native bf16 math serves (and is sized) in float32
    budgets = compute_budgets(model_shape(SMOLLM2), cpu_hardware(), BudgetSettings())
    assert (budgets.dtype.value, budgets.dtype.source) == (
        "float32", "shard default: float32 on a CPU without native bf16 math")
    assert budgets.kv_bytes_per_token_per_shard.value == 46080  # 2 · 30 · 3 · 64 · 4
    # TINY's config says float32; CUDA serves it in bfloat16
    budgets = compute_budgets(model_shape(TINY), gpu_hardware("NVIDIA L4", 1, 24 * GIB), BudgetSettings())
    assert (budgets.dtype.value, budgets.dtype.source) == ("bfloat16", "shard default: bfloat16 on CUDA")
    assert budgets.weight_bytes_per_shard.value == 279168  # 139584 · 2


def test_not_enough_gpus_or_indivisible_heads() -> None:
    with pytest.raises(ConfigError, match="--num-shard 2 needs 2 GPUs, NVML lists 1"):
        compute_budgets(model_shape(TINY), gpu_hardware("NVIDIA L4", 1, 24 * GIB), BudgetSettings(num_shard=2))
    # SmolLM2's 9 query heads over 3 KV heads do split over 2 shards: 2 KV-head groups and 1.
    two = compute_budgets(model_shape(SMOLLM2), cpu_hardware(), BudgetSettings(num_shard=2))
    assert two.attention_heads_per_shard.value == (6, 3) and two.kv_heads_per_shard.value == 2
    assert "KV heads 2+1" in two.attention_heads_per_shard.source
    with pytest.raises(UnsupportedModelError, match="10 shards are more than the model's 9 attention heads"):
        compute_budgets(model_shape(SMOLLM2), cpu_hardware(), BudgetSettings(num_shard=10))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_shard": 0}, "--num-shard"),
        ({"block_size": 0}, "--block-size"),
        ({"dtype": "int8"}, "--dtype"),
        ({"max_total_tokens": 0}, "--max-total-tokens"),
        ({"kv_cache_memory_bytes": -1}, "--kv-cache-memory"),
        ({"cuda_memory_fraction": 1.5}, "--cuda-memory-fraction"),
        ({"kv_cache_dtype": "int4"}, "--kv-cache-dtype"),
        ({"max_input_tokens": 10, "max_total_tokens": 10}, r"must be < --max-total-tokens \(10\)"),
    ],
)
def test_settings_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        BudgetSettings(**kwargs)


def _safetensors_parameters(model_dir: Path) -> int:
    """Parameters stored in a model directory, read from the safetensors headers only (8-byte
    little-endian header length, then a JSON map of tensor name → dtype, shape, offsets)."""
    total = 0
    for path in model_dir.glob("*.safetensors"):
        with path.open("rb") as file:
            header = json.loads(file.read(int.from_bytes(file.read(8), "little")))
        total += sum(math.prod(entry["shape"]) for name, entry in header.items() if name != "__metadata__")
    return total


def test_parameter_count_matches_the_real_smollm2_weights(smollm2_dir: Path) -> None:
    # The arithmetic and the converted checkpoint must agree tensor for tensor (tied head, no biases).
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert parameters_per_shard(model_shape(config), 1) == _safetensors_parameters(smollm2_dir) == 134515008
