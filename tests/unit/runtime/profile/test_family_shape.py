"""The profile's family facts: norms and biases per family (the bytes the shard holds: test_quantized_models.py
checks them against loaded models), sliding windows per layer, and the KV bytes per token windows would leave
(Gemma 3 at 8k tokens)."""

from __future__ import annotations

from typing import Any

from tgictl.runtime.profile.budgets import BudgetSettings, compute_budgets
from tgictl.runtime.profile.model_shape import model_shape
from tgictl.runtime.profile.family_shape import windowed_kv_bytes_per_token
from tgictl.runtime.profile.hardware import GIB, CpuHost, Hardware

# The text part of google/gemma-3-4b-it's config.json (transformers 4's keys, as published).
GEMMA3_4B: dict[str, Any] = {
    "model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 262208,
    "sliding_window": 1024, "sliding_window_pattern": 6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
    "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "max_position_embeddings": 131072,
    "query_pre_attn_scalar": 256, "tie_word_embeddings": True,
}
HARDWARE = Hardware(gpus=(), gpu_note="none", cpu=CpuHost(cores=16, total_memory_bytes=128 * GIB,
                                                            available_memory_bytes=120 * GIB), cpu_matmul=())


def test_gemma3_4b_holds_a_quarter_of_its_kv_at_8k_tokens_with_windows() -> None:
    shape = model_shape({"model_type": "gemma3", "vision_config": {}, "text_config": GEMMA3_4B})
    windows = shape.family.layer_windows
    assert windows.count(None) == 5 and windows.count(1024) == 29  # every 6th layer global
    settings = BudgetSettings(dtype="bfloat16", max_total_tokens=8192, max_input_tokens=8191)
    budgets = compute_budgets(shape, HARDWARE, settings)
    per_layer = 2 * 4 * 256 * 2  # K and V, 4 KV heads of 256, bf16
    assert budgets.kv_bytes_per_token_per_shard.value == 34 * per_layer == 139264
    # 5 global layers keep all 8,192 positions, 29 local ones 1,024 each
    assert budgets.windowed_kv_bytes_per_token_per_shard.value == (5 * 8192 + 29 * 1024) * per_layer // 8192 == 35328
    assert "if the 29 of 34 layers with a sliding window" in budgets.windowed_kv_bytes_per_token_per_shard.source
    # The run-time pool (two KV layer groups): the global layers keep every position, the local ones the window, a
    # block of margin and the partial block (1,024 + 32 positions), in the memory's split; within 0.1% of that.
    pooled = budgets.pooled_kv_bytes_per_token_per_shard.value
    kept = 5 * per_layer + 29 * per_layer * (1024 + 32) / 8192
    assert kept == 35792 and kept <= pooled <= kept * 1.001
    assert "two KV layer groups" in budgets.pooled_kv_bytes_per_token_per_shard.source
    # kv_blocks are the global layers' blocks: 3.9x the positions of one cache for every layer, in the same bytes
    assert budgets.kv_blocks.value * settings.block_size * pooled <= budgets.kv_cache_memory_bytes_per_shard.value
    assert budgets.kv_blocks.value > 3.8 * budgets.kv_cache_memory_bytes_per_shard.value // (16 * 139264)


def test_gemma3_1b_pool_at_8k_tokens() -> None:
    """Gemma 3 1B (26 layers, 4 global, one KV head of 256, window 512): 26,624 bytes per token keeping everything,
    5,504 if the local layers kept exactly their window, and what the pool keeps with its margin."""
    config = {**GEMMA3_4B, "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26,
              "num_attention_heads": 4, "num_key_value_heads": 1, "sliding_window": 512,
              "max_position_embeddings": 32768, "rope_scaling": None}
    shape = model_shape(config)
    budgets = compute_budgets(shape, HARDWARE, BudgetSettings(dtype="bfloat16", max_total_tokens=8192,
                                                              max_input_tokens=8191))
    per_layer = 2 * 256 * 2
    assert shape.family.layer_windows.count(None) == 4
    assert budgets.kv_bytes_per_token_per_shard.value == 26 * per_layer == 26624
    assert budgets.windowed_kv_bytes_per_token_per_shard.value == (4 * 8192 + 22 * 512) * per_layer // 8192 == 5504
    kept = 4 * per_layer + 22 * per_layer * (512 + 32) / 8192
    assert kept <= budgets.pooled_kv_bytes_per_token_per_shard.value <= kept * 1.001


def test_family_norms_and_biases() -> None:
    base = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 100}
    gemma = model_shape({**base, "model_type": "gemma2"}).family
    assert (gemma.norms_per_layer, gemma.norms_in_float32, gemma.layer_windows) == (4, True, (4096, None))
    olmo = model_shape({**base, "model_type": "olmo2"}).family
    assert (olmo.qk_norm, olmo.norms_in_float32) == ("full_width", True)
    qwen2 = model_shape({**base, "model_type": "qwen2"}).family
    assert qwen2.qkv_bias and not qwen2.o_bias
    unknown = model_shape({**base, "model_type": "gpt2", "attention_bias": True}).family
    assert unknown.qkv_bias and unknown.layer_windows == ()  # another server's model: Llama's facts


def test_windowed_bytes_per_token() -> None:
    assert windowed_kv_bytes_per_token([None, 4], 8, 10) == (8 + 4) * 10 / 8
    assert windowed_kv_bytes_per_token([None, 16], 8, 10) == 20  # a window longer than the sequence keeps it all
