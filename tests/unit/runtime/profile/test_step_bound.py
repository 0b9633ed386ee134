"""The decode-step bound: bytes and FLOPs of SmolLM2-135M's step counted by hand, the roofline's two sides."""

from __future__ import annotations

import dataclasses

import pytest

from tgictl.runtime.profile.model_shape import model_shape
from tgictl.runtime.profile.step_bound import decode_step_bound, streamed_weight_parameters

SMOLLM2 = model_shape({
    "model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True,
})
# per layer: q|k|v (576 x (576 + 2*192)), o (576 x 576), gate|up|down (3 x 576 x 1536), two norms
LAYER = 576 * 960 + 576 * 576 + 3 * 576 * 1536 + 2 * 576
PARAMETERS = 30 * LAYER + 49152 * 576 + 576  # + the tied embedding / LM head and the final norm


def test_smollm2_step_at_batch_32_and_256_cached_tokens() -> None:
    bound = decode_step_bound(SMOLLM2, batch=32, context=256, dtype_bytes=2, bandwidth_bytes_per_s=28e9,
                              gemm_flops_per_s=1.0e12)
    assert bound.weight_bytes == 2 * PARAMETERS  # ~269 MB
    assert bound.kv_bytes == 32 * 256 * 30 * 2 * 3 * 64 * 2  # ~189 MB
    assert bound.gemm_flops == 2 * 32 * PARAMETERS
    assert bound.attention_flops == 32 * 30 * 4 * 9 * 64 * 256
    assert bound.memory_s == pytest.approx((bound.weight_bytes + bound.kv_bytes) / 28e9)
    assert bound.compute_s == pytest.approx((bound.gemm_flops + bound.attention_flops) / 1.0e12)
    assert bound.limited_by == "memory" and bound.bound_s == bound.memory_s


def test_an_int8_cache_reads_a_byte_per_value_and_a_scale_per_token_and_head() -> None:
    bound = decode_step_bound(SMOLLM2, batch=16, context=8192, dtype_bytes=2, bandwidth_bytes_per_s=28e9,
                              gemm_flops_per_s=1.0e12, kv_cache_dtype="int8")
    assert bound.kv_bytes == 16 * 8192 * 30 * 2 * 3 * (64 + 2)
    assert bound.weight_bytes == 2 * PARAMETERS  # the weights keep their own type


def test_a_slow_gemm_makes_the_step_compute_bound() -> None:
    bound = decode_step_bound(SMOLLM2, batch=32, context=256, dtype_bytes=2, bandwidth_bytes_per_s=28e9,
                              gemm_flops_per_s=100e9)
    assert bound.limited_by == "compute" and bound.bound_s == bound.compute_s


def test_an_untied_embedding_table_is_not_streamed() -> None:
    untied = dataclasses.replace(SMOLLM2, tie_word_embeddings=False)
    assert streamed_weight_parameters(untied) == streamed_weight_parameters(SMOLLM2) == PARAMETERS


@pytest.mark.parametrize("change", [{"batch": 0}, {"context": -1}, {"bandwidth_bytes_per_s": 0.0}])
def test_impossible_inputs_are_refused(change: dict[str, float]) -> None:
    args = {"batch": 1, "context": 0, "dtype_bytes": 2, "bandwidth_bytes_per_s": 1e9, "gemm_flops_per_s": 1e9}
    with pytest.raises(ValueError):
        decode_step_bound(SMOLLM2, **{**args, **change})  # type: ignore[arg-type]


def test_a_gguf_file_streams_its_tensor_bytes_and_keeps_its_kv_in_the_serving_dtype() -> None:
    dense = decode_step_bound(SMOLLM2, batch=1, context=256, dtype_bytes=2, bandwidth_bytes_per_s=28e9,
                              gemm_flops_per_s=1.0e12)
    gguf = decode_step_bound(SMOLLM2, batch=1, context=256, dtype_bytes=2, bandwidth_bytes_per_s=28e9,
                             gemm_flops_per_s=1.0e12, weight_bytes=92_000_000)
    assert gguf.weight_bytes == 92_000_000 and gguf.kv_bytes == dense.kv_bytes
    assert gguf.memory_s == pytest.approx((92_000_000 + dense.kv_bytes) / 28e9)
    assert gguf.gemm_flops == dense.gemm_flops  # the same products, on fewer bytes
