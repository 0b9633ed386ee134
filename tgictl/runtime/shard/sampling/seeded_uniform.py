"""A counter-based random number per (seed, step): the only randomness sampling uses.

A request's token at step s is drawn from ONE uniform number u = F(seed, s), so its tokens depend
only on its own seed, its step count and its own logits: never on which rows share its batch, where
it sits in the batch, or what was sampled before (there is no generator state to carry through
filter/concatenate, and every tensor-parallel rank computes the same u without communicating).

F is a keyed hash. The seed (a u64) is expanded once, in Python, into four 32-bit keys with
splitmix64; each step then runs Chris Wellons' `lowbias32` integer mixer over the step count, xor-ed
with the keys, in int64 tensors on the logits' device (no host sync). Every intermediate value stays
below 2**63, so the arithmetic is exact on every backend instead of relying on signed-overflow
wrapping. Two 32-bit outputs make a 53-bit float64 uniform in [0, 1): inverse-CDF sampling then
resolves probabilities down to ~1e-16 rather than the 2**-24 a float32 uniform would give.

Why inverse-CDF with one number per row rather than a Gumbel race with one number per vocab entry
or a torch.Generator per row: measured on CPU at B=32, V=49152 (scripts/bench_sampling.py prints
the comparison): hashing V numbers per row ~26 ms, per-row torch.Generator + exponential race
~41 ms, one hashed number per row + softmax/cumsum/searchsorted ~1.5 ms.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF
_MASK64 = 0xFFFFFFFFFFFFFFFF
_GOLDEN64 = 0x9E3779B97F4A7C15
KEYS_PER_SEED = 4


def splitmix64(state: int) -> tuple[int, int]:
    """One splitmix64 step on Python ints: (next state, output), both u64."""
    state = (state + _GOLDEN64) & _MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return state, z ^ (z >> 31)


def seed_keys(seed: int) -> tuple[int, int, int, int]:
    """The four 32-bit hash keys of a u64 seed (distinct seeds give unrelated keys)."""
    state, a = splitmix64(seed & _MASK64)
    _, b = splitmix64(state)
    return (a & _MASK32, a >> 32, b & _MASK32, b >> 32)


def seed_key_table(seeds: Sequence[int], device: torch.device | str) -> Tensor:
    """[len(seeds), 4] int64 table of seed_keys, built once per chooser."""
    rows = [seed_keys(s) for s in seeds]
    return torch.tensor(rows, dtype=torch.int64, device=device).reshape(len(rows), KEYS_PER_SEED)


def _mul32(x: Tensor, constant: int) -> Tensor:
    """(x * constant) mod 2**32 for x in [0, 2**32), without any product reaching 2**63."""
    if constant < 2**31:
        return (x * constant) & _MASK32
    # Split the constant: x*c = x*lo + (x*hi) * 2**16, and only the low 16 bits of x*hi survive.
    low, high = constant & 0xFFFF, constant >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & _MASK32


def lowbias32(x: Tensor) -> Tensor:
    """Wellons' lowbias32 mixer (a bijection on 32-bit values) on int64 tensors holding u32."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def lowbias32_int(x: int) -> int:
    """The same mixer on a Python int: the reference the tensor version is tested against."""
    x &= _MASK32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def seeded_uniform(keys: Tensor, steps: Tensor) -> Tensor:
    """u in [0, 1) per row from its seed keys and step count.

    keys: [R, 4] int64 from seed_key_table; steps: [R] int64 (tokens generated so far; only the low
    32 bits are used: no request generates 2**32 tokens). Returns [R] float64 on keys' device.
    """
    steps = steps.to(device=keys.device, dtype=torch.int64) & _MASK32
    # For a fixed seed each stage is xor-with-key then a bijection, so distinct steps never collide.
    mixed = lowbias32(steps ^ keys[:, 0])
    mixed = lowbias32(mixed ^ keys[:, 1])
    high = lowbias32(mixed ^ keys[:, 2])  # [R] u32
    low = lowbias32(high ^ keys[:, 3])  # [R] u32
    bits53 = (high << 21) | (low >> 11)  # < 2**53: exact in float64
    return bits53.to(torch.float64) * (1.0 / 2**53)


def uniform_from_keys(keys: Sequence[int], step: int) -> float:
    """seeded_uniform for one row on Python ints, the same value (bits53 / 2**53 is exact either way). The CPU
    sampler uses it: ~3 us a row, where the tensor version's ~40 small torch ops take ~120 us per call."""
    k0, k1, k2, k3 = keys
    mixed = lowbias32_int((step & _MASK32) ^ k0)
    mixed = lowbias32_int(mixed ^ k1)
    high = lowbias32_int(mixed ^ k2)
    low = lowbias32_int(high ^ k3)
    return ((high << 21) | (low >> 11)) / 2**53


def seeded_uniform_int(seed: int, step: int) -> float:
    """Pure-Python reference of seeded_uniform for one (seed, step)."""
    return uniform_from_keys(seed_keys(seed), step)
