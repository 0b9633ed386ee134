"""A GGUF file as a tensor source for the shard's loader: tensors by their Hugging Face names, in the row
order transformers gives them, native block types kept as blocks (docs/architecture.md, "Weight formats").

Names and layout are undone exactly as transformers' GGUF loader does it
(modeling_gguf_pytorch_utils.py, `get_gguf_hf_weights_map` and `LlamaTensorProcessor`):
- an HF name `model.layers.3.self_attn.q_proj.weight` is the GGUF tensor gguf-py's TensorNameMap gives
  for its stem (`blk.3.attn_q`) plus the suffix;
- llama.cpp's converter permutes the rows of q and k inside each head of llama-architecture files
  (rotary pairs interleaved); transformers reverses that on the dequantized rows. Rows are independent
  in every block type, so the same reordering applies to the blocks themselves, exactly;
- Gemma's norm weights are stored as 1 + w; the 1 is taken off as transformers does;
- MoE experts are stacked, one tensor per projection and layer ([experts, out, in], e.g. `blk.3.ffn_gate_exps`);
  an HF expert name `model.layers.3.mlp.experts.5.gate_proj.weight` is expert 5's [out, in] slice of it.
Dimensions come reversed in GGUF (ne[0] is the input size); `shape` answers in HF order [out, in].
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from tgictl.errors import ConfigError, UnsupportedModelError
from tgictl.kernels.linear_methods import BLOCK_TYPES_BY_GGML, GGUFWeight
from tgictl.runtime.gguf_reader import GGUFFormatError, TensorInfo, read_gguf

log = logging.getLogger(__name__)

# general.architecture values whose q/k rows llama.cpp permutes (transformers' TENSOR_PROCESSORS["llama"]).
PERMUTED_ARCHITECTURES = frozenset({"llama"})
PERMUTED_TENSORS = (".attn_q.", ".attn_k.")
# Architectures whose RMSNorm weights llama.cpp stores as 1 + w (Gemma's scale); transformers' Gemma2TensorProcessor
# takes the 1 off again, and so does `read` (the model adds it back: FamilySpec.norm_offset).
NORM_PLUS_ONE_ARCHITECTURES = frozenset({"gemma2", "gemma3"})
# Float types read as they are (no dequantization to speak of in the load log).
FLOAT_TYPES = frozenset({"F32", "F16", "BF16", "F64"})
# An HF name of one expert's projection: the stacked tensor's stem with the expert's index taken out.
EXPERT_NAME = re.compile(r"^(?P<stem>.+\.experts)\.(?P<expert>\d+)\.(?P<projection>[^.]+)$")


@dataclass(frozen=True)
class _Located:
    """Where an HF tensor lives in the file: a whole tensor, or one expert's slice of a stacked one."""

    tensor: TensorInfo
    expert: int | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.tensor.shape if self.expert is None else self.tensor.shape[1:]


def llama_row_order(rows: int, heads: int) -> Tensor:
    """[rows] int64: HF row r of a llama q/k projection is GGUF row order[r] (transformers'
    _reverse_permute_weights applied to the row indices)."""
    dim = rows // heads // 2
    return torch.arange(rows).view(heads, dim, 2).transpose(1, 2).reshape(rows)


def _type_name(ggml_type: int) -> str:
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType(ggml_type).name


