"""LoRA on every family's own projection names (FamilySpec.lora_targets: Phi-3's fused qkv_proj and gate_up_proj,
the seven separate ones elsewhere): greedy tokens with an adapter equal transformers + peft (float32), the base
model's rows beside them unchanged, sliding windows shorter than the prompt; a name the family lacks is refused."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

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
from tgictl.testing.tiny_models import FAMILIES, window_options

CPU = torch.device("cpu")
PROMPT = [5, 17, 33, 9, 250, 71, 12, 300, 2, 41, 64, 65, 66]
NEW_TOKENS = 8


def _runner(model_dir: Path, adapter: Path) -> ModelRunner:
    dist = DistContext.single()
    model = load_model(model_dir, dtype=torch.float32, device=CPU, dist=dist)
    attach_adapters(model, read_adapters([("a", adapter)], model.config, torch.float32), CPU)
    cache = KVCache.for_model(model.config, world_size=1, num_blocks=16, block_size=16, dtype=torch.float32,
                              device=CPU)
    return ModelRunner(model, cache, block_size=16, dist=dist, device=CPU, num_adapters=1)


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - {"llama"}))  # llama: test_lora_parity.py
def test_an_adapter_on_the_familys_projections_equals_peft(
    family: str, make_tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    model_dir = make_tiny_model(family, **window_options(family, 5))
    config = ModelConfig.from_dir(model_dir)
    # An MoE family's MLP names reach its experts, which PEFT adapts as target_parameters and tgictl refuses
    # (test_moe_lora.py): its attention projections only.
    targets = [name for name, block in config.family.lora_targets.items() if config.moe is None or block == "self_attn"]
    adapter = write_random_adapter(model_dir, tmp_path / "adapter", rank=4, targets=targets, seed=3)
    expected = {0: peft_greedy(model_dir, None, PROMPT, NEW_TOKENS), 1: peft_greedy(model_dir, adapter, PROMPT,
                                                                                     NEW_TOKENS)}
    assert expected[0] != expected[1]  # the adapter changes the output: the parity below is not the base model's
    runner = _runner(model_dir, adapter)
    pool = BlockPool()
    requests = tuple(
        dataclasses.replace(make_request(pool, k, PROMPT, max_new_tokens=NEW_TOKENS), adapter_index=k)
        for k in (0, 1)
    )
    batch = ShardBatch.from_batch(Batch(id=0, requests=requests), block_size=16, num_blocks=16,
                                  vocab_size=runner.vocab_size, device=CPU, num_adapters=1)
    outputs = Outputs()
    run_to_end(runner, batch, outputs)
    assert {k: outputs.ids(k) for k in (0, 1)} == expected


def test_a_target_the_family_lacks_is_refused(make_tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    llama = make_tiny_model("llama")
    adapter = write_random_adapter(llama, tmp_path / "llama-adapter", rank=4, targets=["q_proj"], seed=1)
    phi3 = ModelConfig.from_dir(make_tiny_model("phi3"))
    with pytest.raises(ConfigError, match="unknown target self_attn.q_proj .*supported: qkv_proj, o_proj"):
        read_adapters([("a", adapter)], phi3, torch.float32)
