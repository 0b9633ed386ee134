"""The shard's view of a checkpoint: named tensors for the layers, in the serving dtype on the device, and
projections in their weight format (docs/architecture.md, "Weight formats").

The tensors come from a source: safetensors files (runtime/shard/safetensors_files.py) or one GGUF file
(runtime/shard/gguf_file.py), chosen by what the model directory holds. Plain tensors (norms, biases)
are converted to the serving dtype as they are read. Projections go through the linear-method registry:
a source that holds a native quantized form (GGUF blocks) gives it as is; everything else is read as
floats and made into the `--quantize` method's format (dense without it), this rank's slice only.
Tensor-parallel splits of input columns fall on the format's group or block boundaries where possible
(`column_split`), so a sliced quantization equals the whole one's slice.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from tgictl.errors import UnsupportedModelError
from tgictl.kernels.linear_methods import LinearWeight, Role, concat_rows, linear_method
from tgictl.kernels.linear_methods.gguf_repack import served_form
from tgictl.quantization import QuantizeSpec
from tgictl.runtime.model_files.gguf_model import served_gguf_file
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.gguf_file import GGUFSource
from tgictl.runtime.shard.safetensors_files import INDEX_FILE, SafetensorsSource
from tgictl.runtime.tensor_parallel import even_split

__all__ = ["INDEX_FILE", "Weights", "aligned_split", "split_range"]

# (tensor name, first row, row after the last): a row range of one projection's weight.
RowRange = tuple[str, int, int]


def split_range(size: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rank's [start, stop) of `size` split as evenly as possible (parts differ by at most one)."""
    if size < world_size:
        raise UnsupportedModelError(f"a dimension of size {size} cannot be split over {world_size} shards")
    return even_split(size, rank, world_size)


def aligned_split(size: int, rank: int, world_size: int, alignment: int) -> tuple[int, int]:
    """Rank's [start, stop) of `size` in whole units of `alignment` (the last rank also takes the
    remainder); the plain even split when there are fewer units than ranks."""
    units = size // alignment
    if alignment <= 1 or units < world_size:
        return split_range(size, rank, world_size)
    start, stop = even_split(units, rank, world_size)
    return start * alignment, (size if rank == world_size - 1 else stop * alignment)


class Weights:
    """Named tensors of one model directory, converted to `dtype` on `device` as they are read.

    `quantize`: the --quantize method for projections read as floats (None: dense). Keeps the files
    mapped until `close()` (or the end of a `with` block).
    """

    def __init__(self, model_dir: Path, *, dtype: torch.dtype, device: torch.device, dist: DistContext,
                 quantize: QuantizeSpec | None = None) -> None:
        self.model_dir = Path(model_dir)
        self.dtype = dtype
        self.device = device
        self.dist = dist
        gguf = served_gguf_file(self.model_dir, quantize)
        self._source: SafetensorsSource | GGUFSource = GGUFSource(gguf) if gguf else SafetensorsSource(self.model_dir)
        self.method = linear_method(quantize)

    @property
    def is_gguf(self) -> bool:
        return isinstance(self._source, GGUFSource)

    def __enter__(self) -> Weights:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._source.close()

    def names(self) -> list[str]:
        return self._source.names()

    def has(self, name: str) -> bool:
        return self._source.has(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._source.shape(name)

    def _convert(self, tensor: Tensor) -> Tensor:
        converted = tensor.to(device=self.device, dtype=self.dtype)
        # A tensor already in the serving dtype comes back as a view of the file's mapping, and one view keeps the
        # whole file mapped (and its pages resident) while it lives. Dense serving wants that: its weights are the
        # mapping, never copied. A quantized model keeps only norms and biases as floats: it copies them and lets
        # the mapping go, or a 1B checkpoint's 2.4 GB of floats would stay in its memory beside the int8 weights.
        if self.method.name != "dense" and converted.data_ptr() == tensor.data_ptr():
            converted = converted.clone()
        return converted

    def get(self, name: str) -> Tensor:
        """The whole tensor (replicated weights: norms, biases of row-parallel layers)."""
        return self._convert(self._source.read(name, 0, 0, self.shape(name)[0]))

    def get_range(self, name: str, dim: int, start: int, stop: int) -> Tensor:
        """Indices start .. stop - 1 along `dim` (0 or 1), read from the mapping without the rest."""
        return self._convert(self._source.read(name, dim, start, stop))

    def get_sharded(self, name: str, dim: int) -> Tensor:
        """This rank's even part of `name` along `dim` (column-parallel: 0, row-parallel: 1)."""
        size = self.shape(name)[dim]
        start, stop = split_range(size, self.dist.rank, self.dist.world_size)
        return self.get_range(name, dim, start, stop)

    def column_split(self, name: str, role: Role = Role.PROJECTION) -> tuple[int, int]:
        """This rank's input columns of `name`, on the boundaries its format quantizes in."""
        alignment = max(self._source.column_alignment(name), self.method.column_alignment(role))
        return aligned_split(self.shape(name)[1], self.dist.rank, self.dist.world_size, alignment)

    def _from_floats(self, weight: Tensor, role: Role) -> LinearWeight:
        return self.method.from_dense(weight, self.dtype, role).to(self.device)

    def linear_rows(self, parts: Sequence[RowRange], role: Role = Role.PROJECTION) -> LinearWeight:
        """Row ranges of one or more [out, in] matrices stacked into one projection (fused where the
        format allows: several float parts are quantized together, as one matrix)."""
        natives = [self._source.linear(name, 0, start, stop, self.dtype) for name, start, stop in parts]
        if all(native is None for native in natives):
            floats = [self._source.read(name, 0, start, stop) for name, start, stop in parts]
            return self._from_floats(floats[0] if len(floats) == 1 else torch.cat(floats), role)
        pieces = [
            native.to(self.device) if native is not None else self._from_floats(self._source.read(name, 0, a, b), role)
            for native, (name, a, b) in zip(natives, parts)
        ]
        return served_form(concat_rows(pieces))

    def linear_columns(self, name: str, start: int, stop: int, role: Role = Role.PROJECTION) -> LinearWeight:
        """Input columns [start, stop) of an [out, in] matrix (a row-parallel rank's part)."""
        native = self._source.linear(name, 1, start, stop, self.dtype)
        if native is not None:
            return served_form(native.to(self.device))
        if self.method.whole_rows:  # its quantization of a slice depends on the rest of each row
            whole = self._source.read(name, 0, 0, self.shape(name)[0])
            return self.method.from_dense_columns(whole, start, stop, self.dtype, role).to(self.device)
        return self._from_floats(self._source.read(name, 1, start, stop), role)