class GGUFSource:
    """The tensors of one GGUF file; `close()` unmaps it."""

    def __init__(self, path: Path) -> None:
        import gguf

        self.path = Path(path)
        try:
            self._file = read_gguf(self.path)
        except GGUFFormatError as err:
            raise ConfigError(f"cannot read the GGUF file {self.path}: {err}") from err
        fields = self._file.fields
        self.architecture = self._file.architecture
        arch = {name: value for value, name in gguf.MODEL_ARCH_NAMES.items()}.get(self.architecture)
        if arch is None:
            raise UnsupportedModelError(f"{self.path.name}: GGUF architecture {self.architecture!r} is unknown to gguf-py")
        self._names = gguf.get_tensor_name_map(arch, int(fields.get(f"{self.architecture}.block_count", 0)))
        heads = fields.get(f"{self.architecture}.attention.head_count")
        kv_heads = fields.get(f"{self.architecture}.attention.head_count_kv", heads)
        self._heads = {".attn_q.": heads, ".attn_k.": kv_heads}
        self._log_dequantized_types()

    def _log_dequantized_types(self) -> None:
        """One line naming the tensor types without a native kernel, which are dequantized at load."""
        others = [t for t in self._file.tensors.values()
                  if t.ggml_type not in BLOCK_TYPES_BY_GGML and _type_name(t.ggml_type) not in FLOAT_TYPES]
        if others:
            counts = Counter(_type_name(t.ggml_type) for t in others)
            kinds = ", ".join(f"{name} ({count} tensors)" for name, count in sorted(counts.items()))
            examples = ", ".join(t.name for t in others[:3])
            log.info("%s: %s dequantized at load (no native kernel for these types), e.g. %s",
                     self.path.name, kinds, examples)

    def close(self) -> None:
        self._file.close()

    def gguf_name(self, name: str) -> str | None:
        stem, _, suffix = name.rpartition(".")
        mapped = self._names.get_name(stem)
        return None if mapped is None else f"{mapped}.{suffix}"

    def _locate(self, name: str) -> _Located | None:
        gguf_name = self.gguf_name(name)
        if gguf_name is not None and gguf_name in self._file.tensors:
            return _Located(self._file.tensors[gguf_name])
        stem, _, suffix = name.rpartition(".")
        expert = EXPERT_NAME.match(stem)
        if expert is None:
            return None
        stacked = self.gguf_name(f"{expert['stem']}.{expert['projection']}.{suffix}")
        info = self._file.tensors.get(stacked) if stacked is not None else None
        index = int(expert["expert"])
        return _Located(info, index) if info is not None and len(info.shape) == 3 and index < info.shape[0] else None

    def _tensor(self, name: str) -> _Located:
        located = self._locate(name)
        if located is None:
            raise ConfigError(f"tensor {name!r} ({self.gguf_name(name) or 'no GGUF name'}) is not in {self.path.name}")
        return located

    def names(self) -> list[str]:
        return sorted(self._file.tensors)

    def has(self, name: str) -> bool:
        return self._locate(name) is not None

    def shape(self, name: str) -> tuple[int, ...]:
        return self._tensor(name).shape

    def column_alignment(self, name: str) -> int:
        """A tensor in native blocks splits its input columns on block boundaries only."""
        block_type = BLOCK_TYPES_BY_GGML.get(self._tensor(name).tensor.ggml_type)
        return 1 if block_type is None else block_type.block_size

    def _row_order(self, tensor: TensorInfo, rows: int) -> Tensor | None:
        if self.architecture not in PERMUTED_ARCHITECTURES:
            return None
        for marker, heads in self._heads.items():
            if marker in tensor.name and heads:
                return llama_row_order(rows, int(heads))
        return None

    def _rows(self, located: _Located, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of the stored array (blocks or values; an expert's slice of a stacked one), in HF
        row order, copied out of the memory map (the file is unmapped once the model is loaded)."""
        tensor = located.tensor
        data = self._file.array(tensor.name)
        if located.expert is not None:
            data = data[located.expert]
        order = self._row_order(tensor, data.shape[0])
        rows = data[start:stop] if order is None else data[order[start:stop].numpy()]
        return np.array(rows, copy=True, order="C")

    def read(self, name: str, dim: int, start: int, stop: int) -> Tensor:
        """Indices [start, stop) along `dim` of `name`, as float32 (dequantized when stored in blocks)."""
        import gguf

        located = self._tensor(name)
        shape = located.shape
        if dim == 0 or len(shape) == 1:
            rows = self._rows(located, start, stop)
            columns = slice(None)
        else:
            rows = self._rows(located, 0, shape[0])
            columns = slice(start, stop)
        block_type = BLOCK_TYPES_BY_GGML.get(located.tensor.ggml_type)
        if block_type is not None:
            values = block_type.dequantize(torch.from_numpy(rows))
        else:
            qtype = gguf.GGMLQuantizationType(located.tensor.ggml_type)
            values = torch.from_numpy(np.array(gguf.quants.dequantize(rows, qtype), dtype=np.float32))
        if self.architecture in NORM_PLUS_ONE_ARCHITECTURES and "norm.weight" in located.tensor.name:
            values = values - 1
        return values if len(shape) == 1 else values.reshape(-1, shape[1])[:, columns].contiguous()

    def linear(self, name: str, dim: int, start: int, stop: int, dtype: torch.dtype) -> GGUFWeight | None:
        """Rows (dim 0) or columns (dim 1) [start, stop) of a 2-D tensor in its blocks; None when its type has
        no native kernel or the columns do not fall on block boundaries (the caller reads it as floats)."""
        located = self._tensor(name)
        block_type = BLOCK_TYPES_BY_GGML.get(located.tensor.ggml_type)
        shape = located.shape
        if block_type is None or len(shape) != 2:
            return None
        if dim == 0:
            return GGUFWeight(torch.from_numpy(self._rows(located, start, stop)), block_type, shape[1], dtype)
        whole = GGUFWeight(torch.from_numpy(self._rows(located, 0, shape[0])), block_type, shape[1], dtype)
        part = whole.slice_columns(start, stop)
        if part is None:
            log.info("%s: columns %d-%d of %s are not on %s block boundaries; that slice is dequantized",
                     self.path.name, start, stop, name, block_type.name)
        return part
