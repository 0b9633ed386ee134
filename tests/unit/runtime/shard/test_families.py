"""families.py: each family's config read as transformers reads it (windows per layer, rotary per layer, scalars,
both config shapes of Gemma 3), and a setting no family implements refused with one line naming it."""

from __future__ import annotations

from typing import Any

import pytest

from tgictl.errors import ConfigError, UnsupportedModelError
from tgictl.runtime.shard.families import FAMILIES, Dimensions, family_spec
from tgictl.runtime.shard.family_spec import FamilySpec, LayerSpec
from tgictl.runtime.shard.rope_config import RopeConfig

DIMS = Dimensions(hidden_size=64, num_layers=6, head_dim=16, max_positions=4096)


def spec(model_type: str, **config: Any) -> FamilySpec:
    return family_spec({"model_type": model_type, **config}, DIMS)


def test_gemma2_alternates_windows_and_carries_its_scalars() -> None:
    gemma = spec("gemma2", sliding_window=512, query_pre_attn_scalar=144, attn_logit_softcapping=50.0,
                 final_logit_softcapping=30.0)
    assert gemma.windows == (512, None) * 3  # the first layer is local
    assert (gemma.layout, gemma.norm_offset, gemma.norm_weight_in_float32) == ("sandwich", 1.0, True)
    assert gemma.attention_scale == 144**-0.5 and gemma.attention_softcap == 50.0 and gemma.final_softcap == 30.0
    assert gemma.activation == "gelu_tanh" and gemma.embedding_scale == 8.0 and gemma.embedding_scale_in_dtype


def test_gemma3_has_five_local_layers_to_one_global_with_their_own_bases() -> None:
    rope_parameters = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                       "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}
    five = spec("gemma3_text", sliding_window=1024, rope_parameters=rope_parameters)
    assert five.windows == (1024,) * 5 + (None,)
    local, global_ = five.layers[0].rope, five.layers[5].rope
    assert local == RopeConfig(theta=10000.0)
    assert global_ is not None and (global_.rope_type, global_.factor, global_.theta) == ("linear", 8.0, 1e6)
    assert five.qk_norm == "per_head" and five.attention_softcap is None  # transformers' Gemma 3 reads no attn cap
    # transformers 4's keys: rope_theta and rope_scaling for the global layers, rope_local_base_freq for the local
    old = spec("gemma3_text", sliding_window=1024, rope_theta=1e6, rope_local_base_freq=10000.0,
               rope_scaling={"rope_type": "linear", "factor": 8.0})
    assert old.layers == five.layers


def test_phi3_partial_rotary_fused_names_and_window() -> None:
    phi = spec("phi3", partial_rotary_factor=0.75, sliding_window=2047)
    assert phi.rotary_dim == 12 and phi.windows == (2047,) * 6
    assert (phi.fused_qkv, phi.fused_gate_up) == ("qkv_proj", "gate_up_proj")
    assert set(phi.lora_targets) == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}
    with pytest.raises(ConfigError, match="needs 'long_factor' as a list of 6 numbers"):
        spec("phi3", partial_rotary_factor=0.75, rope_scaling={"rope_type": "longrope", "long_factor": [1.0] * 8,
                                                               "short_factor": [1.0] * 8})


def test_smollm3_layers_without_positions_and_their_windows() -> None:
    smol = spec("smollm3", no_rope_layer_interval=3)
    assert [layer.rope is None for layer in smol.layers] == [False, False, True] * 2
    windowed = spec("smollm3", no_rope_layer_interval=3, use_sliding_window=True, sliding_window=64)
    assert windowed.windows == (None, None, 64) * 2  # transformers: the NoPE layers are the sliding ones
    assert spec("smollm3", no_rope_layers=[1, 0, 1, 1, 1, 0]).layers[1].rope is None


def test_olmo2_and_granite() -> None:
    olmo = spec("olmo2")
    assert (olmo.layout, olmo.qk_norm, olmo.norm_weight_in_float32) == ("post_norm", "full_width", True)
    granite = spec("granite", embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125,
                   logits_scaling=8.0)
    assert (granite.embedding_scale, granite.residual_scale, granite.attention_scale, granite.logits_divisor) == (
        12.0, 0.22, 0.0078125, 8.0)


