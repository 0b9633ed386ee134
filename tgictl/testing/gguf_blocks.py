"""GGUF block data for tests: a float matrix quantized by the `gguf` package where it can quantize the type
(Q4_0, Q4_1, Q8_0), else blocks written by their spec (Q4_K, Q6_K: gguf-py only dequantizes those) with
random quants and scales and float16 factors chosen so the values are finite and of a usual size."""

from __future__ import annotations

import numpy as np

# Byte offsets of each K-quant block's float16 factors (d, and dmin for Q4_K), and their magnitude: random
# 6-bit scales times 4-bit quants (Q4_K), int8 scales times 6-bit quants (Q6_K) make typical weights of
# a few hundredths, as a trained model's.
_K_QUANT_FACTORS: dict[str, tuple[tuple[int, ...], tuple[float, float]]] = {
    "Q4_K": ((0, 2), (1e-4, 3e-4)),
    "Q6_K": ((208,), (3e-5, 8e-5)),
}


def quantized_blocks(type_name: str, weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """[rows, cols] float32 -> [rows, row_bytes] uint8 blocks of `type_name` (cols a block multiple).

    Types gguf-py quantizes encode `weights`; the K-quants ignore them and get random valid blocks.
    """
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = weights.shape
    if cols % block_size:
        raise ValueError(f"{type_name} needs columns in multiples of {block_size}, got {cols}")
    if type_name not in _K_QUANT_FACTORS:
        return np.ascontiguousarray(gguf.quants.quantize(weights.astype(np.float32), qtype))
    data = rng.integers(0, 256, (rows, cols // block_size * type_size), dtype=np.uint8)
    blocks = data.reshape(-1, type_size)
    offsets, magnitude = _K_QUANT_FACTORS[type_name]
    for offset in offsets:
        factors = rng.uniform(*magnitude, blocks.shape[0]) * rng.choice([-1.0, 1.0], blocks.shape[0])
        blocks[:, offset : offset + 2] = factors.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return data
