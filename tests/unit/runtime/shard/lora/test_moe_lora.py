"""LoRA on mixture-of-experts models: adapters on the attention projections give peft's greedy tokens, one on a
Qwen3-MoE dense layer's MLP gives transformers' tokens on the merged weights; an adapter for the experts or the
routers (PEFT's target_parameters, which it adds for MLP targets of an MoE model, or per-expert names) is one
start-up error naming it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.lora_adapters import peft_greedy, write_random_adapter
from tests.unit.runtime.shard.shard_helpers import BlockPool, Outputs, make_request, run_to_end
from tgictl.errors import ConfigError
from tgictl.proto.messages import Batch
from tgictl.runtime.shard.batch import ShardBatch
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.kv_cache import KVCache
from tgictl.runtime.shard.lora.attach import attach_adapters, read_adapters
from tgictl.runtime.shard.model_config import ModelConfig
from tgictl.runtime.shard.models.registry import load_model
from tgictl.runtime.shard.step import ModelRunner

CPU = torch.device("cpu")
NEW_TOKENS = 10
PROMPTS = ([5, 17, 33, 9, 250, 71, 12], [300, 2, 2, 41, 8])
QWEN_DENSE_FIRST = {"num_layers": 3, "mlp_only_layers": [0]}  # layer 0 dense, layers 1 and 2 sparse


def _greedy_with_adapter(model_dir: Path, adapter: Path) -> dict[tuple[int, int], list[int]]:
    """{(prompt, adapter index): tokens} for each prompt with the adapter (1) and without (0), in one batch."""
    dist = DistContext.single()
    model = load_model(model_dir, dtype=torch.float32, device=CPU, dist=dist)
    assert attach_adapters(model, read_adapters([("a", adapter)], model.config, torch.float32), CPU) > 0
    cache = KVCache.for_model(model.config, world_size=1, num_blocks=32, block_size=16, dtype=torch.float32,
                              device=CPU)
    runner = ModelRunner(model, cache, block_size=16, dist=dist, device=CPU, num_adapters=1)
    rows = [(p, k) for p in range(len(PROMPTS)) for k in (0, 1)]
    pool = BlockPool()
    requests = tuple(replace(make_request(pool, rid, PROMPTS[p], max_new_tokens=NEW_TOKENS), adapter_index=k)
                     for rid, (p, k) in enumerate(rows))
    batch = ShardBatch.from_batch(Batch(id=0, requests=requests), block_size=16, num_blocks=32,
                                  vocab_size=runner.vocab_size, device=CPU, num_adapters=1)
    outputs = Outputs()
    run_to_end(runner, batch, outputs)
    return {row: outputs.ids(rid) for rid, row in enumerate(rows)}


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_attention_adapters_equal_peft(family: str, make_tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    model_dir = make_tiny_model(family)
    adapter = write_random_adapter(model_dir, tmp_path / "adapter", rank=4,
                                   targets=("q_proj", "k_proj", "v_proj", "o_proj"), seed=3)
    ours = _greedy_with_adapter(model_dir, adapter)
    for p, prompt in enumerate(PROMPTS):
        assert ours[(p, 1)] == peft_greedy(model_dir, adapter, prompt, NEW_TOKENS)
        assert ours[(p, 0)] == peft_greedy(model_dir, None, prompt, NEW_TOKENS)
    assert ours[(0, 1)] != ours[(0, 0)]  # the adapter changes the output


def test_dense_layer_mlp_adapter_equals_the_merged_weights(make_tiny_model: Callable[..., Path],
                                                           tmp_path: Path) -> None:
    """PEFT cannot write an MLP adapter for an MoE model without the experts (it adds them as target_parameters),
    so the adapter is written by hand and the oracle is transformers on W + (alpha / r) B A."""
    model_dir = make_tiny_model("qwen3_moe", **QWEN_DENSE_FIRST)
    config = ModelConfig.from_dir(model_dir)
    rank, alpha = 4, 8.0
    generator = torch.Generator().manual_seed(9)
    shapes = {"mlp.gate_proj": (config.intermediate_size, config.hidden_size),
              "mlp.up_proj": (config.intermediate_size, config.hidden_size),
              "mlp.down_proj": (config.hidden_size, config.intermediate_size),
              "self_attn.q_proj": (config.num_heads * config.head_dim, config.hidden_size)}
    factors = {}
    for module, (out, inp) in shapes.items():
        prefix = f"base_model.model.model.layers.0.{module}"
        factors[f"{prefix}.lora_A.weight"] = torch.randn(rank, inp, generator=generator) * 0.3
        factors[f"{prefix}.lora_B.weight"] = torch.randn(out, rank, generator=generator) * 0.3
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": alpha}))
    save_file(factors, str(adapter / "adapter_model.safetensors"))
    merged = shutil.copytree(model_dir, tmp_path / "merged")
    tensors = load_file(str(merged / "model.safetensors"))
    for module in shapes:
        prefix = f"base_model.model.model.layers.0.{module}"
        delta = factors[f"{prefix}.lora_B.weight"] @ factors[f"{prefix}.lora_A.weight"] * (alpha / rank)
        tensors[f"model.layers.0.{module}.weight"] = tensors[f"model.layers.0.{module}.weight"] + delta
    save_file(tensors, str(merged / "model.safetensors"))
    ours = _greedy_with_adapter(model_dir, adapter)
    for p, prompt in enumerate(PROMPTS):
        assert ours[(p, 1)] == peft_greedy(merged, None, prompt, NEW_TOKENS)
    assert ours[(0, 1)] != ours[(0, 0)]


def test_peft_mlp_targets_on_an_moe_model_are_refused_as_expert_lora(make_tiny_model: Callable[..., Path],
                                                                    tmp_path: Path) -> None:
    model_dir = make_tiny_model("qwen3_moe", **QWEN_DENSE_FIRST)
    adapter = write_random_adapter(model_dir, tmp_path / "adapter", rank=4,
                                   targets=("q_proj", "gate_proj", "up_proj", "down_proj"))
    assert json.loads((adapter / "adapter_config.json").read_text())["target_parameters"]  # PEFT added the experts
    with pytest.raises(ConfigError, match="target_parameters") as raised:
        read_adapters([("mlp", adapter)], ModelConfig.from_dir(model_dir), torch.float32)
    assert "experts" in str(raised.value) and "\n" not in str(raised.value)


def _adapter_with(directory: Path, module: str, hidden: int) -> Path:
    directory.mkdir()
    (directory / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4}))
    key = f"base_model.model.model.{module}"
    save_file({f"{key}.lora_A.weight": torch.zeros(2, hidden), f"{key}.lora_B.weight": torch.zeros(hidden, 2)},
              str(directory / "adapter_model.safetensors"))
    return directory


@pytest.mark.parametrize(("family", "module"), [
    ("qwen3_moe", "layers.1.mlp.experts.3.gate_proj"),  # PEFT's name for an expert of a per-expert model
    ("qwen3_moe", "layers.1.mlp.gate"),  # the router
    ("qwen3_moe", "layers.1.mlp.down_proj"),  # a dense projection on a sparse layer: it has none
    ("mixtral", "layers.0.block_sparse_moe.experts.0.w1"),
])
def test_expert_and_router_names_are_one_startup_error(family: str, module: str,
                                                       make_tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    model_dir = make_tiny_model(family, **(QWEN_DENSE_FIRST if family == "qwen3_moe" else {}))
    adapter = _adapter_with(tmp_path / "adapter", module, 64)
    with pytest.raises(ConfigError, match="LoRA on experts and routers is not supported") as raised:
        read_adapters([("experts", adapter)], ModelConfig.from_dir(model_dir), torch.float32)
    message = str(raised.value)
    assert module in message and "'experts'" in message and "\n" not in message
