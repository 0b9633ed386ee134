"""MoE GGUF files as llama.cpp's converter writes them (experts stacked per projection: `blk.N.ffn_gate_exps`),
served natively: the config the model directory gets, and the logits against transformers on the values the file
stores (its own GGUF load for Qwen3-MoE; for Mixtral, written as `llama`, which transformers reads as a dense Llama,
on a checkpoint of the file's dequantized tensors)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_gguf_models import PROMPT, _paged_logits
from transformers import AutoConfig, AutoModelForCausalLM

from tgictl.errors import ConversionError
from tgictl.kernels.linear_methods import GGUFWeight, Int4Weight
from tgictl.runtime.gguf_reader import read_gguf
from tgictl.runtime.model_files.convert_gguf import convert_gguf
from tgictl.runtime.model_files.gguf_model import gguf_model_dir
from tgictl.runtime.model_files.gguf_moe import moe_fields
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.gguf_file import GGUFSource
from tgictl.runtime.shard.models.registry import load_model
from tgictl.testing.tiny_gguf import dequantized_checkpoint, every_projection, source_dir, write_tiny_gguf

CPU = torch.device("cpu")
CASES = {"mixtral Q8_0": ("mixtral", "Q8_0"), "mixtral Q4_0": ("mixtral", "Q4_0"),
         "qwen3_moe Q8_0": ("qwen3_moe", "Q8_0"), "qwen3_moe Q4_1": ("qwen3_moe", "Q4_1")}


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    built: dict[str, Path] = {}
    root = tmp_path_factory.mktemp("moe-gguf")

    def build(case: str) -> Path:
        if case not in built:
            family, block_type = CASES[case]
            built[case] = write_tiny_gguf(root / f"{len(built)}.gguf", family, types=every_projection(block_type))
        return built[case]

    return build


def _reference(case: str, path: Path, model_dir: Path, tmp_path: Path) -> AutoModelForCausalLM:
    if CASES[case][0] == "qwen3_moe":  # transformers' own GGUF load, told the experts' width it cannot read
        config = AutoConfig.from_pretrained(model_dir)
        return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, config=config,
                                                    dtype=torch.float32)
    checkpoint = dequantized_checkpoint(path, source_dir(path), tmp_path / "dequantized")
    return AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)


@pytest.mark.parametrize("case", list(CASES))
def test_native_moe_gguf_matches_transformers(case: str, gguf_files: Callable[[str], Path], tmp_path: Path) -> None:
    path = gguf_files(case)
    model_dir = gguf_model_dir(path, tmp_path / "cache")
    reference = _reference(case, path, model_dir, tmp_path).eval()
    model = load_model(model_dir, dtype=torch.float32, device=CPU, dist=DistContext.single())
    ids = list(PROMPT)
    with torch.no_grad():
        for _ in range(6):  # greedy continuation by the reference
            ids.append(int(reference(torch.tensor([ids])).logits[0, -1].argmax()))
        expected = reference(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(_paged_logits(model, ids), expected, rtol=0, atol=1e-4 * float(expected.abs().max()))
    experts = model.layers[0].mlp.experts
    kind = Int4Weight if CASES[case][1] in ("Q4_0", "Q4_1") else GGUFWeight  # Q4_0/Q4_1 repacked as int4 tiles
    assert all(isinstance(w, kind) for w in (*experts.gate_up, *experts.down))  # the blocks, not floats


def test_config_carries_the_files_expert_settings(gguf_files: Callable[[str], Path], tmp_path: Path) -> None:
    mixtral = json.loads((gguf_model_dir(gguf_files("mixtral Q8_0"), tmp_path / "a") / "config.json").read_text())
    assert (mixtral["model_type"], mixtral["num_local_experts"], mixtral["num_experts_per_tok"]) == ("mixtral", 8, 2)
    assert mixtral["intermediate_size"] == 64 and mixtral["sliding_window"] is None
    qwen = json.loads((gguf_model_dir(gguf_files("qwen3_moe Q8_0"), tmp_path / "b") / "config.json").read_text())
    assert (qwen["model_type"], qwen["num_experts"], qwen["num_experts_per_tok"]) == ("qwen3_moe", 16, 4)
    assert qwen["moe_intermediate_size"] == 64 and qwen["norm_topk_prob"] is True


def test_expert_names_resolve_to_slices_of_the_stacked_tensor(gguf_files: Callable[[str], Path]) -> None:
    source = GGUFSource(gguf_files("qwen3_moe Q8_0"))
    try:
        assert source.shape("model.layers.1.mlp.experts.15.down_proj.weight") == (256, 64)
        assert source.has("model.layers.1.mlp.experts.15.gate_proj.weight")
        assert not source.has("model.layers.1.mlp.experts.16.gate_proj.weight")  # 16 experts: 0..15
        first = source.read("model.layers.0.mlp.experts.0.up_proj.weight", 0, 0, 64)
        other = source.read("model.layers.0.mlp.experts.1.up_proj.weight", 0, 0, 64)
        assert first.shape == (64, 256) and not torch.equal(first, other)
    finally:
        source.close()


def test_a_dense_gguf_has_no_expert_fields(tmp_path: Path) -> None:
    assert moe_fields(read_gguf(write_tiny_gguf(tmp_path / "dense.gguf", "llama"))) == {}


def test_missing_expert_width_is_a_conversion_error(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "broken.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen3moe")
    writer.add_expert_count(8)
    writer.add_expert_used_count(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ConversionError, match="expert_feed_forward_length"):
        moe_fields(read_gguf(path))


def test_convert_refuses_an_moe_file_in_one_line(gguf_files: Callable[[str], Path], tmp_path: Path) -> None:
    """`tgictl convert` dequantizes through transformers, which would drop Mixtral's experts: refused, not wrong."""
    with pytest.raises(ConversionError, match="is a mixture of experts \\(mixtral\\).*--model-id FILE.gguf"):
        convert_gguf(gguf_files("mixtral Q8_0"), tmp_path / "out")
    assert not (tmp_path / "out").exists()
