"""PyTorch .bin/.pt → safetensors: single, sharded, tied, shared views, dtype casts, refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from tgictl.config import ConvertConfig
from tgictl.errors import ConversionError
from tgictl.runtime.model_files.convert import convert
from tgictl.runtime.model_files.convert_torch import (
    convert_torch_checkpoint,
    safetensors_name,
)

PROMPT = torch.tensor([[5, 17, 42, 99, 300, 7, 250]])  # ids: [1, 7]


def _bin_model_dir(source: Path, target: Path) -> dict[str, torch.Tensor]:
    """A copy of `source` whose weights are a single pytorch_model.bin (storage sharing kept)."""
    target.mkdir()
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(source / name, target / name)
    state = AutoModelForCausalLM.from_pretrained(source).state_dict()
    torch.save(state, target / "pytorch_model.bin")
    return state


def _logits(model_dir: Path) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        return model(PROMPT).logits  # [1, 7, vocab]


def _saved(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def test_single_bin_round_trip(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    source = tiny_model_dirs["llama"]
    work = tmp_path / "m"
    state = _bin_model_dir(source, work)
    assert convert(ConvertConfig(path=work)) == work
    saved = _saved(work / "model.safetensors")
    assert set(saved) == set(state)
    for name, tensor in state.items():
        assert torch.equal(saved[name], tensor), name
    (work / "pytorch_model.bin").unlink()  # transformers must load the safetensors alone
    assert torch.equal(_logits(work), _logits(source))


def test_tied_lm_head_is_dropped_and_retied(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    source = tiny_model_dirs["qwen3"]  # tie_word_embeddings: true
    work = tmp_path / "m"
    state = _bin_model_dir(source, work)
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    convert_torch_checkpoint(work / "pytorch_model.bin")
    saved = _saved(work / "model.safetensors")
    assert "lm_head.weight" not in saved
    assert torch.equal(saved["model.embed_tokens.weight"], state["lm_head.weight"])
    (work / "pytorch_model.bin").unlink()
    assert torch.equal(_logits(work), _logits(source))


def test_sharded_checkpoint_with_index(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    source = tiny_model_dirs["qwen2"]
    work = tmp_path / "src"
    state = _bin_model_dir(source, work)
    (work / "pytorch_model.bin").unlink()
    names = sorted(state)
    halves = {"pytorch_model-00001-of-00002.bin": names[: len(names) // 2], "pytorch_model-00002-of-00002.bin": names[len(names) // 2 :]}
    weight_map = {}
    for file, keys in halves.items():
        torch.save({k: state[k].clone() for k in keys}, work / file)
        weight_map.update({k: file for k in keys})
    (work / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    out = tmp_path / "out"
    assert convert_torch_checkpoint(work / "pytorch_model.bin.index.json", out) == out
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    assert set(index["weight_map"]) == set(state)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in state.values())
    for file in index["weight_map"].values():
        for name, tensor in _saved(out / file).items():
            assert torch.equal(tensor, state[name])
    # Side files came along, so `out` is a complete model directory.
    assert (out / "tokenizer.json").is_file()
    assert torch.equal(_logits(out), _logits(source))


def test_shared_views_without_tying_are_saved_as_copies(tmp_path: Path) -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state = {"fused.weight": base, "q.weight": base[:2], "k.weight": base[2:], "alias.weight": base}
    torch.save(state, tmp_path / "weights.pt")
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": False}))
    convert_torch_checkpoint(tmp_path / "weights.pt")
    saved = _saved(tmp_path / "weights.safetensors")
    assert set(saved) == set(state)
    for name, tensor in state.items():
        assert torch.equal(saved[name], tensor), name


def test_dtype_cast_and_nested_state_dict(tmp_path: Path) -> None:
    weight = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    steps = torch.tensor([1, 2, 3])
    torch.save({"state_dict": {"w": weight, "steps": steps}, "epoch": 3}, tmp_path / "ckpt.pt")
    convert_torch_checkpoint(tmp_path / "ckpt.pt", tmp_path / "out", dtype="bfloat16")
    saved = _saved(tmp_path / "out" / "ckpt.safetensors")
    assert saved["w"].dtype == torch.bfloat16
    assert torch.equal(saved["w"], weight.to(torch.bfloat16))
    assert torch.equal(saved["steps"], steps)  # integer tensors keep their dtype


def test_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(2)}, tmp_path / "pytorch_model.bin")
    convert_torch_checkpoint(tmp_path)
    with pytest.raises(ConversionError, match="model.safetensors already exists; pass --force to overwrite it"):
        convert_torch_checkpoint(tmp_path)
    torch.save({"w": torch.zeros(2)}, tmp_path / "pytorch_model.bin")
    convert_torch_checkpoint(tmp_path, force=True)
    assert torch.equal(_saved(tmp_path / "model.safetensors")["w"], torch.zeros(2))


class _Evil:
    def __reduce__(self):  # pickled as a call to os.system when loaded without weights_only
        import os

        return (os.system, ("touch evil-was-here",))


def test_pickled_code_is_never_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    torch.save({"w": torch.ones(1), "payload": _Evil()}, tmp_path / "bad.bin")
    with pytest.raises(ConversionError, match="bad.bin is not a PyTorch checkpoint"):
        convert_torch_checkpoint(tmp_path / "bad.bin")
    assert not (tmp_path / "evil-was-here").exists()


@pytest.mark.parametrize(
    ("files", "target", "message"),
    [
        ({"notes.bin": b"just some text"}, "notes.bin", "notes.bin is not a PyTorch checkpoint"),
        ({"readme.txt": b"hi"}, "readme.txt", "readme.txt is not a checkpoint"),
        ({"readme.txt": b"hi"}, ".", "no PyTorch checkpoint"),
        ({"a.bin": b"", "b.bin": b""}, ".", "2 checkpoint files in"),
        ({"pytorch_model.bin.index.json": b'{"weight_map": {"w": "gone.bin"}}'}, "pytorch_model.bin.index.json", "names missing shard files: gone.bin"),
    ],
)
def test_bad_inputs_are_conversion_errors(tmp_path: Path, files: dict[str, bytes], target: str, message: str) -> None:
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    with pytest.raises(ConversionError, match=message):
        convert(ConvertConfig(path=tmp_path / target))


def test_non_tensor_pickle_is_rejected(tmp_path: Path) -> None:
    torch.save([1, 2, 3], tmp_path / "list.pt")
    with pytest.raises(ConversionError, match="holds no tensors"):
        convert_torch_checkpoint(tmp_path / "list.pt")


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match="No such file or directory"):
        convert(ConvertConfig(path=tmp_path / "absent.bin"))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("pytorch_model.bin", "model.safetensors"),
        ("pytorch_model-00001-of-00003.bin", "model-00001-of-00003.safetensors"),
        ("weights.pt", "weights.safetensors"),
    ],
)
def test_safetensors_names(name: str, expected: str) -> None:
    assert safetensors_name(Path(name)) == expected


def test_a_checkpoint_inside_an_installed_package_is_converted_into_the_cache(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    installed = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "some_model"
    installed.parent.mkdir(parents=True)
    _bin_model_dir(tiny_model_dirs["llama"], installed)
    cache = tmp_path / "cache"
    out = convert(ConvertConfig(path=installed, cache_dir=cache))
    assert out == cache / "converted" / "some_model"
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert not (installed / "model.safetensors").exists()  # nothing written inside the package


def test_default_output_is_next_to_the_input_elsewhere(tmp_path: Path) -> None:
    from tgictl.runtime.model_files.convert import default_output, inside_installed_package

    assert default_output(tmp_path, "m", tmp_path / "cache") == tmp_path / "m"
    assert inside_installed_package(Path(torch.__file__).parent)  # the real site-packages
    assert default_output(Path(torch.__file__).parent, "m", tmp_path / "cache") == tmp_path / "cache" / "converted" / "m"
