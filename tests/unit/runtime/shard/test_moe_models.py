"""Mixtral and Qwen3-MoE served by the shard against transformers on tiny random checkpoints whose batches route
rows to different experts: float32 logits within 1e-4 and greedy tokens equal (alone and in one growing batch), bf16
close, the bytes held (dense and sparse layers, every expert, --quantize int8/int4) the profile's estimate,
prefix-cache hits and continuation rounds exact, and refused config fields named. --quantize's logits against the
dequantized experts: test_quantized_models.py, which runs every family."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from shard_helpers import BlockPool, Outputs, make_request, make_runner, shard_batch, step
from paged_forward import (
    BLOCK_SIZE,
    NUM_BLOCKS,
    PARITY_TOLERANCE,
    PagedSequence,
    forward,
    hf_step,
    load,
    parity,
    shuffled_blocks,
    tokens,
)
from transformers import AutoModelForCausalLM

from tgictl.errors import ConfigError, UnsupportedModelError
from tgictl.quantization import QuantizeSpec
from tgictl.runtime.shard.batch import ShardBatch
from tgictl.runtime.profile.model_shape import model_shape, weight_bytes_per_shard
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.layers.mlp import GatedMLP
from tgictl.runtime.shard.layers.moe import SparseMoE
from tgictl.runtime.shard.models.registry import load_model, packing_candidates, weight_bytes
from tgictl.runtime.shard.moe_config import MIXTRAL_NAMES, QWEN_MOE_NAMES

CPU = torch.device("cpu")
# Each variant exercises one routing setting: Mixtral's top 2 of 8; Qwen3-MoE's top 4 of 16 renormalised or not;
# dense layers among the sparse ones (mlp_only_layers, decoder_sparse_step).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "mixtral": ("mixtral", {}),
    "qwen3_moe": ("qwen3_moe", {}),
    "qwen3_moe without norm_topk_prob": ("qwen3_moe", {"norm_topk_prob": False}),
    "qwen3_moe dense layers": ("qwen3_moe", {"num_layers": 4, "mlp_only_layers": [0], "decoder_sparse_step": 2}),
}
GREEDY_STEPS = 24


@pytest.fixture(scope="module")
def variant_dirs(make_tiny_model: Callable[..., Path]) -> dict[str, Path]:
    return {name: make_tiny_model(family, **options) for name, (family, options) in VARIANTS.items()}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_float32_logits_match_transformers(variant: str, variant_dirs: dict[str, Path]) -> None:
    assert parity(variant_dirs[variant]) <= PARITY_TOLERANCE


def test_dense_and_sparse_layers_follow_the_config(variant_dirs: dict[str, Path]) -> None:
    model = load(variant_dirs["qwen3_moe dense layers"])
    kinds = [type(layer.mlp) for layer in model.layers]
    assert kinds == [GatedMLP, SparseMoE, GatedMLP, SparseMoE]  # layer 0 listed, then every second layer
    assert model.plain_layer_stack() is None  # an MoE model never runs the dense C decode loop


def test_experts_get_no_packed_copy(variant_dirs: dict[str, Path]) -> None:
    """A oneDNN copy of every expert would double most of an MoE model's bytes for rows a decode step rarely has."""
    model = load(variant_dirs["mixtral"], torch.bfloat16)
    candidates = {id(w) for w in packing_candidates(model)}
    experts = model.layers[0].mlp.experts
    assert not candidates & {id(w) for w in (*experts.gate_up, *experts.down)}
    assert id(model.layers[0].attention.qkv.weight) in candidates


def _prompts(count: int) -> list[list[int]]:
    return [tokens(100 + i, 5 + 3 * i).tolist() for i in range(count)]


def _transformers_greedy(model_dir: Path, prompts: list[list[int]], steps: int) -> list[list[int]]:
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # every step: the shard's requests ignore EOS
    out = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            generated = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=steps,
                                    pad_token_id=0)
            out.append(generated[0, len(prompt):].tolist())
    return out


