"""bf16 weights held a second time in oneDNN's own blocked layout, for the decode-sized matmuls (5-64 rows) on CPU
(docs/architecture.md, "Decode step").

Why: torch's bf16 `F.linear` hands oneDNN the plain [out, in] weight, which oneDNN re-lays into its blocked
(AMX / AVX512-BF16) format on every call; at decode batch sizes that reorder costs as much as the product.
`torch.ops.mkldnn._reorder_linear_weight` does it once (inductor's CPU freezing pass does the same). On
SmolLM2-135M (all 121 linears, weights streamed from memory, Sapphire Rapids, 2 threads, alternating) a
pass takes 20.6 ms instead of 29.3 at 8 rows, 28.2 instead of 33.7 at 32 (23.4 padded to 33 rows), 33.8
instead of 50.2 at 64; the products are the same oneDNN kernels' (equal to `F.linear`'s bit for bit on
that machine). Up to four rows the plain weight
stays faster (kernels/linear.py's matrix-vector kernel), so both copies are kept: the packed one costs
the weights' bytes again, which is why `auto` packs only while that copy is small next to free memory.

TGICTL_PREPACK_WEIGHTS (env.py): auto (the default), 1 (always, where oneDNN can), 0 (never).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor

from tgictl.env import read_env

log = logging.getLogger(__name__)

# The row count oneDNN blocks the packed weight for; any row count can use it.
PACK_ROWS_HINT = 32
# The packed copy serves decode-sized products only, at a few row counts. oneDNN compiles a kernel for every
# new row count, 3x slower for a packed weight than for torch's plain product (SmolLM2's four projection
# shapes: 36 ms against 12 at each new row count), and a server sees ever new ones (prefill lengths, batch
# sizes): unbucketed, a mixed-length load ran at half its speed. Row counts up to PACKED_MAX_ROWS are rounded
# up to multiples of PACKED_ROW_STEP (zero rows; the products stay memory-bound there), so at most 8 kernels
# per weight shape exist and stay in the shard's oneDNN cache (env.py); longer products (prefill chunks) take
# the plain weight, where compute dwarfs the re-layout.
PACKED_MAX_ROWS = 64
PACKED_ROW_STEP = 8
# `auto` packs while the packed copies take at most this share of the memory available after loading.
AUTO_MAX_SHARE_OF_AVAILABLE = 0.25


def can_prepack(weight: Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and weight.dim() == 2
            and weight.is_contiguous() and torch.backends.mkldnn.is_available())


def prepack(weight: Tensor) -> Tensor | None:
    """weight [out, in] in oneDNN's blocked layout, or None where this build cannot pack it."""
    if not can_prepack(weight):
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS_HINT)
    except (RuntimeError, AttributeError) as err:  # a torch without the op, or oneDNN refusing the shape
        log.debug("oneDNN weight prepack unavailable: %s", err)
        return None


def packed_linear(x: Tensor, packed: Tensor, bias: Tensor | None) -> Tensor:
    """x [rows, in] @ W^T + bias with W packed by `prepack`."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def packed_rows(rows: int) -> int:
    """The row count a product of `rows` rows runs at on the packed copy: a multiple of PACKED_ROW_STEP."""
    return -(-rows // PACKED_ROW_STEP) * PACKED_ROW_STEP


def should_prepack(policy: str, packed_bytes: int, available_bytes: int) -> bool:
    if policy == "auto":
        return packed_bytes <= AUTO_MAX_SHARE_OF_AVAILABLE * available_bytes
    return policy == "on"


class PackableWeight(Protocol):
    """What prepack_weights needs of a weight (linear_methods' LinearWeight is one; named here so that this
    lower layer imports nothing of the layers above it)."""

    out_features: int
    in_features: int

    def wants_packed_copy(self, policy: str) -> bool: ...

    def prepack(self) -> bool: ...


def prepack_weights(weights: Sequence[PackableWeight], available_bytes: int) -> int:
    """Pack `weights` (bf16 copies) as the policy says, `available_bytes` the memory available after loading
    (runtime/host.py measures it); returns the bytes the copies take."""
    policy = read_env().prepack_weights
    weights = [w for w in weights if w.wants_packed_copy(policy)]  # under auto on AMX: none of dense, int8, GGUF
    packed_bytes = sum(w.out_features * w.in_features * 2 for w in weights)
    if not weights or not should_prepack(policy, packed_bytes, available_bytes):
        if weights and policy == "auto":
            log.info("bf16 weights not prepacked for oneDNN: a second copy (%.1f MiB) would take more than %d%% of "
                     "the available memory (TGICTL_PREPACK_WEIGHTS=1 forces it)", packed_bytes / 2**20,
                     int(AUTO_MAX_SHARE_OF_AVAILABLE * 100))
        return 0
    done = sum(w.out_features * w.in_features * 2 for w in weights if w.prepack())
    if done:
        log.info("bf16 copies of weights for the matmuls of 5+ rows (oneDNN's packed layout, or plain for the FMA "
                 "kernel where oneDNN has no bf16): %.1f MiB more memory", done / 2**20)
    return done
