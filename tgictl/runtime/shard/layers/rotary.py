"""Rotary position embeddings: default, linear, dynamic (NTK), llama3, yarn and longrope.

Inverse frequencies follow transformers' modeling_rope_utils.py operation for operation, in float32,
so cos/sin match its values to float32 rounding (the tests hold them within 1e-6). The layout is the "rotate half" one HF
checkpoints use: dims [0, D/2) pair with [D/2, D).

Dynamic NTK and longrope depend on the sequence length. transformers uses the batch's longest
`max(position_ids) + 1`; a paged mixed batch has many sequences, so here each token uses ITS OWN
sequence's context length (cache_len + new_len), which is what transformers computes for that
sequence alone and keeps a request's output independent of who shares its batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

import torch
from torch import Tensor, nn

from tgictl.errors import ConfigError, InvalidRequestError, UnsupportedModelError
from tgictl.runtime.shard.rope_config import RopeConfig

T = TypeVar("T")


def _required(value: T | None, what: str) -> T:
    # parse_rope validates every rope type's keys; this only narrows the type for the checker.
    if value is None:
        raise ConfigError(f"rope parameters lack {what}")
    return value


def _exponents(dim: int, device: torch.device | None = None) -> Tensor:
    # arange(0, dim, 2) / dim: [dim // 2] float32
    return torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim


def default_inv_freq(theta: float, dim: int) -> Tensor:
    return 1.0 / (theta ** _exponents(dim))


def linear_inv_freq(rope: RopeConfig, dim: int) -> Tensor:
    return default_inv_freq(rope.theta, dim) / _required(rope.factor, "factor")


def llama3_inv_freq(rope: RopeConfig, dim: int) -> Tensor:
    factor = _required(rope.factor, "factor")
    low_factor = _required(rope.low_freq_factor, "low_freq_factor")
    high_factor = _required(rope.high_freq_factor, "high_freq_factor")
    old_context = _required(rope.original_max_position_embeddings, "original_max_position_embeddings")
    inv_freq = default_inv_freq(rope.theta, dim)
    low_wavelen = old_context / low_factor
    high_wavelen = old_context / high_factor
    wavelen = 2 * math.pi / inv_freq
    # long wavelengths are divided by factor, short ones kept, the band between interpolated
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_factor) / (high_factor - low_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_inv_freq(rope: RopeConfig, dim: int, max_positions: int) -> tuple[Tensor, float]:
    original = _required(rope.original_max_position_embeddings, "original_max_position_embeddings")
    factor = rope.factor if rope.factor is not None else max_positions / original
    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = float(_yarn_mscale(factor, rope.mscale) / _yarn_mscale(factor, rope.mscale_all_dim))
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = rope.beta_fast or 32
    beta_slow = rope.beta_slow or 1
    base = rope.theta

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoids a division by zero in the ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    extrapolation_weight = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight
    return inv_freq, attention_factor


def longrope_attention_factor(rope: RopeConfig, max_positions: int) -> float:
    original = _required(rope.original_max_position_embeddings, "original_max_position_embeddings")
    factor = rope.factor if rope.factor is not None else max_positions / original
    if rope.attention_factor is not None:
        return rope.attention_factor
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def longrope_inv_freq(rope: RopeConfig, dim: int, long: bool) -> Tensor:
    factors = _required(rope.long_factor if long else rope.short_factor, "long_factor/short_factor")
    return 1.0 / (torch.tensor(factors, dtype=torch.float32) * rope.theta ** _exponents(dim))


def dynamic_inv_freq(rope: RopeConfig, dim: int, max_positions: int, seq_lens: Tensor) -> Tensor:
    """seq_lens: [tokens] int64 -> per-token inverse frequencies [tokens, dim // 2]."""
    factor = _required(rope.factor, "factor")
    seq = torch.clamp(seq_lens, min=max_positions)  # below the trained length nothing is rescaled
    base = rope.theta * ((factor * seq / max_positions) - (factor - 1)) ** (dim / (dim - 2))  # [tokens] f32
    return 1.0 / (base[:, None] ** _exponents(dim, seq_lens.device)[None, :])


@dataclass(frozen=True)
class Frequencies:
    """What a rope type fixes at load: inverse frequencies [dim // 2] (None: computed per token), the
    long-context set (longrope only) and the factor cos/sin are multiplied by."""

    inv_freq: Tensor | None
    long_inv_freq: Tensor | None = None
    attention_scaling: float = 1.0


def _default(rope: RopeConfig, dim: int, max_positions: int) -> Frequencies:
    inv_freq = default_inv_freq(rope.theta, dim)
    if rope.frequency_divisors is not None:  # llama.cpp's rope_freqs (a GGUF's Llama 3 scaling)
        inv_freq = inv_freq / torch.tensor(rope.frequency_divisors, dtype=torch.float32)
    return Frequencies(inv_freq)


def _linear(rope: RopeConfig, dim: int, max_positions: int) -> Frequencies:
    return Frequencies(linear_inv_freq(rope, dim))


def _llama3(rope: RopeConfig, dim: int, max_positions: int) -> Frequencies:
    return Frequencies(llama3_inv_freq(rope, dim))


def _yarn(rope: RopeConfig, dim: int, max_positions: int) -> Frequencies:
    inv_freq, scaling = yarn_inv_freq(rope, dim, max_positions)
    return Frequencies(inv_freq, attention_scaling=scaling)


def _longrope(rope: RopeConfig, dim: int, max_positions: int) -> Frequencies:
    return Frequencies(
        longrope_inv_freq(rope, dim, long=False),
        longrope_inv_freq(rope, dim, long=True),
        longrope_attention_factor(rope, max_positions),
    )


def _dynamic(rope: RopeConfig, dim: int, max_positions: int) -> Frequencies:
    return Frequencies(None)  # depends on each token's sequence length: dynamic_inv_freq per forward


# rope_type -> what it fixes at load. rope_config.ROPE_TYPES lists the same names (a test checks).
ROPE_FREQUENCIES: Mapping[str, Callable[[RopeConfig, int, int], Frequencies]] = MappingProxyType(
    {
        "default": _default,
        "linear": _linear,
        "dynamic": _dynamic,
        "llama3": _llama3,
        "yarn": _yarn,
        "longrope": _longrope,
    }
)


class RotaryEmbedding(nn.Module):
    """cos/sin for given positions, shared by every layer of a forward."""

    def __init__(self, rope: RopeConfig, head_dim: int, max_positions: int, device: torch.device) -> None:
        super().__init__()
        self.rope = rope
        self.dim = head_dim
        self.max_positions = max_positions
        if rope.rope_type not in ROPE_FREQUENCIES:
            raise UnsupportedModelError(
                f"rope type {rope.rope_type!r} is not supported; supported: {', '.join(ROPE_FREQUENCIES)}"
            )
        fixed = ROPE_FREQUENCIES[rope.rope_type](rope, head_dim, max_positions)
        self.attention_scaling = fixed.attention_scaling
        self.inv_freq = None if fixed.inv_freq is None else fixed.inv_freq.to(device)  # [dim // 2] float32
        self.long_inv_freq = None if fixed.long_inv_freq is None else fixed.long_inv_freq.to(device)
        self._cached: dict[torch.dtype, tuple[Tensor, Tensor]] = {}  # forward's tables, per dtype

    @property
    def needs_seq_lens(self) -> bool:
        return self.rope.rope_type in ("dynamic", "longrope")

    def inv_freq_for(self, seq_lens: Tensor | None) -> Tensor:
        """[dim // 2] when the frequencies are fixed, else [tokens, dim // 2] from seq_lens [tokens]."""
        if self.rope.rope_type == "dynamic":
            if seq_lens is None:
                raise InvalidRequestError("dynamic rope needs each token's sequence length")
            return dynamic_inv_freq(self.rope, self.dim, self.max_positions, seq_lens)
        inv_freq = _required(self.inv_freq, "inverse frequencies")
        if self.rope.rope_type == "longrope":
            if seq_lens is None:
                raise InvalidRequestError("longrope needs each token's sequence length")
            original = self.rope.original_max_position_embeddings
            use_long = (seq_lens > original)[:, None]  # [tokens, 1]
            return torch.where(use_long, _required(self.long_inv_freq, "long_factor"), inv_freq)
        return inv_freq

    def forward(self, positions: Tensor, seq_lens: Tensor | None, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """positions: [tokens] int64 -> (cos, sin), each [tokens, dim // 2] in `dtype`.

        Only the first half is returned: transformers' table repeats it (cat(freqs, freqs)). With fixed
        frequencies, rows of a table of positions 0..N-1 computed by the same operations (the same values:
        each is elementwise, and the table's size keeps every thread's share whole vectors): a decode step
        then makes three torch calls instead of eight, each ~10 us with the caches cold after the weights.
        """
        if seq_lens is None and not self.needs_seq_lens and positions.device.type == "cpu":  # CUDA: no sync for max
            cos_table, sin_table = self._tables(int(positions.max()) + 1 if positions.numel() else 0, dtype)
            return cos_table.index_select(0, positions), sin_table.index_select(0, positions)
        return self._compute(positions, self.inv_freq_for(seq_lens), dtype)

    def _compute(self, positions: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        freqs = positions[:, None].float() * inv_freq  # [tokens, dim // 2]
        cos = freqs.cos() * self.attention_scaling
        sin = freqs.sin() * self.attention_scaling
        return cos.to(dtype), sin.to(dtype)

    def _tables(self, rows: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin of positions 0 .. at least rows - 1 in `dtype`, grown by doubling (from 1,024 rows: a
        power of two, so a parallel elementwise op splits it into whole vectors)."""
        tables = self._cached.get(dtype)
        if tables is None or tables[0].shape[0] < rows:
            size = max(1024, 1 << max(rows - 1, 0).bit_length())
            inv_freq = self.inv_freq_for(None)
            positions = torch.arange(size, dtype=torch.int64, device=inv_freq.device)
            tables = self._compute(positions, inv_freq, dtype)
            self._cached[dtype] = tables
        return tables


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [tokens, heads, dim]; cos, sin: [tokens, dim // 2] -> rotated x [tokens, heads, dim].

    Same arithmetic as transformers' `x * cos + rotate_half(x) * sin`, written per half: the first
    half is x1*c + (-x2)*s = x1*c - x2*s exactly, the second x2*c + x1*s.
    """
    x1, x2 = x.chunk(2, dim=-1)  # each [tokens, heads, dim // 2]
    c = cos[:, None, :]
    s = sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
