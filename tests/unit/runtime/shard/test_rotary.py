"""Rotary embeddings against transformers' own rotary module, for every rope type we support."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from tgictl.errors import ConfigError, UnsupportedModelError
from tgictl.runtime.shard.layers.rotary import (
    ROPE_FREQUENCIES,
    RotaryEmbedding,
    apply_rotary,
)
from tgictl.runtime.shard.rope_config import ROPE_TYPES, parse_rope

HEAD_DIM = 16
MAX_POSITIONS = 64

ROPE_CASES: dict[str, dict[str, Any] | None] = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.5},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "yarn_mscale": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "beta_fast": 16.0,
        "beta_slow": 2.0,
        "mscale": 1.0,
        "mscale_all_dim": 0.5,
    },
    "longrope": {
        "rope_type": "longrope",
        "long_factor": [1.0 + 0.5 * i for i in range(HEAD_DIM // 2)],
        "short_factor": [1.0 + 0.1 * i for i in range(HEAD_DIM // 2)],
        "original_max_position_embeddings": 16,
    },
}


def _hf_config(rope: dict[str, Any] | None) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        rope_theta=500.0,
        rope_scaling=None if rope is None else dict(rope),
    )


def _ours(rope: dict[str, Any] | None) -> RotaryEmbedding:
    raw = {"rope_theta": 500.0, "rope_scaling": None if rope is None else dict(rope)}
    return RotaryEmbedding(parse_rope(raw, HEAD_DIM, MAX_POSITIONS), HEAD_DIM, MAX_POSITIONS, torch.device("cpu"))


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
@pytest.mark.parametrize("length", [10, 40, 100])  # below, at and beyond the original/trained lengths
def test_cos_sin_match_transformers(case: str, length: int) -> None:
    hf = LlamaRotaryEmbedding(_hf_config(ROPE_CASES[case]))
    ours = _ours(ROPE_CASES[case])
    positions = torch.arange(length)
    # transformers' length-dependent types look at max(position_ids) + 1 of the call: one sequence of `length`
    hf_cos, hf_sin = hf(torch.zeros(1, dtype=torch.float32), positions[None])
    # the model passes sequence lengths only to the types that read them; the others take their table
    seq_lens = torch.full((length,), length) if ours.needs_seq_lens else None
    cos, sin = ours(positions, seq_lens, torch.float32)
    assert cos.shape == (length, HEAD_DIM // 2)
    torch.testing.assert_close(cos, hf_cos[0, :, : HEAD_DIM // 2], rtol=0, atol=1e-6)
    torch.testing.assert_close(sin, hf_sin[0, :, : HEAD_DIM // 2], rtol=0, atol=1e-6)
    # transformers' table repeats the first half
    assert torch.equal(hf_cos[0, :, : HEAD_DIM // 2], hf_cos[0, :, HEAD_DIM // 2 :])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", sorted(c for c in ROPE_CASES if c not in ("dynamic", "longrope")))
def test_fixed_frequencies_come_from_tables_of_the_same_values(case: str, dtype: torch.dtype) -> None:
    ours = _ours(ROPE_CASES[case])
    first, _ = ours(torch.tensor([5, 0]), None, dtype)  # a first table of 1,024 positions
    positions = torch.randperm(3000)  # beyond it, in any order: the table grows
    cos, sin = ours(positions, None, dtype)
    direct_cos, direct_sin = ours._compute(positions, ours.inv_freq_for(None), dtype)
    assert cos.dtype == dtype and cos.shape == (3000, HEAD_DIM // 2)
    assert torch.equal(cos, direct_cos) and torch.equal(sin, direct_sin)
    assert torch.equal(first, direct_cos[positions.argsort()][[5, 0]])


def test_dynamic_rope_uses_each_tokens_own_sequence_length() -> None:
    ours = _ours(ROPE_CASES["dynamic"])
    short_alone, _ = ours(torch.arange(10), torch.full((10,), 10), torch.float32)
    long_alone, _ = ours(torch.arange(100), torch.full((100,), 100), torch.float32)
    # one batch: the 10-token sequence, then the 100-token one
    positions = torch.cat([torch.arange(10), torch.arange(100)])
    seq_lens = torch.cat([torch.full((10,), 10), torch.full((100,), 100)])
    mixed, _ = ours(positions, seq_lens, torch.float32)
    assert torch.equal(mixed[:10], short_alone)
    assert torch.equal(mixed[10:], long_alone)
    assert not torch.equal(long_alone[:10], short_alone)  # beyond max_position_embeddings the base grows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_rotary_matches_transformers_bit_for_bit(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    hf = LlamaRotaryEmbedding(_hf_config(None))
    positions = torch.arange(7) * 3
    q = torch.randn(7, 4, HEAD_DIM, generator=generator).to(dtype)  # [tokens, heads, dim]
    k = torch.randn(7, 2, HEAD_DIM, generator=generator).to(dtype)
    hf_cos, hf_sin = hf(q, positions[None])
    # transformers wants [batch, heads, tokens, dim]
    hf_q, hf_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], hf_cos, hf_sin)
    cos, sin = _ours(None)(positions, None, dtype)
    assert torch.equal(apply_rotary(q, cos, sin), hf_q[0].transpose(0, 1))
    assert torch.equal(apply_rotary(k, cos, sin), hf_k[0].transpose(0, 1))


def test_transformers4_and_transformers5_rope_keys_parse_alike() -> None:
    v4 = {"rope_theta": 1e6, "rope_scaling": {"type": "linear", "factor": 2.0}}
    v5 = {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}}
    assert parse_rope(v4, HEAD_DIM, MAX_POSITIONS) == parse_rope(v5, HEAD_DIM, MAX_POSITIONS)
    plain = parse_rope({"rope_theta": 1e6}, HEAD_DIM, MAX_POSITIONS)
    assert (plain.rope_type, plain.theta) == ("default", 1e6)
    assert parse_rope({}, HEAD_DIM, MAX_POSITIONS).theta == 10000.0


def test_llama3_original_length_defaults_to_max_positions() -> None:
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    rope = parse_rope({"rope_scaling": scaling}, HEAD_DIM, 8192)
    assert rope.original_max_position_embeddings == 8192


def test_config_and_rotary_know_the_same_rope_types() -> None:
    assert tuple(ROPE_FREQUENCIES) == ROPE_TYPES


def test_unknown_rope_type_lists_supported_ones() -> None:
    with pytest.raises(UnsupportedModelError, match="'mrope' is not supported; supported: default, linear"):
        parse_rope({"rope_scaling": {"type": "mrope"}}, HEAD_DIM, MAX_POSITIONS)


def test_scaled_rope_without_factor_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="'linear' needs a 'factor'"):
        parse_rope({"rope_scaling": {"rope_type": "linear"}}, HEAD_DIM, MAX_POSITIONS)
