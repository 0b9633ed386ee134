"""The tiny test models: real HF directories transformers loads, a real tokenizer, deterministic."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from tgictl.errors import ConfigError
from tgictl.testing.tiny_models import (
    CHATML_TEMPLATE,
    FAMILIES,
    tokenizer_json,
    write_tiny_model,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
TEXTS = [
    "Hello world!  Multiple   spaces\n\nnew lines\ttabs",
    "日本語のテキスト 🙂 émigré naïve café",
    " leading space and trailing space ",
    "x<|im_end|>y",
    "can't I'M 1234567890 3.14",
]


def _tensor_names(model_dir: Path) -> set[str]:
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        return set(f.keys())


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_loads_in_transformers_and_generates_varied_tokens(
    family: str, tiny_model_dirs: dict[str, Path]
) -> None:
    model_dir = tiny_model_dirs[family]
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (model_dir / name).is_file(), name
    assert (model_dir / "model.safetensors").stat().st_size < 4 * 1024 * 1024
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == family
    assert config["vocab_size"] == 512
    assert config["eos_token_id"] == 2

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = tokenizer("Once upon a time", return_tensors="pt")["input_ids"]
    out = model.generate(prompt, max_new_tokens=16, do_sample=False, eos_token_id=None)
    new_tokens = out[0, prompt.shape[1] :].tolist()
    assert len(new_tokens) == 16
    # Interesting weights: greedy decoding does not collapse onto one or two tokens.
    assert len(set(new_tokens)) >= 5, new_tokens


def test_family_specific_tensors(tiny_model_dirs: dict[str, Path]) -> None:
    qwen2 = _tensor_names(tiny_model_dirs["qwen2"])
    assert "model.layers.0.self_attn.q_proj.bias" in qwen2
    assert "model.layers.0.self_attn.k_proj.bias" in qwen2
    qwen3 = _tensor_names(tiny_model_dirs["qwen3"])
    assert "model.layers.0.self_attn.q_norm.weight" in qwen3
    assert "model.layers.0.self_attn.k_proj.bias" not in qwen3
    llama = _tensor_names(tiny_model_dirs["llama"])
    assert "lm_head.weight" in llama  # untied by default
    assert "model.layers.0.self_attn.q_proj.bias" not in llama


def test_tied_family_has_tied_head(tiny_model_dirs: dict[str, Path]) -> None:
    config = json.loads((tiny_model_dirs["qwen3"] / "config.json").read_text())
    assert config["tie_word_embeddings"] is True
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dirs["qwen3"])
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)


def test_norm_weights_and_biases_are_not_trivial(tiny_model_dirs: dict[str, Path]) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dirs["qwen2"])
    norm = model.model.layers[0].input_layernorm.weight
    assert not torch.allclose(norm, torch.ones_like(norm))
    bias = model.model.layers[0].self_attn.q_proj.bias
    assert bias.abs().max() > 0.1


def test_same_seed_same_weights_and_other_seed_differs(make_tiny_model, tmp_path: Path) -> None:
    a = AutoModelForCausalLM.from_pretrained(make_tiny_model("llama"))
    b = AutoModelForCausalLM.from_pretrained(write_tiny_model(tmp_path / "again", "llama"))
    c = AutoModelForCausalLM.from_pretrained(make_tiny_model("llama", seed=1))
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)


def test_llama_and_mistral_get_different_weights(tiny_model_dirs: dict[str, Path]) -> None:
    a = AutoModelForCausalLM.from_pretrained(tiny_model_dirs["llama"])
    b = AutoModelForCausalLM.from_pretrained(tiny_model_dirs["mistral"])
    assert not torch.equal(a.model.embed_tokens.weight, b.model.embed_tokens.weight)


def test_options_reach_the_config(make_tiny_model) -> None:
    model_dir = make_tiny_model(
        "qwen3",
        num_layers=3,
        hidden_size=96,
        num_heads=6,
        num_kv_heads=3,
        tie_word_embeddings=False,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
        dtype="bfloat16",
        rope_theta=1e6,
    )
    config = json.loads((model_dir / "config.json").read_text())
    assert config["num_hidden_layers"] == 3
    assert config["head_dim"] == 16
    assert config["num_key_value_heads"] == 3
    assert config["tie_word_embeddings"] is False
    assert config["rope_parameters"]["rope_type"] == "linear"
    assert config["rope_parameters"]["factor"] == 2.0
    assert config["rope_parameters"]["rope_theta"] == 1e6
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.bfloat16


def test_bad_arguments_raise_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"unknown tiny model family 'gpt9'; known: {', '.join(sorted(FAMILIES))}"):
        write_tiny_model(tmp_path / "x", "gpt9")
    with pytest.raises(ConfigError, match="dtype must be one of"):
        write_tiny_model(tmp_path / "x", "llama", dtype="int8")
    with pytest.raises(ConfigError, match="num_heads"):
        write_tiny_model(tmp_path / "x", "llama", num_heads=3)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tokenizer_round_trips_and_matches_transformers(family: str, tiny_model_dirs: dict[str, Path]) -> None:
    raw = Tokenizer.from_file(str(tiny_model_dirs[family] / "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(tiny_model_dirs[family])
    for text in TEXTS:
        ids = raw.encode(text).ids
        assert hf(text)["input_ids"] == ids, (family, text)
        assert raw.decode(ids, skip_special_tokens=False) == text
    assert raw.encode("<|im_start|><|im_end|><|endoftext|>").ids == [1, 2, 0]
    # Merges were learned: ordinary English is much shorter in tokens than in bytes.
    sentence = "The capital of France is Paris."
    assert len(raw.encode(sentence).ids) < len(sentence.encode()) // 2


def test_tokenizer_config_has_chat_template_and_specials(tiny_model_dir: Path) -> None:
    config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHATML_TEMPLATE
    assert config["eos_token"] == "<|im_end|>"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token_id == 2


def test_tokenizer_training_is_deterministic() -> None:
    assert tokenizer_json.__wrapped__() == tokenizer_json()
    vocab = json.loads(tokenizer_json())["model"]["vocab"]
    assert len(vocab) == 512


def test_script_writes_a_model(tmp_path: Path) -> None:
    out = tmp_path / "m"
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "make_tiny_model.py"), str(out), "--family", "mistral", "--layers", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(out)
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 1
