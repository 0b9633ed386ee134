"""tgictl's paged forward against transformers (its own KV cache) on tiny random models of every family,
and the paged forward against itself: mixed batches, cached prefixes and chunked prefill."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from paged_forward import (
    BLOCK_SIZE,
    CPU,
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
from torch import Tensor
from transformers import AutoModelForCausalLM

from tgictl.errors import InvalidRequestError, UnsupportedModelError
from tgictl.kernels import build_attention_metadata
from tgictl.runtime.shard.families import supported_model_types
from tgictl.testing.tiny_models import FAMILIES

# Rope scalings whose effect shows within a short test: the trained/original length is 16 positions
# and a sequence reaches 11 + 16 = 27.
ROPE_VARIANTS: dict[str, dict[str, Any]] = {
    "llama3": {
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        }
    },
    "yarn": {
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
        "max_position_embeddings": 64,
    },
    "linear": {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    "dynamic": {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "max_position_embeddings": 16},
    "longrope": {
        "rope_scaling": {
            "rope_type": "longrope",
            "long_factor": [1.0 + 0.5 * i for i in range(8)],
            "short_factor": [1.0 + 0.1 * i for i in range(8)],
            "original_max_position_embeddings": 16,
        },
        "max_position_embeddings": 64,
    },
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_match_transformers(family: str, tiny_model_dirs: dict[str, Path]) -> None:
    assert parity(tiny_model_dirs[family]) <= PARITY_TOLERANCE


@pytest.mark.parametrize("variant", sorted(ROPE_VARIANTS))
def test_logits_match_transformers_with_rope_scaling(variant: str, make_tiny_model: Callable[..., Path]) -> None:
    assert parity(make_tiny_model("llama", **ROPE_VARIANTS[variant])) <= PARITY_TOLERANCE


def test_smollm2_logits_match_transformers(smollm2_dir: Path) -> None:
    """The real 30-layer model: float32 sums over 576..1536-wide rows and logits up to ~35 in size leave
    ~1e-4 of rounding difference (measured 8e-5 over a 40-token prompt and 16 steps)."""
    assert parity(smollm2_dir, steps=8) <= 5e-4


def test_untied_head_and_qwen2_bias_change_the_logits(tiny_model_dirs: dict[str, Path]) -> None:
    """Guards the parity tests: the tiny models are not degenerate (a missing bias would show)."""
    model = load(tiny_model_dirs["qwen2"])
    cache = model.allocate_kv_cache(NUM_BLOCKS, BLOCK_SIZE)
    seq = PagedSequence(shuffled_blocks(seed=3, count=4))
    (with_bias,) = forward(model, cache, [(seq, tokens(5, 6), 0)])
    model.layers[0].attention.qkv.bias.zero_()
    (without_bias,) = forward(model, cache, [(seq, tokens(5, 6), 0)])
    assert (with_bias - without_bias).abs().max().item() > 1e-2


def test_mixed_batch_equals_each_sequence_alone(tiny_model_dirs: dict[str, Path]) -> None:
    model = load(tiny_model_dirs["qwen3"])
    # (cached tokens, new tokens): a decode, a fresh prompt, a second prompt chunk, another decode
    layout = [(13, 1), (0, 9), (8, 5), (3, 1)]
    histories = [tokens(10 + i, cached + new) for i, (cached, new) in enumerate(layout)]
    results: dict[str, list[Tensor]] = {}
    for mode in ("alone", "batched"):
        cache = model.allocate_kv_cache(NUM_BLOCKS, BLOCK_SIZE)
        seqs = [PagedSequence(shuffled_blocks(seed=i, count=5, first=1 + 5 * i)) for i in range(len(layout))]
        for seq, history, (cached, _) in zip(seqs, histories, layout):
            if cached:  # the already-cached part, written by earlier steps
                forward(model, cache, [(seq, history[:cached], 0)])
        parts = [(seq, history[cached:], cached) for seq, history, (cached, _) in zip(seqs, histories, layout)]
        if mode == "alone":
            results[mode] = [forward(model, cache, [part], all_logits=True)[0] for part in parts]
        else:
            results[mode] = forward(model, cache, parts, all_logits=True)
    for alone, batched in zip(results["alone"], results["batched"]):
        assert alone.shape == batched.shape
        torch.testing.assert_close(batched, alone, rtol=0, atol=1e-5)


def test_cached_prefix_blocks_give_the_recomputed_logits(tiny_model_dirs: dict[str, Path]) -> None:
    """A second request whose first 2 blocks are shared (radix hit) computes only the rest."""
    model = load(tiny_model_dirs["llama"])
    cache = model.allocate_kv_cache(NUM_BLOCKS, BLOCK_SIZE)
    prompt = tokens(21, 14)
    first = PagedSequence([9, 4, 17, 2])
    (full,) = forward(model, cache, [(first, prompt, 0)], all_logits=True)
    cached = 2 * BLOCK_SIZE
    second = PagedSequence([9, 4, 30, 12])  # shares blocks 9 and 4, fresh blocks after them
    (suffix,) = forward(model, cache, [(second, prompt[cached:], cached)], all_logits=True)
    torch.testing.assert_close(suffix, full[cached:], rtol=0, atol=1e-5)
    # and decoding on from either copy agrees
    token = tokens(22, 1)
    (a,) = forward(model, cache, [(first, token, 14)])
    (b,) = forward(model, cache, [(second, token, 14)])
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_prompt_in_three_chunks_equals_one_prefill(tiny_model_dirs: dict[str, Path]) -> None:
    model = load(tiny_model_dirs["mistral"])
    prompt = tokens(31, 15)
    cache = model.allocate_kv_cache(NUM_BLOCKS, BLOCK_SIZE)
    (whole,) = forward(model, cache, [(PagedSequence(shuffled_blocks(1, 4)), prompt, 0)], all_logits=True)
    chunked_seq = PagedSequence(shuffled_blocks(2, 4, first=10))
    chunks = [
        forward(model, cache, [(chunked_seq, prompt[start:stop], start)], all_logits=True)[0]
        for start, stop in ((0, 6), (6, 11), (11, 15))
    ]
    torch.testing.assert_close(torch.cat(chunks), whole, rtol=0, atol=1e-5)


def test_logit_indices_select_rows(tiny_model_dirs: dict[str, Path]) -> None:
    model = load(tiny_model_dirs["llama"])
    seq = PagedSequence(shuffled_blocks(4, 3))
    prompt = tokens(41, 10)
    (every,) = forward(model, model.allocate_kv_cache(NUM_BLOCKS, BLOCK_SIZE), [(seq, prompt, 0)], all_logits=True)
    (last,) = forward(model, model.allocate_kv_cache(NUM_BLOCKS, BLOCK_SIZE), [(seq, prompt, 0)])
    assert every.shape == (10, 512) and last.shape == (1, 512)
    torch.testing.assert_close(last[0], every[-1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_forward_tracks_transformers(dtype: torch.dtype, tiny_model_dirs: dict[str, Path]) -> None:
    model_dir = tiny_model_dirs["qwen2"]
    model = load(model_dir, dtype)
    assert model.embed.weight.dtype == dtype
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager").eval()
    prompt = tokens(51, 12)
    cache = model.allocate_kv_cache(NUM_BLOCKS, BLOCK_SIZE)
    (ours,) = forward(model, cache, [(PagedSequence([3, 1, 2]), prompt, 0)], all_logits=True)
    reference, _ = hf_step(hf, prompt, None)
    assert ours.dtype == dtype  # the model's dtype: consumers widen what they use
    ours = ours.float()
    # Rounding differs in a few places (fused matmuls; the attention kernel works in float32) and the
    # differences accumulate over the layers: the bound is 8 units in the last place of the format at
    # the logits' magnitude (~10); measured: 2 for bfloat16, 4.5 for float16.
    mantissa_bits = {torch.bfloat16: 7, torch.float16: 10}[dtype]
    ulp = 2.0 ** (math.floor(math.log2(reference.abs().max().item())) - mantissa_bits)
    assert (ours - reference).abs().max().item() <= 8 * ulp
    assert torch.equal(ours.argmax(-1), reference.argmax(-1))


def test_unknown_model_type_lists_supported_ones(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    model_dir = tmp_path / "gpt2ish"
    shutil.copytree(tiny_model_dirs["llama"], model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    expected = f"'gpt2' is not supported; supported: {', '.join(supported_model_types())}"
    with pytest.raises(UnsupportedModelError, match=expected):
        load(model_dir)


def test_forward_checks_its_inputs_against_the_metadata(tiny_model_dirs: dict[str, Path]) -> None:
    model = load(tiny_model_dirs["llama"])
    cache = model.allocate_kv_cache(NUM_BLOCKS, BLOCK_SIZE)
    meta = build_attention_metadata([0], [3], [[1]], BLOCK_SIZE, CPU)
    ids, positions, slots = torch.tensor([5, 6, 7]), torch.arange(3), torch.arange(4, 7)
    with pytest.raises(InvalidRequestError, match="must all be \\[3\\]"):
        model(ids[:2], positions[:2], slots[:2], cache, meta, torch.tensor([1]))
    other_block_size = model.allocate_kv_cache(NUM_BLOCKS, 2 * BLOCK_SIZE)
    with pytest.raises(InvalidRequestError, match="block_size 8"):
        model(ids, positions, slots, other_block_size, meta, torch.tensor([2]))
    logits = model(ids, positions, slots, cache, meta, torch.tensor([2]))
    assert logits.is_inference()  # the forward ran under torch.inference_mode
