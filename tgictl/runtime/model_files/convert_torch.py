"""PyTorch `.bin`/`.pt` checkpoints (single, or sharded with an index) → safetensors.

Pickle checkpoints can run arbitrary code when loaded, so they are read only with
torch.load(weights_only=True). safetensors cannot store two names for one storage, so tensors that
share memory are either dropped as tied aliases (the LM head of a model that ties it to the
embedding: transformers re-ties it on load) or saved as separate copies. Every written tensor is read
back and compared bit for bit with its source.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tgictl.errors import ConversionError
from tgictl.log import get_logger
from tgictl.runtime.model_files.conversion_output import TORCH_SUFFIXES, check_writable

log = get_logger(__name__)

_DTYPES = ("float32", "bfloat16", "float16")
# Files that make a directory a usable model besides its weights; copied when writing elsewhere.
_SIDE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


@dataclass(frozen=True)
class _Source:
    """What to convert: shard files in order, and the index's metadata when sharded."""

    directory: Path
    shards: tuple[Path, ...]
    index: dict[str, Any] | None = None


@dataclass
class _Plan:
    """One state dict ready to save: the tensors to write and the tied aliases left out."""

    tensors: dict[str, Any] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)  # dropped name -> kept name


def safetensors_name(shard: Path) -> str:
    """pytorch_model-00001-of-00002.bin → model-00001-of-00002.safetensors; weights.pt → weights.safetensors."""
    stem = shard.name.rsplit(".", 1)[0]
    if stem.startswith("pytorch_model"):
        stem = "model" + stem[len("pytorch_model") :]
    return stem + ".safetensors"


def find_source(path: Path) -> _Source:
    if path.is_file() and path.name.endswith(".index.json"):
        return _from_index(path)
    if path.is_file():
        if path.suffix not in TORCH_SUFFIXES:
            raise ConversionError(f"{path} is not a checkpoint (expected .gguf, .bin, .pt or .pth)")
        return _Source(path.parent, (path,))
    indexes = sorted(p for p in path.glob("*.index.json") if not p.name.endswith(".safetensors.index.json"))
    if indexes:
        return _from_index(indexes[0])
    files = sorted(p for p in path.iterdir() if p.suffix in TORCH_SUFFIXES)
    if len(files) == 1:
        return _Source(path, (files[0],))
    if not files:
        raise ConversionError(f"no PyTorch checkpoint (.bin, .pt, .pth) in {path}")
    raise ConversionError(f"{len(files)} checkpoint files in {path} but no index; pass one file")


def _from_index(index_path: Path) -> _Source:
    try:
        index = json.loads(index_path.read_text())
        weight_map: dict[str, str] = index["weight_map"]
    except (ValueError, KeyError, TypeError) as err:
        raise ConversionError(f"{index_path} is not a checkpoint index ({err})") from None
    shards = tuple(index_path.parent / name for name in sorted(set(weight_map.values())))
    missing = [s.name for s in shards if not s.is_file()]
    if missing:
        raise ConversionError(f"{index_path.name} names missing shard files: {', '.join(missing)}")
    return _Source(index_path.parent, shards, index)


