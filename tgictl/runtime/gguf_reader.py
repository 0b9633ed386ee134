"""A GGUF file's header and tensors, read without parsing what nobody asks for: the shard's loader, model
resolution and `tgictl profile` share it. Pure Python and numpy (no torch).

Why not gguf-py's GGUFReader: it builds a numpy view for every element of every metadata array, which
for a 49,152-token vocabulary is about a million objects and seconds at every shard start; here arrays
are skipped (their length kept) unless named, and tensors are memory-mapped views made on demand.

Layout (GGUF v2/v3, little-endian): magic "GGUF", version u32, tensor count u64, key-value count u64;
key-values (key: u64 length + UTF-8, value type u32, value); tensor infos (name, n_dims u32, dims u64
each in ggml order, ggml type u32, offset u64 into the data); the data, aligned to general.alignment
(default 32).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Container
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
_SCALARS: dict[int, str] = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
                            11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# ggml types stored as plain values, and their numpy dtypes; the rest are blocks (raw bytes here).
_VALUE_DTYPES: dict[int, Any] = {0: np.float32, 1: np.float16}


class GGUFFormatError(ValueError):
    """Not a GGUF file, or a damaged one."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # ggml order: dims[0] is the row length (a matrix's input size)
    ggml_type: int
    offset: int  # absolute, in the file
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy / torch order: [rows, columns] for a matrix."""
        return tuple(reversed(self.dims))


@dataclass
class GGUFFile:
    """The parsed header; `array(name)` maps a tensor. `fields` holds every scalar and string; arrays as
    their length only, unless read_gguf was asked for them."""

    path: Path
    version: int
    fields: dict[str, Any]
    tensors: dict[str, TensorInfo]
    _map: mmap.mmap | None = field(default=None, repr=False)

    @property
    def architecture(self) -> str:
        return str(self.fields.get("general.architecture", ""))

    def array(self, name: str) -> np.ndarray:
        """The tensor as stored, memory-mapped: [rows, columns] float32/float16 for those types, else
        [rows, row_bytes] uint8 blocks (1-D tensors: [columns] or [row_bytes])."""
        info = self.tensors[name]
        if self._map is None:
            with open(self.path, "rb") as handle:
                self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        dtype = _VALUE_DTYPES.get(info.ggml_type, np.uint8)
        flat = np.frombuffer(self._map, dtype=dtype, count=info.nbytes // np.dtype(dtype).itemsize, offset=info.offset)
        rows = info.shape[:-1]
        return flat.reshape(*rows, -1) if rows else flat

    def close(self) -> None:
        self._map = None  # numpy views keep the mapping alive until they go too


class _Cursor:
    def __init__(self, data: mmap.mmap) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.take("<Q")
        text = self.data[self.pos : self.pos + length].decode("utf-8", errors="replace")
        self.pos += length
        return text

    def skip_string(self) -> None:
        self.pos += 8 + struct.unpack_from("<Q", self.data, self.pos)[0]

    def value(self, kind: int, keep: bool) -> Any:
        if kind == _STRING:
            return self.string()
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind != _ARRAY:
            raise GGUFFormatError(f"unknown metadata value type {kind}")
        item, count = self.take("<I"), self.take("<Q")
        if keep:
            return [self.value(item, True) for _ in range(count)]
        if item == _STRING:
            for _ in range(count):
                self.skip_string()
        elif item in _SCALARS:
            self.pos += count * struct.calcsize(_SCALARS[item])
        else:
            for _ in range(count):
                self.value(item, False)
        return count


def _tensor_bytes(dims: tuple[int, ...], ggml_type: int) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except ValueError:
        raise GGUFFormatError(f"unknown ggml tensor type {ggml_type}") from None
    elements = int(np.prod(dims)) if dims else 1
    return elements // block_size * type_size


def read_gguf(path: Path, arrays: Container[str] = ()) -> GGUFFile:
    """Parse `path`'s header; metadata arrays named in `arrays` are read in full."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as err:  # ValueError: an empty file cannot be mapped
        raise GGUFFormatError(f"cannot read {path}: {err}") from None
    cursor = _Cursor(data)
    try:
        if data[:4] != MAGIC:
            raise GGUFFormatError(f"{path.name} does not start with the GGUF magic")
        cursor.pos = 4
        version = cursor.take("<I")
        if version not in VERSIONS:
            raise GGUFFormatError(f"{path.name} is GGUF version {version}; versions {VERSIONS} are read")
        tensor_count, kv_count = cursor.take("<Q"), cursor.take("<Q")
        fields: dict[str, Any] = {}
        for _ in range(kv_count):
            key = cursor.string()
            fields[key] = cursor.value(cursor.take("<I"), key in arrays)
        entries = []
        for _ in range(tensor_count):
            name = cursor.string()
            dims = tuple(cursor.take("<Q") for _ in range(cursor.take("<I")))
            entries.append((name, dims, cursor.take("<I"), cursor.take("<Q")))
    except struct.error as err:
        raise GGUFFormatError(f"{path.name} is cut short or damaged ({err})") from None
    alignment = int(fields.get("general.alignment", DEFAULT_ALIGNMENT))
    start = -(-cursor.pos // alignment) * alignment
    tensors = {name: TensorInfo(name, dims, kind, start + offset, _tensor_bytes(dims, kind))
               for name, dims, kind, offset in entries}
    if any(t.offset + t.nbytes > len(data) for t in tensors.values()):
        raise GGUFFormatError(f"{path.name} is shorter than its tensors say")
    return GGUFFile(path, version, fields, tensors, data)
