"""ModelConfig parsing: families' keys, eos ids from both files, sliding window, unsupported features."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tgictl.errors import ConfigError, UnsupportedModelError
from tgictl.runtime.shard.family_spec import FamilySpec, LayerSpec
from tgictl.runtime.shard.model_config import ModelConfig

BASE: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 100,
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "eos_token_id": 2,
}


def _write(path: Path, config: dict[str, Any], generation: dict[str, Any] | None = None) -> Path:
    (path / "config.json").write_text(json.dumps(config))
    if generation is not None:
        (path / "generation_config.json").write_text(json.dumps(generation))
    return path


def test_reads_the_architecture(tmp_path: Path) -> None:
    config = ModelConfig.from_dir(_write(tmp_path, BASE))
    assert (config.model_type, config.num_layers, config.num_heads, config.num_kv_heads) == ("llama", 3, 8, 2)
    assert config.head_dim == 8  # hidden_size // num_attention_heads when head_dim is absent
    assert config.rope is not None and config.rope.rope_type == "default" and config.rope.theta == 10000.0
    assert config.tie_word_embeddings is False
    assert config.family == FamilySpec(layers=(LayerSpec(config.rope),) * 3)  # Llama: every default
    assert config.family.runs_llama_loop()
    assert config.rms_norm_eps == 1e-5


def test_eos_ids_merge_config_and_generation_config(tmp_path: Path) -> None:
    config = ModelConfig.from_dir(_write(tmp_path, BASE, {"eos_token_id": [7, 2, 9]}))
    assert config.eos_token_ids == (2, 7, 9)
    listed = ModelConfig.from_dict({**BASE, "eos_token_id": [4, 5]}, {"eos_token_id": 5})
    assert listed.eos_token_ids == (4, 5)
    assert ModelConfig.from_dict({**BASE, "eos_token_id": None}).eos_token_ids == ()


def test_sliding_windows_per_layer_as_transformers_reads_them() -> None:
    mistral = {**BASE, "model_type": "mistral"}
    assert ModelConfig.from_dict({**mistral, "sliding_window": 4096}).layer_windows == (4096,) * 3
    assert ModelConfig.from_dict({**mistral, "sliding_window": None}).layer_windows == (None,) * 3
    assert ModelConfig.from_dict({**BASE, "sliding_window": 4096}).layer_windows == (None,) * 3  # llama has none
    qwen2 = {**BASE, "model_type": "qwen2", "sliding_window": 4096, "max_window_layers": 1}
    assert ModelConfig.from_dict({**qwen2, "use_sliding_window": False}).layer_windows == (None,) * 3
    assert ModelConfig.from_dict({**qwen2, "use_sliding_window": True}).layer_windows == (None, 4096, 4096)
    listed = {**qwen2, "use_sliding_window": True, "layer_types": ["sliding_attention", "full_attention"] * 1
              + ["sliding_attention"]}
    assert ModelConfig.from_dict(listed).layer_windows == (4096, None, 4096)


def test_head_split_of_a_config() -> None:
    config = ModelConfig.from_dict(BASE)  # 8 heads, 2 KV heads
    assert [config.head_split(r, 2).q_count for r in range(2)] == [4, 4]
    assert [(s.kv_start, s.kv_count) for s in (config.head_split(r, 4) for r in range(4))] == [(0, 1), (0, 1), (1, 1), (1, 1)]
    assert [config.head_split(r, 3).q_count for r in range(3)] == [2, 2, 4]  # KV head 0's group shared by 2 ranks


def test_unsupported_activation_and_partial_rotary_are_refused() -> None:
    with pytest.raises(UnsupportedModelError, match="hidden_act 'gelu' is not supported; supported: silu, swish"):
        ModelConfig.from_dict({**BASE, "hidden_act": "gelu"})
    with pytest.raises(UnsupportedModelError, match="partial_rotary_factor 0.5 is not supported for 'llama'"):
        ModelConfig.from_dict({**BASE, "partial_rotary_factor": 0.5})
    assert ModelConfig.from_dict({**BASE, "hidden_act": "gelu_pytorch_tanh"}).family.activation == "gelu_tanh"


def test_missing_keys_and_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="missing 'vocab_size'"):
        ModelConfig.from_dict({k: v for k, v in BASE.items() if k != "vocab_size"})
    with pytest.raises(ConfigError, match="config.json does not exist"):
        ModelConfig.from_dir(tmp_path)
    with pytest.raises(ConfigError, match="no model_type"):
        ModelConfig.from_dict({k: v for k, v in BASE.items() if k != "model_type"})