def load_state_dict(path: Path) -> dict[str, Any]:
    """Load a checkpoint's tensors without executing pickled code."""
    import torch

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=False)
    except Exception as err:  # noqa: BLE001 - garbage input fails in many ways (KeyError, UnpicklingError...)
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConversionError(f"{path} is not a PyTorch checkpoint ({first_line})") from None
    # Training scripts often nest the weights: {"state_dict": {...}} or {"model": {...}}.
    for key in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not any(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ConversionError(f"{path} holds no tensors (a {type(obj).__name__}, not a state dict)")
    skipped = sorted(k for k, v in obj.items() if not isinstance(v, torch.Tensor))
    if skipped:
        log.warning("%s: skipping %d non-tensor entries: %s", path.name, len(skipped), ", ".join(skipped[:5]))
    return {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}


def plan_tensors(state: dict[str, Any], *, tied: bool, dtype: str | None) -> _Plan:
    """Resolve shared storage and cast; the result has one storage per name, contiguous."""
    import torch

    target = getattr(torch, dtype) if dtype is not None else None
    groups: dict[tuple[Any, int], list[str]] = {}
    for name, tensor in state.items():
        storage = tensor.untyped_storage()
        groups.setdefault((storage.data_ptr(), storage.nbytes()), []).append(name)

    plan = _Plan()
    for names in groups.values():
        # Prefer keeping the input embedding: the LM head is the alias transformers re-ties.
        names.sort(key=lambda n: (n.endswith("lm_head.weight"), n))
        kept = names[0]
        for name in names[1:]:
            if tied and name.endswith("lm_head.weight") and _same_view(state[name], state[kept]):
                plan.aliases[name] = kept
        for name in names:
            if name in plan.aliases:
                continue
            tensor = state[name]
            tensor = tensor.to(target) if target is not None and tensor.is_floating_point() else tensor
            # clone() gives each name its own storage; contiguous() alone may return the shared view.
            plan.tensors[name] = tensor.contiguous().clone() if len(names) > 1 else tensor.contiguous()
    return plan


def _same_view(a: Any, b: Any) -> bool:
    return a.shape == b.shape and a.stride() == b.stride() and a.storage_offset() == b.storage_offset()


def convert_torch_checkpoint(
    path: Path, output: Path | None = None, *, dtype: str | None = None, force: bool = False
) -> Path:
    """Convert the checkpoint at `path` (file, index or directory) into safetensors in `output`
    (default: the checkpoint's directory). Returns the output directory."""
    if dtype is not None and dtype not in _DTYPES:
        raise ConversionError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    source = find_source(path)
    output = output if output is not None else source.directory
    names = [safetensors_name(s) for s in source.shards]
    index_name = "model.safetensors.index.json" if source.index is not None else None
    for name in names + ([index_name] if index_name else []):
        check_writable(output / name, force=force)
    output.mkdir(parents=True, exist_ok=True)
    tied = _config(source.directory).get("tie_word_embeddings", True)

    weight_map: dict[str, str] = {}
    total_size = 0
    for shard, name in zip(source.shards, names):
        state = load_state_dict(shard)
        plan = plan_tensors(state, tied=bool(tied), dtype=dtype)
        total_size += _write_verified(plan, state, output / name, dtype=dtype)
        weight_map.update({tensor_name: name for tensor_name in plan.tensors})
        log.info("%s → %s (%d tensors, %d tied aliases dropped)", shard.name, name, len(plan.tensors), len(plan.aliases))
    if index_name is not None:
        index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
        (output / index_name).write_text(json.dumps(index, indent=2) + "\n")
    if output.resolve() != source.directory.resolve():
        for side in _SIDE_FILES:
            if (source.directory / side).is_file():
                shutil.copyfile(source.directory / side, output / side)
    return output


def _config(directory: Path) -> dict[str, Any]:
    config_path = directory / "config.json"
    try:
        return json.loads(config_path.read_text()) if config_path.is_file() else {}
    except ValueError as err:
        raise ConversionError(f"{config_path} is not valid JSON ({err})") from None


def _bitwise_equal(a: Any, b: Any) -> bool:
    """Equal bit for bit (torch.equal calls NaN != NaN, which a faithful copy must not fail)."""
    import torch

    if a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def _write_verified(plan: _Plan, state: dict[str, Any], target: Path, *, dtype: str | None) -> int:
    """Save `plan` to `target` (via a temporary name), then compare every tensor with its source."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    partial = target.with_name(target.name + ".partial")
    save_file(plan.tensors, str(partial), metadata={"format": "pt"})
    cast = getattr(torch, dtype) if dtype is not None else None
    size = 0
    with safe_open(str(partial), framework="pt") as saved:
        for name in state:
            stored_name = plan.aliases.get(name, name)
            written = saved.get_tensor(stored_name)
            expected = state[name].to(cast) if cast is not None and state[name].is_floating_point() else state[name]
            if written.dtype != expected.dtype or not _bitwise_equal(written, expected):
                partial.unlink()
                raise ConversionError(f"{target.name}: tensor {name!r} differs from its source after conversion")
            if stored_name == name:
                size += written.numel() * written.element_size()
    partial.replace(target)
    return size
