"""Every family against transformers on tiny random checkpoints that exercise its differences (float32): logits
within 1e-4 with sliding windows shorter than the sequence, soft-caps that bind, rotary scaled past its original
length; each difference moves the logits (so the checkpoints do exercise it); greedy tokens equal transformers'
`generate`, and stay the same from a prefix-cache hit and in a continuation round past the window; bf16 is as
close to float32 as transformers' bf16 is."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from paged_forward import (
    BLOCK_SIZE,
    NUM_BLOCKS,
    PARITY_TOLERANCE,
    PagedSequence,
    forward,
    hf_step,
    load,
    parity,
    tokens,
)
from shard_helpers import BlockPool, Outputs, make_request, make_runner, run_to_end, shard_batch
from transformers import AutoModelForCausalLM

from tgictl.runtime.shard import families
from tgictl.runtime.shard.family_spec import FamilySpec
from tgictl.testing.tiny_models import FAMILIES, window_options

WINDOW = 5  # shorter than the parity test's 11-token prompt and the generation tests' 37
WINDOWED: dict[str, dict[str, Any]] = {f: window_options(f, WINDOW) for f in FAMILIES if window_options(f, WINDOW)}
# Rotary scaled past the original length (16 positions; sequences reach 27), per family that can carry it.
SCALED_ROPE: dict[str, dict[str, Any]] = {
    "llama 3.2 (llama3 scaling, tied head)": {"family": "llama", "tie_word_embeddings": True, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}},
    "phi3 longrope, partial rotary": {"family": "phi3", "max_position_embeddings": 64, "rope_scaling": {
        "rope_type": "longrope", "long_factor": [1.0 + 0.5 * i for i in range(4)],
        "short_factor": [1.0 + 0.1 * i for i in range(4)]}, "original_max_position_embeddings": 16},
    "gemma3 linear scaling of the global layers": {"family": "gemma3_text", "sliding_window": WINDOW,
                                                   "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    "granite yarn": {"family": "granite", "max_position_embeddings": 64, "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}},
}
# Per family, the spec fields that make it differ from Llama, each set back to Llama's value in turn.
DIFFERENCES: dict[str, tuple[str, ...]] = {
    "qwen2": ("qkv_bias",),
    "qwen3": ("qk_norm",),
    "gemma2": ("layout", "norm_offset", "attention_scale", "attention_softcap", "activation", "embedding_scale",
               "final_softcap", "windows"),
    "gemma3_text": ("qk_norm", "final_softcap", "windows", "ropes"),
    "phi3": ("rotary_dim", "windows"),
    "mistral": ("windows",),
    "smollm3": ("ropes", "windows"),
    "olmo2": ("qk_norm",),
    "granite": ("attention_scale", "embedding_scale", "residual_scale", "logits_divisor"),
}


def _without(spec: FamilySpec, difference: str) -> FamilySpec:
    if difference == "windows":
        return dataclasses.replace(spec, layers=tuple(dataclasses.replace(layer, window=None) for layer in spec.layers))
    if difference == "ropes":  # every layer with the first positioned layer's rotary
        rope = next(layer.rope for layer in spec.layers if layer.rope is not None)
        return dataclasses.replace(spec, layers=tuple(dataclasses.replace(layer, rope=rope) for layer in spec.layers))
    if difference == "qk_norm" and spec.layout == "post_norm":  # OLMo2's norms are over all heads; none at all
        return dataclasses.replace(spec, qk_norm="none")
    return dataclasses.replace(spec, **{difference: getattr(FamilySpec(), difference)})


def _prompt_logits(model_dir: Path) -> torch.Tensor:
    model = load(model_dir)
    cache = model.allocate_kv_cache(NUM_BLOCKS, BLOCK_SIZE)
    (logits,) = forward(model, cache, [(PagedSequence(list(range(1, 7))), tokens(9, 21), 0)], all_logits=True)
    return logits


@pytest.mark.parametrize("family", sorted(WINDOWED))
def test_windowed_logits_match_transformers(family: str, make_tiny_model: Callable[..., Path]) -> None:
    assert parity(make_tiny_model(family, **WINDOWED[family])) <= PARITY_TOLERANCE


@pytest.mark.parametrize("variant", sorted(SCALED_ROPE))
def test_scaled_rotary_past_the_original_length_matches_transformers(
    variant: str, make_tiny_model: Callable[..., Path]
) -> None:
    options = dict(SCALED_ROPE[variant])
    assert parity(make_tiny_model(options.pop("family"), **options)) <= PARITY_TOLERANCE


@pytest.mark.parametrize("family, difference", [(f, d) for f, ds in DIFFERENCES.items() for d in ds])
def test_each_difference_moves_the_logits(family: str, difference: str, make_tiny_model: Callable[..., Path],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny checkpoints exercise every difference: the same weights computed without it give other logits
    (so a family that dropped it could not pass the parity tests)."""
    model_dir = make_tiny_model(family, **WINDOWED.get(family, {}))
    exact = _prompt_logits(model_dir)
    family_entry = families.FAMILIES[family]
    changed = families.Family(lambda config, dims: _without(family_entry.spec(config, dims), difference),
                              family_entry.gguf_architecture)
    monkeypatch.setattr(families, "FAMILIES", {**families.FAMILIES, family: changed})
    assert (_prompt_logits(model_dir) - exact).abs().max().item() > 1e-2


