"""PEFT adapter directories: read with PEFT's scaling, and every bad adapter one clear start-up error."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.lora_adapters import write_random_adapter
from tgictl.errors import ConfigError
from tgictl.runtime.shard.lora.adapter_files import read_adapter
from tgictl.runtime.shard.model_config import ModelConfig


@pytest.fixture(scope="module")
def base(tiny_model_dir: Path) -> ModelConfig:
    return ModelConfig.from_dir(tiny_model_dir)


@pytest.fixture(scope="module")
def good(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_adapter(tiny_model_dir, tmp_path_factory.mktemp("good"), rank=4, alpha=8.0, targets=("q_proj", "down_proj"))


def _copy(src: Path, dst: Path, *, config: dict | None = None, tensors: dict | None = None) -> Path:
    shutil.copytree(src, dst)
    if config is not None:
        merged = {**json.loads((dst / "adapter_config.json").read_text()), **config}
        (dst / "adapter_config.json").write_text(json.dumps(merged))
    if tensors is not None:
        save_file(tensors, str(dst / "adapter_model.safetensors"))
    return dst


def test_reads_factors_and_peft_scaling(good: Path, base: ModelConfig, tmp_path: Path) -> None:
    adapter = read_adapter("g", good, base, torch.float32)
    assert adapter.rank == 4 and adapter.scaling == 2.0 and adapter.targets == {"q_proj", "down_proj"}
    assert adapter.factors[(1, "down_proj")].a.shape == (4, base.intermediate_size)
    rs = read_adapter("rs", _copy(good, tmp_path / "rs", config={"use_rslora": True}), base, torch.float32)
    assert rs.scaling == pytest.approx(8.0 / math.sqrt(4))


def _error(path: Path, base: ModelConfig) -> str:
    with pytest.raises(ConfigError) as info:
        read_adapter("bad", path, base, torch.float32)
    return str(info.value)


def test_each_bad_adapter_is_one_clear_error(good: Path, base: ModelConfig, tmp_path: Path) -> None:
    tensors = load_file(str(good / "adapter_model.safetensors"))
    key = next(k for k in tensors if "q_proj.lora_A" in k)
    missing = _copy(good, tmp_path / "missing")
    (missing / "adapter_model.safetensors").unlink()
    assert "adapter_model.safetensors does not exist" in _error(missing, base)
    assert "use_dora=True is not supported" in _error(_copy(good, tmp_path / "dora", config={"use_dora": True}), base)
    assert "rank 200 is above the supported 128" in _error(_copy(good, tmp_path / "big", config={"r": 200}), base)
    head = {**tensors, "base_model.model.lm_head.lora_A.weight": torch.zeros(4, 64)}
    assert "targets no supported module" in _error(_copy(good, tmp_path / "head", tensors=head), base)
    narrow = {**tensors, key: torch.zeros(4, 32)}  # trained on a model with hidden size 32
    message = _error(_copy(good, tmp_path / "narrow", tensors=narrow), base)
    assert "layer 0 q_proj has A [4, 32]" in message and "different base model" in message
    deep = {**tensors, key.replace("layers.0.", "layers.7."): tensors[key].clone()}
    assert "is for layer 7; the base model has 2 layers" in _error(_copy(good, tmp_path / "deep", tensors=deep), base)
    half = {k: v for k, v in tensors.items() if k != key}
    assert "lora_B without its pair" in _error(_copy(good, tmp_path / "half", tensors=half), base)


def test_malformed_files_are_one_clear_error_too(good: Path, base: ModelConfig, tmp_path: Path) -> None:
    garbage = _copy(good, tmp_path / "garbage")
    (garbage / "adapter_model.safetensors").write_bytes(b"\x00\x01 not a safetensors file" * 10)
    assert "cannot read" in _error(garbage, base) and "adapter_model.safetensors" in _error(garbage, base)
    listed = _copy(good, tmp_path / "listed")
    (listed / "adapter_config.json").write_text("[1, 2, 3]")
    assert "adapter_config.json is not a JSON object (a list)" in _error(listed, base)
    truncated = _copy(good, tmp_path / "truncated")
    weights = truncated / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert "cannot read" in _error(truncated, base)