def test_only_llamas_spec_and_qwen2_s_runs_the_llama_loop() -> None:
    assert spec("llama").runs_llama_loop() and spec("mistral", sliding_window=4096).runs_llama_loop()
    assert spec("qwen2").runs_llama_loop()  # Llama's layer with a q|k|v bias, which the loop adds
    assert not spec("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=2).runs_llama_loop()
    assert not any(spec(t).runs_llama_loop() for t in ("qwen3", "gemma2", "gemma3_text", "phi3", "olmo2"))
    assert not FamilySpec(qkv_bias=True, o_bias=True, layers=(LayerSpec(RopeConfig()),)).runs_llama_loop()
    assert not spec("granite", residual_multiplier=0.5).runs_llama_loop()
    assert not spec("smollm3").runs_llama_loop()  # layers without positions
    qwen_windows = spec("qwen3", use_sliding_window=True, sliding_window=8, max_window_layers=2)
    assert len(set(qwen_windows.windows)) == 2  # a window on some layers only: not the loop's single window
    rope = RopeConfig()
    assert not FamilySpec(layers=(LayerSpec(rope, 8), LayerSpec(rope, None))).runs_llama_loop()


@pytest.mark.parametrize("config, message", [
    ({"model_type": "gemma3_text", "use_bidirectional_attention": True}, "use_bidirectional_attention=True is not"),
    ({"model_type": "llama", "attention_chunk_size": 8192}, "attention_chunk_size=8192 is not supported"),
    ({"model_type": "llama", "rope_scaling": {"rope_type": "mrope"}}, "rope type 'mrope' is not supported"),
    ({"model_type": "gemma2", "layer_types": ["chunked_attention"] * 6}, "layer type 'chunked_attention' is not"),
    ({"model_type": "gemma2", "hidden_activation": "gelu"}, "hidden_activation 'gelu' is not supported"),
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported; supported: gemma2, gemma3_text, granite"),
])
def test_a_setting_no_family_implements_is_one_line_naming_it(config: dict[str, Any], message: str) -> None:
    with pytest.raises(UnsupportedModelError, match=message) as caught:
        family_spec(config, DIMS)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("config, message", [
    ({"model_type": "gemma2", "layer_types": ["full_attention"] * 5}, "layer_types has 5 entries for 6 layers"),
    ({"model_type": "gemma2", "sliding_window": None}, "sliding_attention layers but sliding_window is null"),
    ({"model_type": "mistral", "sliding_window": 0}, "sliding_window must be a positive number"),
    ({"model_type": "phi3", "partial_rotary_factor": 0.01}, "leaves 0 rotary dimensions"),
])
def test_inconsistent_configs_are_config_errors(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        family_spec(config, DIMS)


def test_every_family_parses_its_transformers_defaults() -> None:
    """A config with only model_type (transformers' class defaults for the rest) gives one layer spec per layer."""
    for model_type in FAMILIES:
        assert len(spec(model_type, sliding_window=64).layers) == DIMS.num_layers


def test_the_lists_of_families_agree() -> None:
    """families.FAMILIES is the one list: the registry, the tiny test models, the GGUF paths follow it."""
    import gguf

    from tgictl.runtime.model_files.gguf_model import served_architectures
    from tgictl.runtime.shard.models.registry import MODEL_FAMILIES
    from tgictl.testing import tiny_gguf, tiny_models

    assert set(MODEL_FAMILIES) == set(FAMILIES) == set(tiny_models.FAMILIES)
    assert {family.model_type for family in tiny_models.FAMILIES.values()} == set(FAMILIES)
    architectures = {family.gguf_architecture for family in FAMILIES.values()}
    assert architectures <= set(gguf.MODEL_ARCH_NAMES.values())  # names llama.cpp's converter writes
    assert set(served_architectures()) == set(tiny_gguf.ARCHITECTURES.values()) <= architectures
    assert all(FAMILIES[family].gguf_architecture == arch for family, arch in tiny_gguf.ARCHITECTURES.items())
