"""Memory-mapped safetensors checkpoints as a tensor source for the shard's loader, read slice by slice.

`safe_open` maps each file; `get_slice(name)[a:b]` copies only the requested rows (or columns) out
of the mapping, so a tensor-parallel rank never materialises the other ranks' parts. Sharded
checkpoints are found through `model.safetensors.index.json`; without an index, `model.safetensors`
alone, else every `*.safetensors` file in the directory. Tensors come back in the checkpoint's own
dtype: runtime/shard/weights.py converts or quantizes them.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor

from tgictl.errors import ConfigError
from tgictl.kernels.linear_methods import LinearWeight

INDEX_FILE = "model.safetensors.index.json"


class SafetensorsSource:
    """Named tensors of one checkpoint directory; keeps the files mapped until `close()`."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = Path(model_dir)
        self._stack = ExitStack()
        self._handles: dict[str, Any] = {}  # file name -> safe_open handle
        self._file_of: dict[str, str] = {}  # tensor name -> file name
        try:
            for file_name in checkpoint_files(self.model_dir):
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

    def read(self, name: str, dim: int, start: int, stop: int) -> Tensor:
        """Indices start .. stop - 1 along `dim` (0 or 1), read from the mapping without the rest."""
        view = self._slice(name)
        rank_of = len(view.get_shape())
        if dim == 0:
            return view[start:stop]
        if dim == 1 and rank_of == 2:
            return view[:, start:stop]
        raise ConfigError(f"cannot slice {name!r} (rank {rank_of}) along dim {dim}")

    def linear(self, name: str, dim: int, start: int, stop: int, dtype: torch.dtype) -> LinearWeight | None:
        """safetensors hold floats only: the loader makes every linear from `read`."""
        return None

    def column_alignment(self, name: str) -> int:
        return 1


def checkpoint_files(model_dir: Path) -> list[str]:
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
