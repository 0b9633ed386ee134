"""An MoE layer's active experts in one compiled call (csrc/moe_experts.c) where the step allows it (docs/moe.md).

Why: a decode step routes each row to k experts, and each active expert multiplies a row or a few; as Python calls
that is three kernel calls per expert with the Python around them (~70 us per expert on 2 AMD EPYC cores), several
times the time its weights take to read. The C loop makes the same calls with the same arguments in the same order,
so it returns the Python experts' outputs bit for bit (tests/unit/kernels/test_moe_experts.py holds it to them).

It runs on bf16 rows on the CPU outside --batch-invariant, for the experts whose projections the loops read (dense
bf16, int4 tiles, int8 rows: kernels/linear_descriptor.py) and whose rows are few enough for the kernels the Python
dispatch takes there (1-4, or 1-32 where the many-row kernels run); an expert with more rows (a prompt's) takes the
Python path, whose one product per expert already amortises its calls.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence

import torch
from torch import Tensor

from tgictl.kernels.batch_invariance import batch_invariant
from tgictl.kernels.linear import AMX_FIRST_MAX_ROWS, SMALL_LINEAR_MAX_ROWS
from tgictl.kernels.linear_descriptor import LinearDescriptor, linear_descriptor, runs_many_rows
from tgictl.kernels.linear_methods import LinearWeight
from tgictl.kernels.native import load_native_kernels

Span = tuple[int, int, int]  # (expert, first row, row after the last) of the rows grouped by expert


@functools.cache
def _kernels() -> tuple[ctypes._CFuncPtr, ctypes._CFuncPtr] | None:  # type: ignore[name-defined]
    """(tgictl_moe_experts_scratch, tgictl_moe_experts_bf16) from the library kernels/native.py builds."""
    native = load_native_kernels()
    if native is None:
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    scratch, run = native.library.tgictl_moe_experts_scratch, native.library.tgictl_moe_experts_bf16
    scratch.argtypes, scratch.restype = [i64, i64, i64], i64
    run.argtypes, run.restype = [p, p, i64, p, p, i64, i64, p, p, i64, ctypes.c_int], ctypes.c_int
    return scratch, run


class ExpertStack:
    """Every expert's gate|up and down as the C loop reads them, indexed by expert id (pointers into the weights:
    the stack keeps them referenced, and weights never move after load)."""

    def __init__(self, weights: Sequence[LinearWeight], gate_up: Sequence[LinearDescriptor],
                 down: Sequence[LinearDescriptor], hidden: int, inter: int, max_rows: int) -> None:
        self._weights = tuple(weights)
        self.gate_up = (LinearDescriptor * len(gate_up))(*gate_up)
        self.down = (LinearDescriptor * len(down))(*down)
        self.hidden, self.inter, self.max_rows = hidden, inter, max_rows

    @classmethod
    def build(cls, gate_up: Sequence[LinearWeight], down: Sequence[LinearWeight]) -> ExpertStack | None:
        """The stack, or None when some expert's weights are not what the loop reads (or there is no library)."""
        if not gate_up or _kernels() is None:
            return None
        inter, hidden = gate_up[0].out_features // 2, gate_up[0].in_features
        up_descriptors = [linear_descriptor(w, (2 * inter, hidden)) for w in gate_up]
        down_descriptors = [linear_descriptor(w, (hidden, inter)) for w in down]
        if any(d is None for d in (*up_descriptors, *down_descriptors)):
            return None
        weights = (*gate_up, *down)
        max_rows = AMX_FIRST_MAX_ROWS if all(runs_many_rows(w) for w in weights) else SMALL_LINEAR_MAX_ROWS[
            torch.bfloat16]
        return cls(weights, [d for d in up_descriptors if d is not None],
                   [d for d in down_descriptors if d is not None], hidden, inter, max_rows)


def native_experts(stack: ExpertStack, rows: Tensor, spans: Sequence[Span], out: Tensor) -> Sequence[Span]:
    """Each expert's MLP on its rows of `rows` [pairs, hidden] (grouped by expert) written to the same rows of `out`,
    in one call, for the spans the loop takes; returns the spans it left for the caller (all of them when it cannot
    run here)."""
    kernels = _kernels()
    if kernels is None or batch_invariant() or rows.dtype != torch.bfloat16 or rows.device.type != "cpu" \
            or not rows.is_contiguous() or out.dtype != torch.bfloat16 or not out.is_contiguous() \
            or rows.dim() != 2 or rows.shape[1] != stack.hidden or out.shape != rows.shape:
        return spans
    taken = [span for span in spans if span[2] - span[1] <= stack.max_rows]
    if not taken:
        return spans
    scratch_size, run = kernels
    threads = torch.get_num_threads()
    per_worker = scratch_size(max(stop - first for _, first, stop in taken), stack.hidden, stack.inter)
    scratch = torch.empty(threads * per_worker + 64, dtype=torch.uint8)
    base = scratch.data_ptr()
    table = torch.tensor(taken, dtype=torch.int64)
    status = run(rows.data_ptr(), table.data_ptr(), len(taken), stack.gate_up, stack.down, stack.hidden, stack.inter,
                 out.data_ptr(), base + (-base) % 64, per_worker, threads)
    if status != 0:  # a kernel could not get its scratch memory: the caller computes every span
        return spans
    return [span for span in spans if span[2] - span[1] > stack.max_rows]