@pytest.mark.parametrize("variant", ["mixtral", "qwen3_moe dense layers"])
def test_greedy_tokens_of_a_growing_batch_equal_transformers(variant: str, variant_dirs: dict[str, Path]) -> None:
    """Six prompts: three prefilled together, three joining the running rows' decode steps (one in chunks); every
    step's rows are routed to different experts, and each row's tokens are those transformers gives it alone."""
    model_dir = variant_dirs[variant]
    prompts = _prompts(6)
    expected = _transformers_greedy(model_dir, prompts, GREEDY_STEPS)
    runner = make_runner(model_dir, num_blocks=128)
    runner.set_max_prefill_tokens(12)
    pool = BlockPool()
    requests = [make_request(pool, rid, p, max_new_tokens=GREEDY_STEPS, ignore_eos=True) for rid, p in
                enumerate(prompts)]
    requests[5] = make_request(pool, 5, prompts[5], max_new_tokens=GREEDY_STEPS, ignore_eos=True, chunk_len=6,
                               blocks=requests[5].blocks)
    joins = {0: [0, 1, 2], 4: [3, 4, 5]}
    outputs = Outputs()
    batch = None
    for step_index in range(200):
        if step_index in joins:
            new = shard_batch(runner, step_index, [requests[rid] for rid in joins[step_index]])
            batch = new if batch is None else ShardBatch.concatenate([batch, new])
        if batch is None:
            break
        batch = step(runner, batch, outputs)
    for rid, wanted in enumerate(expected):
        assert outputs.ids(rid) == wanted, f"prompt {rid}"


def test_mixed_batch_equals_each_sequence_alone(variant_dirs: dict[str, Path]) -> None:
    """A decode row, a fresh prompt and a prompt's second chunk in one forward give each row's logits alone."""
    model = load(variant_dirs["qwen3_moe"])
    layout = [(13, 1), (0, 9), (8, 5)]  # (cached tokens, new tokens)
    histories = [tokens(60 + i, cached + new) for i, (cached, new) in enumerate(layout)]
    results = {}
    for mode in ("alone", "batched"):
        cache = model.allocate_kv_cache(NUM_BLOCKS, BLOCK_SIZE)
        seqs = [PagedSequence(shuffled_blocks(seed=i, count=5, first=1 + 5 * i)) for i in range(len(layout))]
        for seq, history, (cached, _) in zip(seqs, histories, layout):
            if cached:
                forward(model, cache, [(seq, history[:cached], 0)])
        parts = [(seq, history[cached:], cached) for seq, history, (cached, _) in zip(seqs, histories, layout)]
        results[mode] = [forward(model, cache, [part], all_logits=True)[0] for part in parts] if mode == "alone" \
            else forward(model, cache, parts, all_logits=True)
    for alone, batched in zip(results["alone"], results["batched"]):
        torch.testing.assert_close(batched, alone, rtol=0, atol=1e-5)


@pytest.mark.parametrize("variant", ["mixtral", "qwen3_moe"])
def test_prefix_hit_and_continuation_round_compute_the_same_logits(variant: str,
                                                                  variant_dirs: dict[str, Path]) -> None:
    """A continuation round is a new prefill of prompt + generated tokens whose prefix blocks the radix cache
    holds: it computes only the rest and its logits are those of decoding on in the first round."""
    model = load(variant_dirs[variant])
    cache = model.allocate_kv_cache(NUM_BLOCKS, BLOCK_SIZE)
    first = PagedSequence([9, 4, 17, 2, 21, 30])
    prompt = tokens(71, 10)
    (logits,) = forward(model, cache, [(first, prompt, 0)])
    generated = []
    for position in range(10, 19):  # the first round decodes greedily
        token = logits[-1].argmax().reshape(1)
        generated.append(token)
        (logits,) = forward(model, cache, [(first, token, position)])
    history = torch.cat([prompt, *generated])  # 19 tokens; the first 4 blocks (16 tokens) are cached
    second = PagedSequence([9, 4, 17, 2, 40, 41])
    cached = 4 * BLOCK_SIZE
    (round_two,) = forward(model, cache, [(second, history[cached:], cached)], all_logits=True)
    torch.testing.assert_close(round_two[-1], logits[-1], rtol=0, atol=1e-5)


