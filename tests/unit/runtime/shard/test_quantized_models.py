"""--quantize at load: a quantized model computes what a float model holding its dequantized weights computes
(the quantization is the same whether the projections are fused or not); the bytes it holds are the
profile's estimate; and a GGUF model refuses --quantize."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tgictl.errors import ConfigError
from tgictl.kernels import build_attention_metadata
from tgictl.kernels.linear_methods import DenseWeight, Int4Weight, Int8Weight, Role, linear_method
from tgictl.quantization import QuantizeSpec
from tgictl.runtime.profile.model_shape import model_shape, weight_bytes_per_shard
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.layers.moe import SparseMoE
from tgictl.runtime.shard.model_config import ModelConfig
from tgictl.runtime.shard.models.base import CausalLM
from tgictl.runtime.shard.models.registry import load_model, weight_bytes
from tgictl.testing.tiny_models import FAMILIES

CPU = torch.device("cpu")
SPECS = {"int8": QuantizeSpec("int8"), "int4/g32": QuantizeSpec("int4", 32), "int4/g64": QuantizeSpec("int4", 64)}
# Rows and inputs in multiples of 64 (the int4 tile), head_dim 64: the profile's estimate is then exact.
SHAPE = {"hidden_size": 128, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 256}


def _logits(model: CausalLM, ids: list[int]) -> torch.Tensor:
    n = len(ids)
    cache = model.allocate_kv_cache(8, 16)
    meta = build_attention_metadata([0], [n], [[3, 1]], 16, CPU)
    slots = torch.tensor([(3 if p < 16 else 1) * 16 + p % 16 for p in range(n)])
    return model(torch.tensor(ids), torch.arange(n), slots, cache, meta, torch.arange(n))


def _dequantized_copy(model_dir: Path, spec: QuantizeSpec, target: Path) -> Path:
    """The same checkpoint with every projection replaced by its quantized values, each matrix alone (an MoE
    model's experts too; its routers stay in the serving dtype)."""
    shutil.copytree(model_dir, target)
    tensors = load_file(str(model_dir / "model.safetensors"))
    method = linear_method(spec)
    moe = ModelConfig.from_dir(model_dir).moe
    router = None if moe is None else f".{moe.names.block}.{moe.names.router}.weight"
    for name, tensor in tensors.items():
        if tensor.dim() == 2 and not (router is not None and name.endswith(router)):
            role = Role.VOCAB if "embed_tokens" in name or "lm_head" in name else Role.PROJECTION
            tensors[name] = method.from_dense(tensor, torch.float32, role).dequantize()
    save_file(tensors, str(target / "model.safetensors"))
    return target


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("label", list(SPECS))
def test_quantized_model_computes_its_dequantized_weights(family: str, label: str, make_tiny_model,
                                                          tmp_path: Path) -> None:
    spec = SPECS[label]
    model_dir = make_tiny_model(family, **SHAPE)
    quantized = load_model(model_dir, dtype=torch.float32, device=CPU, dist=DistContext.single(), quantize=spec)
    dense = load_model(_dequantized_copy(model_dir, spec, tmp_path / "dequantized"), dtype=torch.float32,
                       device=CPU, dist=DistContext.single())
    ids = [5, 17, 200, 3, 9, 44, 101, 7, 250, 12, 33, 80, 1, 2, 300, 4, 8, 90]
    expected = _logits(dense, ids)
    torch.testing.assert_close(_logits(quantized, ids), expected, rtol=0, atol=1e-4 * float(expected.abs().max()))
    projection = Int8Weight if spec.method == "int8" else Int4Weight
    assert isinstance(quantized.layers[0].attention.qkv.weight, projection)  # q, k, v fused, quantized once
    mlp = quantized.layers[0].mlp
    if isinstance(mlp, SparseMoE):  # every expert quantized, the router not
        assert all(isinstance(w, projection) for w in (*mlp.experts.gate_up, *mlp.experts.down))
        assert mlp.router.weight.dtype == torch.float32
    else:
        assert isinstance(mlp.down.weight, projection)
    assert isinstance(quantized.embed.weight, Int8Weight)  # the vocabulary: int8 under every method


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("label", list(SPECS))
def test_held_bytes_are_the_profile_estimate(family: str, label: str, make_tiny_model) -> None:
    spec = SPECS[label]
    model_dir = make_tiny_model(family, **SHAPE)
    model = load_model(model_dir, dtype=torch.bfloat16, device=CPU, dist=DistContext.single(), quantize=spec)
    shape = model_shape(json.loads((model_dir / "config.json").read_text()))
    estimate, _ = weight_bytes_per_shard(shape, 1, 2, spec, None)
    assert weight_bytes(model) == estimate
    dense = load_model(model_dir, dtype=torch.bfloat16, device=CPU, dist=DistContext.single())
    assert weight_bytes(dense) == weight_bytes_per_shard(shape, 1, 2, None, None)[0]
    assert weight_bytes(model) < weight_bytes(dense) * (0.55 if spec.method == "int8" else 0.4)


def test_dense_stays_dense(make_tiny_model) -> None:
    model = load_model(make_tiny_model("llama"), dtype=torch.float32, device=CPU, dist=DistContext.single())
    assert isinstance(model.layers[0].attention.qkv.weight, DenseWeight)
    assert isinstance(model.lm_head.weight, DenseWeight)


def test_gguf_refuses_quantize(tmp_path: Path) -> None:
    from tgictl.runtime.model_files.gguf_model import gguf_model_dir
    from tgictl.testing.tiny_gguf import write_tiny_gguf

    model_dir = gguf_model_dir(write_tiny_gguf(tmp_path / "tiny.gguf", "llama"), tmp_path / "cache")
    with pytest.raises(ConfigError, match="--quantize applies to safetensors models; tiny.gguf is a GGUF file"):
        load_model(model_dir, dtype=torch.float32, device=CPU, dist=DistContext.single(), quantize=SPECS["int8"])


def _mapped(path: Path) -> bool:
    """Whether this process maps `path` (a view of a safetensors file keeps the whole file mapped)."""
    return any(line.rstrip().endswith(str(path)) for line in Path("/proc/self/maps").read_text().splitlines())


@pytest.mark.parametrize("label", ["int8", "int4/g32"])
def test_a_quantized_model_lets_the_checkpoint_go(label: str, make_tiny_model, tmp_path: Path) -> None:
    """Norms and biases in the checkpoint's own dtype would be views of its mapping and keep all of its floats
    resident beside the quantized weights; the dense model serves from the mapping itself."""
    model_dir = Path(shutil.copytree(make_tiny_model("qwen2", **SHAPE), tmp_path / "model"))  # biases too
    checkpoint = (model_dir / "model.safetensors").resolve()
    quantized = load_model(model_dir, dtype=torch.float32, device=CPU, dist=DistContext.single(), quantize=SPECS[label])
    assert not _mapped(checkpoint)
    assert isinstance(quantized.layers[0].attention.qkv.weight, Int8Weight | Int4Weight)
    dense = load_model(model_dir, dtype=torch.float32, device=CPU, dist=DistContext.single())
    assert _mapped(checkpoint)
    del dense
