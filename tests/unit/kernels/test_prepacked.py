"""Prepacked bf16 weights (kernels/prepacked.py): the dense format's products of five rows and more run on
oneDNN's packed copy, equal to torch's linear within bf16 rounding; a few rows keep the plain weight; zero-row
padding from the table changes nothing but the kernel; the policy decides when a model is packed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tgictl.kernels import prepacked
from tgictl.kernels.linear import AMX_FIRST_MAX_ROWS, SMALL_LINEAR_MAX_ROWS, amx_available, dpbf16_linear_available
from tgictl.kernels.linear_methods import dispatch
from tgictl.kernels.linear_methods import Int8Weight
from tgictl.kernels.linear_methods.dense import DenseWeight
from tgictl.kernels.prepacked import prepack, prepack_weights, should_prepack

pytestmark = pytest.mark.skipif(prepack(torch.zeros(16, 16, dtype=torch.bfloat16)) is None,
                                reason="this torch build has no oneDNN weight prepack")
BF16_TOL = {"atol": 2e-2, "rtol": 2e-2}


def _weight(out_features: int = 96, in_features: int = 64, seed: int = 0) -> DenseWeight:
    generator = torch.Generator().manual_seed(seed)
    return DenseWeight(torch.randn(out_features, in_features, generator=generator).to(torch.bfloat16))


@pytest.mark.parametrize("rows", [5, 16, 33, 64, 65, 200])
def test_packed_products_equal_torch_linear(rows: int) -> None:
    weight = _weight()
    bias = torch.randn(96).to(torch.bfloat16)
    x = torch.randn(rows, 64).to(torch.bfloat16)
    assert weight.prepack() and weight.onednn_weight is not None
    for b in (None, bias):
        out = weight(x, b)
        assert out.shape == (rows, 96) and out.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), F.linear(x, weight.weight, b).float(), **BF16_TOL)


def test_few_rows_keep_the_plain_weight_and_more_take_the_packed_copy() -> None:
    weight = _weight()
    weight.prepack()
    weight.onednn_weight = prepack(torch.zeros_like(weight.weight))  # a packed copy that is visibly not the weight
    # Where the CPU has AMX or AVX512-BF16, 5-32 rows take the AMX or VDPBF16PS kernel on the plain weight too.
    plain_max = AMX_FIRST_MAX_ROWS if native_many_rows() else SMALL_LINEAR_MAX_ROWS[torch.bfloat16]
    for rows in sorted({SMALL_LINEAR_MAX_ROWS[torch.bfloat16], plain_max}):
        few = torch.randn(rows, 64).to(torch.bfloat16)
        torch.testing.assert_close(weight(few).float(), F.linear(few, weight.weight).float(), **BF16_TOL)
    many = torch.randn(plain_max + 1, 64).to(torch.bfloat16)
    assert torch.equal(weight(many), torch.zeros(many.shape[0], 96, dtype=torch.bfloat16))


def test_only_decode_sized_products_take_the_packed_copy_at_bucketed_row_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """5..64 rows (33..64 where the CPU has AMX or AVX512-BF16: below, their kernels) run at multiples of 8 rows
    on the packed copy (a bounded set of oneDNN kernels); more rows (prefill) take the plain weight."""
    weight = _weight()
    weight.prepack()
    seen: list[int] = []
    real = prepacked.packed_linear
    monkeypatch.setattr("tgictl.kernels.linear_methods.base.packed_linear",
                        lambda x, packed, bias: seen.append(x.shape[0]) or real(x, packed, bias))
    for rows in (5, 9, 40, 64, 65, 300):
        out = weight(torch.randn(rows, 64).to(torch.bfloat16))
        assert out.shape == (rows, 96)
    # 5, 9, 40, 64 rows; 65 and 300 on the plain weight
    assert seen == ([40, 64] if native_many_rows() else [8, 16, 40, 64])


def test_table_padding_changes_only_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    weight = _weight()
    weight.prepack()
    x = torch.randn(34, 64).to(torch.bfloat16)  # above the AMX kernel's rows: the packed copy everywhere
    unpadded = weight(x)
    monkeypatch.setattr(dispatch, "load_row_padding", lambda: {dispatch.cpu_kind(): {"bfloat16": {34: 41}}})
    dispatch._this_cpu.cache_clear()
    padded = weight(x)
    assert padded.shape == (34, 96)
    torch.testing.assert_close(padded.float(), unpadded.float(), **BF16_TOL)
    torch.testing.assert_close(padded.float(), F.linear(x, weight.weight).float(), **BF16_TOL)


def test_row_padding_table_parses(tmp_path) -> None:
    path = tmp_path / "table.json"
    path.write_text('{"machines": {"kind-a": {"choices": {}, "row_padding": {"bfloat16": {"32": 35}}}, '
                    '"kind-b": {"choices": {}}}}')
    assert dispatch.load_row_padding.__wrapped__(path) == {"kind-a": {"bfloat16": {32: 35}}, "kind-b": {}}
    assert dispatch.load_row_padding.__wrapped__(tmp_path / "missing.json") == {}


def test_float32_and_other_devices_are_not_packed() -> None:
    assert prepack(torch.randn(8, 8)) is None
    assert DenseWeight(torch.randn(8, 8)).prepack() is False


@pytest.mark.parametrize(("policy", "packed_bytes", "available", "expected"),
                         [("auto", 100, 1000, True), ("auto", 300, 1000, False), ("on", 300, 1000, True),
                          ("off", 1, 1000, False)])
def test_policy(policy: str, packed_bytes: int, available: int, expected: bool) -> None:
    assert should_prepack(policy, packed_bytes, available) is expected


@pytest.mark.parametrize(("raw", "expect_packed"), [("1", True), ("0", False)])
def test_prepack_weights_follows_the_policy(monkeypatch: pytest.MonkeyPatch, raw: str, expect_packed: bool) -> None:
    monkeypatch.setenv("TGICTL_PREPACK_WEIGHTS", raw)
    weights = [_weight(seed=1), _weight(seed=2)]
    added = prepack_weights(weights, available_bytes=1 << 40)
    assert [w.onednn_weight is not None for w in weights] == [expect_packed, expect_packed]
    assert added == (2 * 96 * 64 * 2 if expect_packed else 0)
    assert prepacked.read_env().prepack_weights == ("on" if expect_packed else "off")


def test_a_quantized_weight_packs_its_dequantization() -> None:
    """Another format (here int8) gets a bf16 copy of what it stands for: many rows run on it, few on the
    format's own kernels."""
    weight = Int8Weight.quantize(torch.randn(96, 64) * 0.05, torch.bfloat16)
    x_many, x_few = torch.randn(8, 64).to(torch.bfloat16), torch.randn(2, 64).to(torch.bfloat16)
    before_few = weight(x_few)
    assert weight.prepack()
    expected = F.linear(x_many, weight.dequantize().to(torch.bfloat16))
    torch.testing.assert_close(weight(x_many).float(), expected.float(), **BF16_TOL)
    assert torch.equal(weight(x_few), before_few)  # a few rows: the format's kernels, unchanged


