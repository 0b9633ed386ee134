"""The linear-method registry (docs/architecture.md, "Weight formats"): how a projection read as a float
tensor from a checkpoint becomes the weight format it is served in.

`linear_method(spec)` answers for `--quantize` (None: dense). A method makes a LinearWeight from a float
[out, in] tensor (this rank's rows or columns, already sliced) and says on which input-column boundaries a
tensor-parallel split should fall so that every rank's slice quantizes as the whole would. GGUF
checkpoints do not pass through here: their tensors arrive already in blocks (runtime/shard/gguf_weights.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Protocol

import torch
from torch import Tensor

from tgictl.errors import ConfigError
from tgictl.kernels.linear_methods.base import LinearWeight
from tgictl.kernels.linear_methods.dense import DenseWeight
from tgictl.kernels.linear_methods.int4 import Int4Weight
from tgictl.kernels.linear_methods.int8 import Int8Weight
from tgictl.quantization import VOCAB_METHOD, QuantizeSpec


class Role(Enum):
    """What a matrix is in the model: the methods treat the vocabulary matrices apart."""

    PROJECTION = "projection"  # attention and MLP projections
    VOCAB = "vocab"  # the embedding table and the LM head


class LinearMethod(Protocol):
    name: str
    whole_rows: bool  # a row-parallel slice is quantized from whole rows (from_dense_columns)

    def from_dense(self, weight: Tensor, dtype: torch.dtype, role: Role) -> LinearWeight:
        """weight [out, in] float -> the served weight, activations in `dtype`."""
        ...

    def column_alignment(self, role: Role) -> int:
        """Input columns a rank's slice should start and end on (1: anywhere)."""
        ...

    def from_dense_columns(self, weight: Tensor, start: int, stop: int, dtype: torch.dtype, role: Role) -> LinearWeight:
        """Input columns [start, stop) of the whole matrix `weight` [out, in] (a row-parallel rank's part),
        quantized as the whole matrix is."""
        ...


@dataclass(frozen=True)
class DenseMethod:
    name: str = "dense"
    whole_rows: bool = False

    def from_dense(self, weight: Tensor, dtype: torch.dtype, role: Role) -> LinearWeight:
        return DenseWeight(weight.to(dtype))

    def column_alignment(self, role: Role) -> int:
        return 1

    def from_dense_columns(self, weight: Tensor, start: int, stop: int, dtype: torch.dtype, role: Role) -> LinearWeight:
        return self.from_dense(weight[:, start:stop], dtype, role)


@dataclass(frozen=True)
class Int8Method:
    name: str = "int8"
    whole_rows: bool = True  # each row's scale is its whole row's maximum

    def from_dense(self, weight: Tensor, dtype: torch.dtype, role: Role) -> LinearWeight:
        return Int8Weight.quantize(weight, dtype)

    def column_alignment(self, role: Role) -> int:
        return 1  # one scale per output row, over the whole row: any column slice of it is exact

    def from_dense_columns(self, weight: Tensor, start: int, stop: int, dtype: torch.dtype, role: Role) -> LinearWeight:
        whole = Int8Weight.quantize(weight, dtype)
        return Int8Weight(whole.qweight[:, start:stop].contiguous(), whole.scales)


@dataclass(frozen=True)
class Int4Method:
    group_size: int
    name: str = "int4"
    whole_rows: bool = False  # groups on column_split's boundaries are the whole matrix's groups

    def from_dense(self, weight: Tensor, dtype: torch.dtype, role: Role) -> LinearWeight:
        if role is Role.VOCAB:
            return METHODS[VOCAB_METHOD](None).from_dense(weight, dtype, role)
        return Int4Weight.quantize(weight, self.group_size, dtype)

    def column_alignment(self, role: Role) -> int:
        return self.group_size if role is Role.PROJECTION else 1

    def from_dense_columns(self, weight: Tensor, start: int, stop: int, dtype: torch.dtype, role: Role) -> LinearWeight:
        # Groups start at `start`: on a group boundary they are the whole matrix's groups; elsewhere
        # (attention heads that end inside a group) the slice gets groups of its own.
        return self.from_dense(weight[:, start:stop], dtype, role)


METHODS: Mapping[str, Callable[[QuantizeSpec | None], LinearMethod]] = MappingProxyType({
    "dense": lambda spec: DenseMethod(),
    "int8": lambda spec: Int8Method(),
    "int4": lambda spec: Int4Method(spec.group_size if spec is not None else QuantizeSpec("int4").group_size),
})


def linear_method(spec: QuantizeSpec | None) -> LinearMethod:
    """The method for `--quantize` (None: dense); an unknown name lists the known ones."""
    name = "dense" if spec is None else spec.method
    try:
        return METHODS[name](spec)
    except KeyError:
        raise ConfigError(f"unknown linear method {name!r}; known: {', '.join(sorted(METHODS))}") from None
