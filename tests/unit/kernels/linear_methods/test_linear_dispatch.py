"""The backend table: measured choices win per CPU kind and row count, unknown shapes get the default order,
named backends a format lacks are skipped, and the table scripts/bench_linear.py writes reads back."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tgictl.kernels.linear_methods import GGUFWeight, Int8Weight
from tgictl.kernels.linear_methods.dispatch import (
    CPU_DEFAULT_FEW_ROWS,
    CPU_DEFAULT_MANY_ROWS,
    CPU_DEFAULT_MATRIX_VECTOR,
    DEVICE_DEFAULT,
    MATRIX_VECTOR_MAX_ROWS,
    NATIVE_DEFAULT_MAX_ROWS,
    choose,
    cpu_kind,
    load_table,
    shape_key,
)

KEY = shape_key("int4/g64", "bfloat16", 960, 576)
TABLE = {"avx512+bf16": {KEY: {1: "native", 16: "torch", 128: "dequant"}}}


def test_cpu_kind_names_the_extensions_that_matter() -> None:
    assert cpu_kind("flags : fpu avx2 avx512f avx512_bf16 avx512_vnni amx_bf16 amx_tile") == "avx512+bf16+vnni+amx+avx2"
    assert cpu_kind("flags : fpu avx2 fma") == "avx2"
    assert cpu_kind("flags : fpu") == "generic"


def test_measured_choice_by_the_largest_measured_row_count_below() -> None:
    kind = "avx512+bf16"
    assert choose(TABLE, kind, KEY, "cpu", 1)[0] == "native"
    assert choose(TABLE, kind, KEY, "cpu", 15)[0] == "native"
    assert choose(TABLE, kind, KEY, "cpu", 16)[0] == "torch"
    assert choose(TABLE, kind, KEY, "cpu", 127)[0] == "torch"
    assert choose(TABLE, kind, KEY, "cpu", 4096)[0] == "dequant"
    order = choose(TABLE, kind, KEY, "cpu", 32)
    assert order[0] == "torch" and sorted(order) == sorted(set(order))  # then the rest, once each


def test_unmeasured_shapes_kinds_and_devices_get_the_defaults() -> None:
    assert choose(TABLE, "avx2", KEY, "cpu", 1) == CPU_DEFAULT_MATRIX_VECTOR  # another CPU kind
    other = shape_key("int4/g64", "float32", 960, 576)
    assert choose(TABLE, "avx512+bf16", other, "cpu", MATRIX_VECTOR_MAX_ROWS) == CPU_DEFAULT_MATRIX_VECTOR
    assert choose(TABLE, "avx512+bf16", other, "cpu", MATRIX_VECTOR_MAX_ROWS + 1) == CPU_DEFAULT_FEW_ROWS
    assert choose(TABLE, "avx512+bf16", other, "cpu", NATIVE_DEFAULT_MAX_ROWS) == CPU_DEFAULT_FEW_ROWS
    assert choose(TABLE, "avx512+bf16", other, "cpu", NATIVE_DEFAULT_MAX_ROWS + 1) == CPU_DEFAULT_MANY_ROWS
    assert choose(TABLE, "avx512+bf16", KEY, "cuda", 1) == DEVICE_DEFAULT


def test_table_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "choices.json"
    path.write_text(json.dumps({"machines": {"avx2": {"measured": "x", "choices": {KEY: {"1": "native", "32": "torch"}}}}}))
    assert load_table(path) == {"avx2": {KEY: {1: "native", 32: "torch"}}}
    assert load_table(tmp_path / "missing.json") == {}
    (tmp_path / "broken.json").write_text("{not json")
    assert load_table(tmp_path / "broken.json") == {}


def test_the_shipped_table_parses() -> None:
    table = load_table()
    for kind, choices in table.items():
        for key, by_rows in choices.items():
            assert key.count("|") == 2 and all(rows >= 1 for rows in by_rows), (kind, key)
            assert set(by_rows.values()) <= {"native", "native_bf16", "torch", "dequant", "reference"}


def test_forward_skips_a_backend_the_format_lacks(monkeypatch) -> None:
    from tgictl.kernels.linear import linear
    from tgictl.kernels.linear_methods import BLOCK_TYPES, dispatch

    weight = GGUFWeight(torch.zeros(4, 36, dtype=torch.uint8), BLOCK_TYPES["Q4_0"], 64, torch.float32)
    monkeypatch.setattr(dispatch, "backend_order", lambda w, x: ("torch", "native"))
    x = torch.randn(2, 64)
    assert torch.equal(weight(x), torch.zeros(2, 4))  # GGUF has no torch backend: native answered
    int8 = Int8Weight.quantize(torch.randn(8, 64), torch.float32)
    monkeypatch.setattr(dispatch, "backend_order", lambda w, x: ("dequant",))
    assert torch.equal(int8(x), linear(x, int8.dequantize()))  # the shard's matmul on the dequantization
