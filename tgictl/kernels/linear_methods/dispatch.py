"""Which backend multiplies a quantized weight: per CPU kind, format, dtype, shape and row count, from a
table of measurements (docs/architecture.md, "Weight formats").

`scripts/bench_linear_methods.py --write-table` times every backend of every format on a model's shapes at a few
row counts and writes, for this CPU kind, the fastest per (format, dtype, shape, rows) into
kernel_choices.json next to this file. A call with R rows takes the entry of the largest measured row
count <= R (the smallest when R is below all). Shapes, CPU kinds or devices the table does not know get
the default order: up to MATRIX_VECTOR_MAX_ROWS rows the C matrix-vector kernel, then torch's kernel;
above, int8's oneDNN strips first (from 256 rows, without AMX: int8.py), then the formats' bf16 many-row C
kernel (int4: AMX or AVX512-BF16 on a bf16 copy of each tile, faster from 5 rows on SmolLM2's shapes), then the C kernel up to NATIVE_DEFAULT_MAX_ROWS rows, torch's
kernel, dequantize-and-matmul; on other devices dequantize-and-matmul. A backend that declines an input
(another dtype, no compiler, a CPU without bf16 dot products) or that a format lacks passes to the next;
the reference closes every order.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from torch import Tensor

from tgictl.kernels.native import cpu_flags


class ShapedWeight(Protocol):
    """What the table's key needs of a weight (base.LinearWeight is one; named here, base imports this module)."""

    out_features: int
    in_features: int

    @property
    def format_key(self) -> str: ...

TABLE_PATH = Path(__file__).with_name("kernel_choices.json")
MATRIX_VECTOR_MAX_ROWS = 4
NATIVE_DEFAULT_MAX_ROWS = 16
CPU_DEFAULT_MATRIX_VECTOR: tuple[str, ...] = ("native", "torch", "native_bf16", "dequant")
CPU_DEFAULT_FEW_ROWS: tuple[str, ...] = ("native_bf16", "native", "torch", "dequant")
CPU_DEFAULT_MANY_ROWS: tuple[str, ...] = ("onednn_strips", "native_bf16", "torch", "dequant", "native")
DEVICE_DEFAULT: tuple[str, ...] = ("dequant",)
Table = Mapping[str, Mapping[str, Mapping[int, str]]]  # {cpu kind: {shape key: {rows: backend}}}


def cpu_kind(flags: str | None = None) -> str:
    """This CPU's class as the table keys it: the vector extensions the kernels' speed depends on."""
    words = set((flags if flags is not None else cpu_flags()).split())
    extensions = [name for name, flag in (("avx512", "avx512f"), ("bf16", "avx512_bf16"), ("vnni", "avx512_vnni"),
                                          ("amx", "amx_bf16"), ("avx2", "avx2")) if flag in words]
    return "+".join(extensions) or "generic"


def shape_key(format_key: str, dtype_name: str, out_features: int, in_features: int) -> str:
    return f"{format_key}|{dtype_name}|{out_features}x{in_features}"


def _dtype_name(x: Tensor) -> str:
    return str(x.dtype).removeprefix("torch.")


@functools.cache
def load_table(path: Path = TABLE_PATH) -> Table:
    """The table in `path`; empty when the file is missing or unreadable."""
    try:
        raw: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    table: dict[str, dict[str, dict[int, str]]] = {}
    for kind, machine in (raw.get("machines") or {}).items():
        choices = machine.get("choices") or {}
        table[kind] = {key: {int(rows): str(name) for rows, name in by_rows.items()} for key, by_rows in choices.items()}
    return table


def choose(table: Table, kind: str, key: str, device_type: str, rows: int) -> tuple[str, ...]:
    """The order for one call: the table's measured choice first, then the default order."""
    if device_type != "cpu":
        return DEVICE_DEFAULT
    default = CPU_DEFAULT_MATRIX_VECTOR if rows <= MATRIX_VECTOR_MAX_ROWS \
        else CPU_DEFAULT_FEW_ROWS if rows <= NATIVE_DEFAULT_MAX_ROWS else CPU_DEFAULT_MANY_ROWS
    by_rows = table.get(kind, {}).get(key)
    if not by_rows:
        return default
    below = [r for r in by_rows if r <= rows]
    first = by_rows[max(below) if below else min(by_rows)]
    return (first, *(name for name in default if name != first))


@functools.lru_cache(maxsize=4096)
def _order(kind: str, key: str, device_type: str, rows: int) -> tuple[str, ...]:
    return choose(load_table(), kind, key, device_type, rows)


@functools.cache
def _this_cpu() -> str:
    return cpu_kind()


@functools.cache
def load_row_padding(path: Path = TABLE_PATH) -> Mapping[str, Mapping[str, Mapping[int, int]]]:
    """{cpu kind: {dtype: {rows: padded rows}}}: row counts at which oneDNN's product on a prepacked weight
    (kernels/prepacked.py) is faster when the input is zero-padded to more rows (measured by
    scripts/bench_linear.py --packed-sweep --write-table; on Sapphire Rapids 17..32 rows take ~40% longer
    than 33). Empty when the file has none."""
    try:
        raw: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {kind: {dtype: {int(rows): int(padded) for rows, padded in by_rows.items()}
                   for dtype, by_rows in (machine.get("row_padding") or {}).items()}
            for kind, machine in (raw.get("machines") or {}).items()}


def padded_rows(x: Tensor) -> int:
    """The row count to run x [rows, in] at on a prepacked weight on this CPU: rows itself unless measured."""
    rows = x.shape[0]
    return load_row_padding().get(_this_cpu(), {}).get(_dtype_name(x), {}).get(rows, rows)


def backend_order(weight: ShapedWeight, x: Tensor) -> tuple[str, ...]:
    """The backends to try, in order, for `weight` on input x [rows, in]."""
    key = shape_key(weight.format_key, _dtype_name(x), weight.out_features, weight.in_features)
    return _order(_this_cpu(), key, x.device.type, x.shape[0])
