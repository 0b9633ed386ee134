"""The MoE layer (runtime/shard/layers/moe/) against transformers' sparse MoE blocks on the same weights, and its
grouped path against its per-expert reference loop in every weight format."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from torch import Tensor
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from tgictl.kernels.linear_methods import DenseWeight, Int4Weight, Int8Weight, Role, linear_method
from tgictl.quantization import QuantizeSpec
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.layers.moe import Experts, SparseMoE, TopKRouter
from tgictl.runtime.shard.model_config import ModelConfig
from tgictl.runtime.shard.weights import Weights

HIDDEN = 64


def _transformers_block(family: str, dtype: torch.dtype, seed: int = 0) -> tuple[Any, Any]:
    """(config, a sparse MoE block with random weights) of `family`: 16 experts top-4 (Qwen3-MoE, normalised) or
    8 experts top-2 (Mixtral)."""
    if family == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(hidden_size=HIDDEN, moe_intermediate_size=32, num_experts=16,
                                             num_experts_per_tok=4, norm_topk_prob=True)
        block = Qwen3MoeSparseMoeBlock(config)
    else:
        config = transformers.MixtralConfig(hidden_size=HIDDEN, intermediate_size=48, num_local_experts=8,
                                            num_experts_per_tok=2)
        block = MixtralSparseMoeBlock(config)
    config._experts_implementation = "eager"  # the block alone has no model to choose its implementation
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in block.parameters():
            parameter.normal_(0, 0.2)
    return config, block.to(dtype).eval()


def _ours(family: str, block: Any, config: Any, quantize: str | None = None) -> SparseMoE:
    """Our layer on the block's weights: expert e's gate_up is its [gate; up] rows, as transformers stacks them."""
    dtype = block.gate.weight.dtype
    method = linear_method(QuantizeSpec(quantize) if quantize else None)

    def weight(tensor: Tensor) -> Any:
        return method.from_dense(tensor.detach().float().clone(), dtype, Role.PROJECTION)

    experts = block.experts
    count = experts.gate_up_proj.shape[0]
    layer = Experts([weight(experts.gate_up_proj[e]) for e in range(count)],
                    [weight(experts.down_proj[e]) for e in range(count)])
    router = TopKRouter(block.gate.weight.detach().clone(), config.num_experts_per_tok,
                        normalize=family == "mixtral" or config.norm_topk_prob, weights_in_float32=family == "mixtral")
    return SparseMoE(router, layer, DistContext.single())


def _inputs(rows: int, dtype: torch.dtype, seed: int = 3) -> Tensor:
    return torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("rows", [1, 7, 16])
@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_layer_matches_transformers_block_in_float32(family: str, rows: int) -> None:
    config, block = _transformers_block(family, torch.float32)
    moe = _ours(family, block, config)
    x = _inputs(rows, torch.float32)
    with torch.inference_mode():
        expected = block(x[None])[0]
        actual = moe(x)
        ids, _ = moe.router(x)
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)
    if rows > 1:  # the rows of the batch go to different experts
        assert len({tuple(sorted(row)) for row in ids.tolist()}) > 1


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_layer_tracks_transformers_block_in_bfloat16(family: str) -> None:
    config, block = _transformers_block(family, torch.bfloat16)
    moe = _ours(family, block, config)
    x = _inputs(16, torch.bfloat16)
    with torch.inference_mode():
        expected = block(x[None])[0].float()
        actual = moe(x)
    assert actual.dtype == torch.bfloat16
    # transformers rounds each expert's weighted output to bf16 before it adds them; we sum in float32 and round
    # once: a few bf16 ulps at the outputs' magnitude.
    ulp = 2.0 ** (torch.floor(torch.log2(expected.abs().max())).item() - 7)
    assert (actual.float() - expected).abs().max().item() <= 4 * ulp


@pytest.mark.parametrize("quantize", [None, "int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5, 33])
def test_grouped_path_equals_the_reference_loop(rows: int, dtype: torch.dtype, quantize: str | None) -> None:
    """The grouped path multiplies each expert's rows on the same kernels as the reference loop (the same rows in
    the same order); only the order of each token's k weighted terms differs."""
    config, block = _transformers_block("qwen3_moe", torch.float32, seed=5)
    moe = _ours("qwen3_moe", block.to(dtype), config, quantize)
    if quantize is not None:
        assert isinstance(moe.experts.down[0], {"int8": Int8Weight, "int4": Int4Weight}[quantize])
    x = _inputs(rows, dtype, seed=rows)
    with torch.inference_mode():
        ids, weights = moe.router(x)
        grouped = moe.experts(x, ids, weights)
        reference = moe.experts.reference(x, ids, weights)
    # Float32 sums of the same products (bf16 ones too) in another order: float32 rounding apart.
    assert grouped.dtype == reference.dtype == torch.float32
    torch.testing.assert_close(grouped, reference, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # the Python loop; the compiled one
def test_one_row_reads_only_its_chosen_experts(dtype: torch.dtype) -> None:
    """Every expert a decode row did not choose holds NaN weights: the row's output is unchanged and finite."""
    config, block = _transformers_block("qwen3_moe", dtype, seed=7)
    moe = _ours("qwen3_moe", block, config)
    x = _inputs(1, dtype, seed=11)
    with torch.inference_mode():
        expected = moe(x)
        chosen = set(moe.router(x)[0][0].tolist())
        assert len(chosen) == config.num_experts_per_tok
        for expert in range(moe.experts.num_experts):
            if expert not in chosen:
                for weight in (moe.experts.gate_up[expert], moe.experts.down[expert]):
                    assert isinstance(weight, DenseWeight)
                    weight.weight.fill_(float("nan"))
        actual = moe(x)
    assert torch.isfinite(actual).all()
    assert torch.equal(actual, expected)


def test_router_and_experts_disagreeing_on_the_count_is_refused() -> None:
    config, block = _transformers_block("mixtral", torch.float32)
    moe = _ours("mixtral", block, config)
    router = TopKRouter(torch.zeros(4, HIDDEN), 2, normalize=True, weights_in_float32=True)
    with pytest.raises(ValueError, match="4 experts; the layer has 8"):
        SparseMoE(router, moe.experts, DistContext.single())


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_loaded_from_a_checkpoint_equals_transformers_layer(family: str, make_tiny_model: Any) -> None:
    """The checkpoint's names (Mixtral's block_sparse_moe.experts.N.w1/w3/w2, Qwen's mlp.experts.N.*_proj) load
    into the layer transformers builds from the same files."""
    model_dir = Path(make_tiny_model(family))
    config = ModelConfig.from_dir(model_dir)
    assert config.moe is not None
    with Weights(model_dir, dtype=torch.float32, device=torch.device("cpu"), dist=DistContext.single()) as weights:
        moe = SparseMoE.load(weights, "model.layers.1", config.moe)
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    block = hf.model.layers[1].mlp
    x = _inputs(9, torch.float32, seed=2)
    with torch.inference_mode():
        torch.testing.assert_close(moe(x), block(x[None])[0], rtol=0, atol=1e-5)
