"""Memory-mapped safetensors checkpoints, read slice by slice.

`safe_open` maps each file; `get_slice(name)[a:b]` copies only the requested rows (or columns) out
of the mapping, so a tensor-parallel rank never materialises the other ranks' parts. Sharded
checkpoints are found through `model.safetensors.index.json`; without an index, `model.safetensors`
alone, else every `*.safetensors` file in the directory.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor

from tgictl.errors import ConfigError, UnsupportedModelError
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.tensor_parallel import even_split

INDEX_FILE = "model.safetensors.index.json"


def split_range(size: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rank's [start, stop) of `size` split as evenly as possible (parts differ by at most one)."""
    if size < world_size:
        raise UnsupportedModelError(f"a dimension of size {size} cannot be split over {world_size} shards")
    return even_split(size, rank, world_size)


class Weights:
    """Named tensors of one checkpoint directory, converted to `dtype` on `device` as they are read.

    Keeps the files mapped until `close()` (or the end of a `with` block).
    """

    def __init__(self, model_dir: Path, *, dtype: torch.dtype, device: torch.device, dist: DistContext) -> None:
        self.model_dir = Path(model_dir)
        self.dtype = dtype
        self.device = device
        self.dist = dist
        self._stack = ExitStack()
        self._handles: dict[str, Any] = {}  # file name -> safe_open handle
        self._file_of: dict[str, str] = {}  # tensor name -> file name
        try:
            for file_name in _checkpoint_files(self.model_dir):
                self._open(file_name)
        except BaseException:
            self.close()
            raise

    def _open(self, file_name: str) -> None:
        handle = self._stack.enter_context(safe_open(str(self.model_dir / file_name), framework="pt", device="cpu"))
        self._handles[file_name] = handle
        for name in handle.keys():
            if name in self._file_of:
                raise ConfigError(f"tensor {name!r} is in both {self._file_of[name]} and {file_name}")
            self._file_of[name] = file_name

    def __enter__(self) -> Weights:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stack.close()
        self._handles.clear()

    def names(self) -> list[str]:
        return sorted(self._file_of)

    def has(self, name: str) -> bool:
        return name in self._file_of

    def _slice(self, name: str) -> Any:
        if name not in self._file_of:
            raise ConfigError(f"tensor {name!r} is not in the checkpoint at {self.model_dir}")
        return self._handles[self._file_of[name]].get_slice(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._slice(name).get_shape())

    def _convert(self, tensor: Tensor) -> Tensor:
        return tensor.to(device=self.device, dtype=self.dtype)

    def get(self, name: str) -> Tensor:
        """The whole tensor (replicated weights: norms, biases of row-parallel layers)."""
        return self._convert(self._slice(name)[:])

    def get_range(self, name: str, dim: int, start: int, stop: int) -> Tensor:
        """Indices start .. stop - 1 along `dim` (0 or 1), read from the mapping without the rest."""
        view = self._slice(name)
        rank_of = len(view.get_shape())
        if dim == 0:
            part = view[start:stop]
        elif dim == 1 and rank_of == 2:
            part = view[:, start:stop]
        else:
            raise ConfigError(f"cannot slice {name!r} (rank {rank_of}) along dim {dim}")
        return self._convert(part)

    def get_sharded(self, name: str, dim: int) -> Tensor:
        """This rank's even part of `name` along `dim` (column-parallel: 0, row-parallel: 1)."""
        size = self.shape(name)[dim]
        start, stop = split_range(size, self.dist.rank, self.dist.world_size)
        return self.get_range(name, dim, start, stop)


def _checkpoint_files(model_dir: Path) -> list[str]:
    if not model_dir.is_dir():
        raise ConfigError(f"model directory {model_dir} does not exist")
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError) as exc:
            raise ConfigError(f"cannot read the weight map of {index}: {exc}") from exc
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (model_dir / f).is_file()]
        if missing:
            raise ConfigError(f"{index} names files that do not exist: {', '.join(missing)}")
        return files
    if (model_dir / "model.safetensors").is_file():
        # The HF single-file name; other *.safetensors next to it (e.g. Mistral's consolidated.safetensors,
        # another naming scheme) are not part of this checkpoint.
        return ["model.safetensors"]
    files = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"no *.safetensors files in {model_dir} (convert .bin/.pt or GGUF checkpoints first)")
    return files
