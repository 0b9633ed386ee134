"""GGUF Q4_0 / Q4_1 blocks re-laid as int4 tiles at load, so the int4 kernels multiply them: torch's where its
packing is ours (AVX-512 builds), the C ones (csrc/quant_linear.c, int4_bf16.c, int4_rows_bf16.c) everywhere,
and the decode layers' C loop can run them (docs/architecture.md, "Weight formats"). On AVX2 (AMD Zen 3) the
C int4 kernel is 3.4x gguf_linear.c's Q4_1 at one row and 1.2-1.7x at 16-32 rows on SmolLM2's shapes.

Both types are 4-bit groups of 32 with one scale, which is int4's form W = (q - 8) * scale + zero:
    Q4_0: w = d (q - 8)   -> scale d, no zero stored (int4.py's symmetric form: the kernels take it as 0)
    Q4_1: w = d q + m     -> scale d, zero m + 8 d
The nibbles move unchanged and the storage is as large (Q4_0: 18 bytes per 32 weights, Q4_1: 20, either way;
Q4_0 once took a bf16 zero of 0 beside each scale, 20 bytes: on Llama-3.2-1B's shape 608 MB a decode step
against the file's 547); d and
m, float16 in the file, are held in the serving dtype, so in bfloat16 they round to 8 significant bits
(in float32 the weights equal the file's up to the rounding of m + 8 d). Other block types keep their
own kernels (gguf_weight.py).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from tgictl.kernels.linear_methods.base import LinearWeight
from tgictl.kernels.linear_methods.gguf_types import block_f16, block_nibbles
from tgictl.kernels.linear_methods.gguf_weight import GGUFWeight
from tgictl.kernels.linear_methods.int4 import TILE_ROWS, Int4Weight, torch_layout_matches
from tgictl.kernels.linear_methods.native import quant_kernels
from tgictl.log import get_logger

log = get_logger(__name__)

GROUP = 32
REPACKED_TYPES: frozenset[str] = frozenset({"Q4_0", "Q4_1"})


def repackable(weight: LinearWeight) -> bool:
    """Whether `weight` is Q4_0/Q4_1 blocks that an int4 kernel (torch's or the C one) can serve here."""
    return (isinstance(weight, GGUFWeight) and weight.block_type.name in REPACKED_TYPES
            and weight.data.device.type == "cpu" and (torch_layout_matches() or quant_kernels() is not None))


def as_int4_tiles(weight: GGUFWeight, *, zero_for_q4_0: bool | None = None) -> Int4Weight:
    """The same 4-bit weights as int4 tiles of group 32, scales in the weight's serving dtype. Q4_0's scales are
    stored alone where the C kernels serve them; with a zero of 0 beside each (`zero_for_q4_0`, by default only
    where torch's kernel, which reads pairs, is the one that can) they hold the same weights in 2 more bytes per
    32, the layout Q4_0 had before."""
    n, k = weight.shape
    blocks = weight.data.reshape(-1, weight.block_type.type_size)
    d = block_f16(blocks, 0)  # [n * k / 32, 1] float32
    if zero_for_q4_0 is None:
        zero_for_q4_0 = quant_kernels() is None
    if weight.block_type.name == "Q4_1":
        q, zero = block_nibbles(blocks[:, 4:], 16), block_f16(blocks, 2) + 8 * d
    else:
        q, zero = block_nibbles(blocks[:, 2:], 16), torch.zeros_like(d) if zero_for_q4_0 else None
    n_pad = -(-n // TILE_ROWS) * TILE_ROWS
    rows = (0, 0, 0, n_pad - n)  # padded rows are weights of 0: q 0 at scale 1 and zero 8, or q 8 at scale 1
    scale = F.pad(d.view(n, k // GROUP), rows, value=1.0).to(weight.dtype)
    if zero is not None:
        zero = F.pad(zero.view(n, k // GROUP), rows, value=8.0).to(weight.dtype)
    q = F.pad(q.reshape(n, k), rows, value=0 if zero is not None else 8)
    return Int4Weight.from_groups(q, scale, zero, GROUP, n, k)


@functools.cache
def _say_once(dtype: torch.dtype) -> None:
    log.info("GGUF Q4_0/Q4_1 blocks are held as int4 tiles (group 32, scales in %s; Q4_0's without zeros where the "
             "C kernels serve them) for the int4 kernels",
             str(dtype).removeprefix("torch."))


def served_form(weight: LinearWeight) -> LinearWeight:
    """`weight` as the shard serves it: Q4_0/Q4_1 as int4 tiles where torch's kernel reads them."""
    if not repackable(weight):
        return weight
    _say_once(weight.dtype)
    return as_int4_tiles(weight)  # type: ignore[arg-type]
