"""Layers against their transformers counterparts, and the parallel layers' slicing at one rank."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.layers.embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
    vocab_range,
)
from tgictl.runtime.shard.layers.linear import ColumnParallelLinear, RowParallelLinear
from tgictl.runtime.shard.layers.mlp import GatedMLP
from tgictl.runtime.shard.layers.norm import RMSNorm
from tgictl.runtime.shard.weights import Weights

CPU = torch.device("cpu")
SINGLE = DistContext.single()


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rms_norm_matches_transformers_exactly(dtype: torch.dtype) -> None:
    hf = LlamaRMSNorm(32, eps=1e-5)
    weight = torch.rand(32, generator=torch.Generator().manual_seed(1)) + 0.5
    hf.weight.data.copy_(weight)
    hf = hf.to(dtype)
    ours = RMSNorm(weight.to(dtype), eps=1e-5)
    x = (_randn(5, 32) * 3).to(dtype)
    with torch.no_grad():
        assert torch.equal(ours(x), hf(x))


def _save(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    return path


def test_gated_mlp_matches_transformers(tmp_path: Path) -> None:
    hf = LlamaMLP(LlamaConfig(hidden_size=16, num_attention_heads=4, intermediate_size=40, hidden_act="silu"))
    with torch.no_grad():
        for param in hf.parameters():
            param.copy_(_randn(*param.shape, seed=param.numel()) * 0.3)
    tensors = {f"mlp.{name}": p.detach().clone() for name, p in hf.named_parameters()}
    with Weights(_save(tmp_path, tensors), dtype=torch.float32, device=CPU, dist=SINGLE) as weights:
        ours = GatedMLP.load(weights, "mlp", bias=False)
    assert ours.gate_up.weight.shape == (80, 16)  # gate and up fused into one matmul
    x = _randn(6, 16, seed=3)
    with torch.no_grad():
        # float32 summation order differs (the native few-row kernel vs oneDNN): rounding only
        torch.testing.assert_close(ours(x), hf(x), rtol=1e-6, atol=1e-6)


def test_column_parallel_concatenates_row_ranges_and_biases(tmp_path: Path) -> None:
    tensors = {
        "q.weight": _randn(8, 4, seed=1),
        "q.bias": _randn(8, seed=2),
        "k.weight": _randn(6, 4, seed=3),
        "k.bias": _randn(6, seed=4),
    }
    with Weights(_save(tmp_path, tensors), dtype=torch.float32, device=CPU, dist=SINGLE) as weights:
        layer = ColumnParallelLinear.load_ranges(weights, [("q", 2, 6), ("k", 0, 3)], bias=True)
    assert torch.equal(layer.weight.dequantize(), torch.cat([tensors["q.weight"][2:6], tensors["k.weight"][:3]]))
    assert torch.equal(layer.bias, torch.cat([tensors["q.bias"][2:6], tensors["k.bias"][:3]]))
    x = _randn(3, 4, seed=5)
    q = x @ tensors["q.weight"][2:6].T + tensors["q.bias"][2:6]
    k = x @ tensors["k.weight"][:3].T + tensors["k.bias"][:3]
    expected = torch.cat([q, k], dim=1)
    torch.testing.assert_close(layer(x), expected)


def test_row_parallel_at_one_rank_is_a_plain_linear(tmp_path: Path) -> None:
    tensors = {"o.weight": _randn(5, 8, seed=1), "o.bias": _randn(5, seed=2)}
    with Weights(_save(tmp_path, tensors), dtype=torch.float32, device=CPU, dist=SINGLE) as weights:
        layer = RowParallelLinear.load_sharded(weights, "o", bias=True)
    x = _randn(3, 8, seed=3)
    torch.testing.assert_close(layer(x), x @ tensors["o.weight"].T + tensors["o.bias"])


def test_vocab_ranges_cover_an_uneven_vocabulary_once() -> None:
    ranges = [vocab_range(10, rank, 3) for rank in range(3)]
    assert ranges == [(0, 4, 4), (4, 8, 4), (8, 10, 4)]
    assert vocab_range(512, 1, 2) == (256, 512, 256)


def test_embedding_and_tied_head_at_one_rank() -> None:
    weight = _randn(12, 6, seed=1)
    embedding = VocabParallelEmbedding(weight, 12, SINGLE)
    head = ParallelLMHead(embedding.weight, 12, SINGLE)
    assert head.weight is embedding.weight  # tied: one tensor, not a copy
    ids = torch.tensor([0, 11, 5])
    assert torch.equal(embedding(ids), weight[ids])
    hidden = _randn(2, 6, seed=2).to(torch.bfloat16)
    logits = ParallelLMHead(weight.to(torch.bfloat16), 12, SINGLE)(hidden)
    # the model's dtype: consumers widen what they use (bf16 -> float32 is exact)
    assert logits.dtype == torch.bfloat16 and logits.shape == (2, 12)
    assert torch.equal(logits, hidden @ weight.to(torch.bfloat16).T)