def test_bfloat16_tracks_transformers(variant_dirs: dict[str, Path]) -> None:
    model_dir = variant_dirs["mixtral"]
    model = load(model_dir, torch.bfloat16)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    prompt = tokens(81, 12)
    cache = model.allocate_kv_cache(NUM_BLOCKS, BLOCK_SIZE)
    (ours,) = forward(model, cache, [(PagedSequence([3, 1, 2]), prompt, 0)], all_logits=True)
    reference, _ = hf_step(hf, prompt, None)
    # As the dense families' bf16 test: a few ulps of the logits' magnitude (rounding in other places).
    ulp = 2.0 ** (torch.floor(torch.log2(reference.abs().max())).item() - 7)
    assert (ours.float() - reference).abs().max().item() <= 8 * ulp
    assert torch.equal(ours.float().argmax(-1), reference.argmax(-1))


# Shapes in multiples of 64 (the int4 tile), so the profile's estimate of the held bytes is exact.
QUANT_SHAPE = {"hidden_size": 128, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 128,
               "moe_intermediate_size": 64, "num_experts": 8, "num_experts_per_tok": 2}
SPECS = {"int8": QuantizeSpec("int8"), "int4/g32": QuantizeSpec("int4", 32)}


@pytest.mark.parametrize("label", [None, *SPECS])
def test_held_bytes_are_the_profile_estimate(label: str | None, make_tiny_model: Callable[..., Path]) -> None:
    """Every expert's weights are held (the profile counts them all), dense, int8 or int4."""
    spec = SPECS[label] if label else None
    model_dir = make_tiny_model("qwen3_moe", num_layers=3, mlp_only_layers=[1], **QUANT_SHAPE)
    model = load_model(model_dir, dtype=torch.bfloat16, device=CPU, dist=DistContext.single(), quantize=spec)
    shape = model_shape(json.loads((model_dir / "config.json").read_text()))
    assert shape.sparse_layers == 2 and shape.dense_mlp_layers == 1
    assert weight_bytes(model) == weight_bytes_per_shard(shape, 1, 2, spec, None)[0]


@pytest.mark.parametrize(("field", "value", "error"), [
    ("shared_expert_intermediate_size", 64, UnsupportedModelError),
    ("scoring_func", "sigmoid", UnsupportedModelError),
    ("num_experts_per_tok", 17, ConfigError),
    ("mlp_only_layers", [5], ConfigError),
])
def test_a_setting_the_router_lacks_is_one_error_naming_it(field: str, value: Any, error: type[Exception],
                                                          variant_dirs: dict[str, Path], tmp_path: Path) -> None:
    model_dir = shutil.copytree(variant_dirs["qwen3_moe"], tmp_path / "model")
    config = json.loads((model_dir / "config.json").read_text())
    config[field] = value
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(error, match=field) as raised:
        load(model_dir)
    assert "\n" not in str(raised.value)


def test_checkpoint_names_of_both_families(variant_dirs: dict[str, Path]) -> None:
    """The tiny checkpoints carry the names the families' real checkpoints use."""
    for variant, names in (("mixtral", MIXTRAL_NAMES), ("qwen3_moe", QWEN_MOE_NAMES)):
        tensors = load_file(str(variant_dirs[variant] / "model.safetensors"))
        for projection in (names.gate, names.up, names.down):
            assert names.expert("model.layers.0", 3, projection) in tensors
        assert f"model.layers.0.{names.block}.{names.router}.weight" in tensors