def _transformers_greedy(model_dir: Path, prompt: list[int], new_tokens: int) -> list[int]:
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_tokens_prefix_hits_and_continuations_match_transformers(
    family: str, make_tiny_model: Callable[..., Path]
) -> None:
    """A 37-token prompt (windows of 5): greedy tokens equal transformers'; a second request reusing the first's
    two cached blocks (32 positions, far past the window) and a continuation round (the prompt and 8 generated
    tokens, 32 of them cached) give the same tokens."""
    model_dir = make_tiny_model(family, **WINDOWED.get(family, {}))
    prompt = tokens(17, 37).tolist()
    expected = _transformers_greedy(model_dir, prompt, 12)
    runner = make_runner(model_dir, num_blocks=32)
    pool = BlockPool()
    first = make_request(pool, 0, prompt, max_new_tokens=12, ignore_eos=True)
    outputs = Outputs()
    run_to_end(runner, shard_batch(runner, 0, [first]), outputs)
    assert outputs.ids(0) == expected
    cached = 2 * 16  # whole blocks of the first request, as the router's radix cache hands them out
    shared = first.blocks[:2] + pool.take(len(prompt) + 11)[2:]
    hit = make_request(pool, 1, prompt, max_new_tokens=12, ignore_eos=True, cache_len=cached, blocks=shared)
    continued = make_request(pool, 2, prompt + expected[:8], max_new_tokens=4, ignore_eos=True, cache_len=cached,
                             blocks=first.blocks)
    for rid, request in ((1, hit), (2, continued)):
        run_to_end(runner, shard_batch(runner, rid, [request]), outputs)
    assert outputs.ids(1) == expected
    assert outputs.ids(2) == expected[8:]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_bfloat16_is_as_close_to_float32_as_transformers_bfloat16(
    family: str, make_tiny_model: Callable[..., Path]
) -> None:
    """bf16 rounds differently at many places (fused matmuls, float32 attention, the C kernels), so its logits
    are compared with the float32 truth: no further from it than transformers' own bf16 forward is (x1.5), and
    the same argmax wherever the truth's best logit leads by more than both errors together."""
    model_dir = make_tiny_model(family, **WINDOWED.get(family, {}))
    prompt = tokens(51, 12)
    truth, _ = hf_step(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                            attn_implementation="eager").eval(), prompt, None)
    theirs, _ = hf_step(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16,
                                                             attn_implementation="eager").eval(), prompt, None)
    model = load(model_dir, torch.bfloat16)
    (ours,) = forward(model, model.allocate_kv_cache(NUM_BLOCKS, BLOCK_SIZE), [(PagedSequence([3, 1, 2]), prompt, 0)],
                      all_logits=True)
    our_error, their_error = (ours.float() - truth).abs().max().item(), (theirs - truth).abs().max().item()
    assert our_error <= 1.5 * their_error
    top2 = truth.topk(2, dim=-1).values
    clear = top2[:, 0] - top2[:, 1] > our_error + their_error
    assert torch.equal(ours.float().argmax(-1)[clear], truth.argmax(-1)[clear])
