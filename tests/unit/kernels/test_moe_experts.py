"""The experts' compiled loop (kernels/moe_experts.py, csrc/moe_experts.c) against the Python experts it replaces:
the same kernels in the same order, so the same bits, for dense bf16, int8 and int4 experts, whether the threads
share each expert or take whole experts; spans it does not take are left to the caller."""

from __future__ import annotations

import pytest
import torch

from tgictl.kernels.batch_invariance import enable_batch_invariance
from tgictl.kernels.linear_methods import Role, linear_method
from tgictl.kernels.moe import ExpertGroups
from tgictl.kernels.moe_experts import ExpertStack, native_experts
from tgictl.quantization import QuantizeSpec
from tgictl.runtime.shard.layers.moe import Experts

HIDDEN, INTER, EXPERTS = 128, 64, 12


def _experts(quantize: str | None, seed: int = 0) -> Experts:
    generator = torch.Generator().manual_seed(seed)
    method = linear_method(QuantizeSpec(quantize) if quantize else None)

    def weight(out: int, inp: int) -> object:
        return method.from_dense(torch.randn(out, inp, generator=generator) * 0.1, torch.bfloat16, Role.PROJECTION)

    return Experts([weight(2 * INTER, HIDDEN) for _ in range(EXPERTS)], [weight(HIDDEN, INTER) for _ in range(EXPERTS)])


def _grouped(tokens: int, top_k: int, seed: int) -> tuple[torch.Tensor, ExpertGroups]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(EXPERTS, generator=generator)[:top_k] for _ in range(tokens)])
    groups = ExpertGroups.build(ids, EXPERTS)
    x = torch.randn(tokens, HIDDEN, generator=generator).bfloat16()
    return groups.gather(x), groups


def _python(experts: Experts, rows: torch.Tensor, groups: ExpertGroups) -> torch.Tensor:
    out = torch.empty_like(rows)
    for expert, start, stop in groups.spans:
        out[start:stop] = experts.expert_mlp(expert, rows[start:stop])
    return out


@pytest.mark.parametrize("quantize", [None, "int8", "int4"])
@pytest.mark.parametrize(("tokens", "top_k", "threads"), [(1, 4, 2), (3, 2, 1), (16, 4, 2), (40, 6, 2)])
def test_the_loop_gives_the_python_experts_bits(quantize: str | None, tokens: int, top_k: int, threads: int) -> None:
    """1 token: 4 experts on 2 threads (each expert on both); 16 and 40 tokens: up to 12 experts of up to ~20 rows
    (the threads take whole experts; the many-row kernels past 4 rows)."""
    experts = _experts(quantize)
    stack = ExpertStack.build(list(experts.gate_up), list(experts.down))
    assert stack is not None
    rows, groups = _grouped(tokens, top_k, seed=tokens)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = torch.full_like(rows, float("nan"))
        left = native_experts(stack, rows, groups.spans, out)
        expected = _python(experts, rows, groups)
    finally:
        torch.set_num_threads(before)
    assert all(stop - start > stack.max_rows for _, start, stop in left)
    done = [span for span in groups.spans if span not in left]
    assert done  # the loop ran
    for _, start, stop in done:
        assert torch.equal(out[start:stop], expected[start:stop])


def test_spans_of_more_rows_than_its_kernels_serve_are_left() -> None:
    experts = _experts(None)
    stack = ExpertStack.build(list(experts.gate_up), list(experts.down))
    assert stack is not None
    rows = torch.randn(stack.max_rows + 3, HIDDEN).bfloat16()
    spans = [(0, 0, stack.max_rows + 1), (5, stack.max_rows + 1, stack.max_rows + 3)]
    out = torch.zeros_like(rows)
    assert native_experts(stack, rows, spans, out) == [spans[0]]
    first = stack.max_rows + 1
    assert torch.equal(out[first:], experts.expert_mlp(5, rows[first:]))


def test_float32_rows_and_batch_invariance_keep_the_python_path() -> None:
    experts = _experts(None)
    stack = ExpertStack.build(list(experts.gate_up), list(experts.down))
    assert stack is not None
    rows, groups = _grouped(2, 2, seed=1)
    assert native_experts(stack, rows.float(), groups.spans, torch.empty_like(rows.float())) == groups.spans
    enable_batch_invariance(True)
    try:
        assert native_experts(stack, rows, groups.spans, torch.empty_like(rows)) == groups.spans
    finally:
        enable_batch_invariance(False)


def test_float32_experts_have_no_stack() -> None:
    generator = torch.Generator().manual_seed(2)
    method = linear_method(None)
    gate_up = [method.from_dense(torch.randn(2 * INTER, HIDDEN, generator=generator), torch.float32, Role.PROJECTION)]
    down = [method.from_dense(torch.randn(HIDDEN, INTER, generator=generator), torch.float32, Role.PROJECTION)]
    assert ExpertStack.build(gate_up, down) is None