def test_auto_packs_no_copy_of_what_the_native_kernels_read_themselves(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under `auto` on an AMX or AVX512-BF16 machine dense weights, int8 rows and GGUF blocks keep no copy (the
    AMX or VDPBF16PS kernels read them as stored); elsewhere they are packed (memory allowing); `1` packs them
    everywhere."""
    import numpy as np

    from tgictl.kernels.linear_methods import BLOCK_TYPES, GGUFWeight
    from tgictl.testing.gguf_blocks import quantized_blocks

    def weights() -> list:
        data = quantized_blocks("Q8_0", (torch.randn(96, 64) * 0.05).numpy(), np.random.default_rng(0))
        return [_weight(seed=3), Int8Weight.quantize(torch.randn(96, 64) * 0.05, torch.bfloat16),
                GGUFWeight(torch.from_numpy(data), BLOCK_TYPES["Q8_0"], 64, torch.bfloat16)]

    monkeypatch.setenv("TGICTL_PREPACK_WEIGHTS", "auto")
    auto = weights()
    added = prepack_weights(auto, available_bytes=1 << 40)
    assert [w.onednn_weight is None for w in auto] == [native_many_rows()] * 3
    assert added == (0 if native_many_rows() else 3 * 96 * 64 * 2)
    monkeypatch.setenv("TGICTL_PREPACK_WEIGHTS", "1")
    forced = weights()
    assert prepack_weights(forced, available_bytes=1 << 40) == 3 * 96 * 64 * 2 and all(w.onednn_weight is not None for w in forced)


def native_many_rows() -> bool:
    return amx_available() or dpbf16_linear_available()


def test_without_a_copy_33_to_64_rows_take_the_amx_kernel() -> None:
    from tgictl.kernels.native import load_native_kernels

    weight = _weight(seed=4)
    assert weight.onednn_weight is None
    x = torch.randn(40, 64).to(torch.bfloat16)
    native = load_native_kernels()
    assert native is not None
    expected = native.amx_linear(x, weight.weight, None) if amx_available() else F.linear(x, weight.weight)
    assert expected is not None and torch.equal(weight(x), expected)
