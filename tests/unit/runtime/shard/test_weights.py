"""Weights: mmap'd safetensors, sharded checkpoints through index.json, per-rank slices, dtype conversion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tgictl.errors import ConfigError, UnsupportedModelError
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.weights import INDEX_FILE, Weights, split_range

CPU = torch.device("cpu")


def _tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(8, 6, generator=generator),
        "b.weight": torch.randn(4, 10, generator=generator),
        "c.bias": torch.randn(8, generator=generator),
    }


@pytest.fixture()
def sharded_dir(tmp_path: Path) -> Path:
    """Two safetensors files tied together by model.safetensors.index.json, plus a stray file."""
    tensors = _tensors()
    save_file({"a.weight": tensors["a.weight"]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({k: tensors[k] for k in ("b.weight", "c.bias")}, str(tmp_path / "model-00002-of-00002.safetensors"))
    # Not in the index: must not be opened (e.g. a consolidated copy next to the shards).
    save_file({"a.weight": torch.zeros(1)}, str(tmp_path / "consolidated.safetensors"))
    weight_map = {
        "a.weight": "model-00001-of-00002.safetensors",
        "b.weight": "model-00002-of-00002.safetensors",
        "c.bias": "model-00002-of-00002.safetensors",
    }
    (tmp_path / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return tmp_path


def test_index_maps_every_tensor_to_its_file(sharded_dir: Path) -> None:
    with Weights(sharded_dir, dtype=torch.float32, device=CPU, dist=DistContext.single()) as weights:
        assert weights.names() == ["a.weight", "b.weight", "c.bias"]
        for name, tensor in _tensors().items():
            assert torch.equal(weights.get(name), tensor)


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_reads_only_its_slice(sharded_dir: Path, rank: int) -> None:
    full = _tensors()
    dist = DistContext(rank=rank, world_size=2)
    with Weights(sharded_dir, dtype=torch.float32, device=CPU, dist=dist) as weights:
        rows = weights.get_sharded("a.weight", 0)  # column-parallel: output rows
        columns = weights.get_sharded("b.weight", 1)  # row-parallel: input columns
        bias = weights.get_sharded("c.bias", 0)
    assert rows.shape == (4, 6)
    assert torch.equal(rows, full["a.weight"][rank * 4 : (rank + 1) * 4])
    assert columns.shape == (4, 5)
    assert torch.equal(columns, full["b.weight"][:, rank * 5 : (rank + 1) * 5])
    assert torch.equal(bias, full["c.bias"][rank * 4 : (rank + 1) * 4])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_loading_converts_once(sharded_dir: Path, dtype: torch.dtype) -> None:
    with Weights(sharded_dir, dtype=dtype, device=CPU, dist=DistContext.single()) as weights:
        tensor = weights.get("a.weight")
        part = weights.get_range("b.weight", 1, 2, 7)
    assert tensor.dtype == dtype and part.dtype == dtype
    assert torch.equal(tensor, _tensors()["a.weight"].to(dtype))
    assert torch.equal(part, _tensors()["b.weight"][:, 2:7].to(dtype))


def test_bf16_checkpoint_loads_as_float32(tmp_path: Path) -> None:
    source = torch.randn(3, 4, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    save_file({"w": source}, str(tmp_path / "model.safetensors"))
    with Weights(tmp_path, dtype=torch.float32, device=CPU, dist=DistContext.single()) as weights:
        loaded = weights.get("w")
    assert loaded.dtype == torch.float32 and torch.equal(loaded, source.float())


def test_an_uneven_split_gives_the_first_ranks_one_more(sharded_dir: Path) -> None:
    parts = []
    for rank in range(3):
        with Weights(sharded_dir, dtype=torch.float32, device=CPU, dist=DistContext(rank=rank, world_size=3)) as weights:
            parts.append(weights.get_sharded("a.weight", 0))
            full = weights.get("a.weight")
    assert [p.shape[0] for p in parts] == [3, 3, 2]  # 8 rows over 3 ranks
    assert torch.equal(torch.cat(parts), full)
    assert split_range(12, 2, 3) == (8, 12)
    with pytest.raises(UnsupportedModelError, match="size 2 cannot be split over 3 shards"):
        split_range(2, 0, 3)


def test_missing_tensor_names_it(sharded_dir: Path) -> None:
    with Weights(sharded_dir, dtype=torch.float32, device=CPU, dist=DistContext.single()) as weights:
        assert not weights.has("lm_head.weight")
        with pytest.raises(ConfigError, match="'lm_head.weight' is not in the checkpoint"):
            weights.get("lm_head.weight")


def test_single_file_checkpoint_ignores_other_safetensors(tmp_path: Path) -> None:
    save_file({"w": torch.ones(2)}, str(tmp_path / "model.safetensors"))
    save_file({"layers.0.wq": torch.ones(2)}, str(tmp_path / "consolidated.safetensors"))
    with Weights(tmp_path, dtype=torch.float32, device=CPU, dist=DistContext.single()) as weights:
        assert weights.names() == ["w"]


def test_a_tensor_in_two_files_is_ambiguous(tmp_path: Path) -> None:
    save_file({"w": torch.ones(2)}, str(tmp_path / "a.safetensors"))
    save_file({"w": torch.zeros(2)}, str(tmp_path / "b.safetensors"))
    with pytest.raises(ConfigError, match="'w' is in both a.safetensors and b.safetensors"):
        Weights(tmp_path, dtype=torch.float32, device=CPU, dist=DistContext.single())


def test_directory_without_safetensors_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ConfigError, match="no \\*.safetensors files"):
        Weights(tmp_path, dtype=torch.float32, device=CPU, dist=DistContext.single())


def test_index_naming_a_missing_file_is_a_config_error(sharded_dir: Path) -> None:
    (sharded_dir / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ConfigError, match="model-00002-of-00002.safetensors"):
        Weights(sharded_dir, dtype=torch.float32, device=CPU, dist=DistContext.single())


def test_sharded_checkpoint_loads_the_same_model(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    """A checkpoint saved in several files (with an index) gives the same logits as the single file."""
    from transformers import AutoModelForCausalLM

    from tgictl.kernels import build_attention_metadata
    from tgictl.runtime.shard.models.registry import load_model

    source = tiny_model_dirs["qwen3"]
    sharded = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(source).save_pretrained(sharded, max_shard_size="100KB")
    (sharded / "config.json").write_text((source / "config.json").read_text())
    assert (sharded / INDEX_FILE).is_file() and len(list(sharded.glob("*.safetensors"))) > 2
    ids = torch.tensor([5, 17, 200, 3, 9])
    logits = []
    for model_dir in (source, sharded):
        model = load_model(model_dir, dtype=torch.float32, device=CPU, dist=DistContext.single())
        cache = model.allocate_kv_cache(4, 16)
        meta = build_attention_metadata([0], [5], [[1]], 16, CPU)
        logits.append(model(ids, torch.arange(5), torch.arange(16, 21), cache, meta, torch.arange(5)))
    assert torch.equal(logits[0], logits[1])
