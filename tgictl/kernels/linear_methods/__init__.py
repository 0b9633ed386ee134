"""Weight formats and the matmuls that read them (docs/architecture.md, "Weight formats"): dense, int8,
int4 and GGUF blocks, each with a pure-torch reference; the registry that makes them from checkpoints;
the table that picks the fastest matmul per shape."""

from tgictl.kernels.linear_methods.base import LinearWeight, StackedLinearWeight, concat_rows
from tgictl.kernels.linear_methods.dense import DenseWeight
from tgictl.kernels.linear_methods.gguf_types import BLOCK_TYPES, BLOCK_TYPES_BY_GGML, BlockType
from tgictl.kernels.linear_methods.gguf_weight import GGUFWeight
from tgictl.kernels.linear_methods.int4 import Int4Weight
from tgictl.kernels.linear_methods.int8 import Int8Weight
from tgictl.kernels.linear_methods.registry import METHODS, LinearMethod, Role, linear_method

__all__ = [
    "BLOCK_TYPES",
    "BLOCK_TYPES_BY_GGML",
    "METHODS",
    "BlockType",
    "DenseWeight",
    "GGUFWeight",
    "Int4Weight",
    "Int8Weight",
    "LinearMethod",
    "LinearWeight",
    "Role",
    "StackedLinearWeight",
    "concat_rows",
    "linear_method",
]
