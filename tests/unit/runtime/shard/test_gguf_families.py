"""GGUF files of every family llama.cpp writes and transformers can read the config of (Gemma 2, Gemma 3, Phi-3 and
the Llama 3 rotary scaling), written as llama.cpp's converter writes them (tgictl/testing/tiny_gguf.py): the
settings transformers' GGUF config reader drops (sliding windows, soft-caps, partial rotary, rotary scaling and
factor tensors, Gemma's query scale) are read back (model_files/gguf_config.py), so that

- an F32 file served natively gives the logits transformers computes on the safetensors model it was written
  from (within 1e-4): the config and the tensor names, Gemma's 1 + w norms and fused Phi-3 projections agree;
- a Q8_0 file gives the logits transformers computes from the same file's dequantized tensors under the config
  it was written from: the blocks agree.

A Mistral file is llama to llama.cpp, which writes no sliding window for it (and attends fully): so does tgictl.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tgictl.errors import UnsupportedModelError
from tgictl.kernels import build_attention_metadata
from tgictl.runtime.gguf_reader import read_gguf
from tgictl.runtime.model_files.gguf_config import reconcile_config
from tgictl.runtime.model_files.gguf_model import gguf_model_dir
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.models.base import CausalLM
from tgictl.runtime.shard.models.registry import load_model
from tgictl.testing.tiny_gguf import ARCHITECTURES, every_projection, write_tiny_gguf

CPU = torch.device("cpu")
BLOCK_SIZE = 4
PROMPT = [5, 17, 200, 3, 9, 44, 101, 7, 250, 12, 33, 80, 1, 2, 300, 4, 8, 90, 6, 61]  # past every window of 6
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8}
LONGROPE = {"rope_type": "longrope", "long_factor": [1.0 + 0.5 * i for i in range(16)],
            "short_factor": [1.0 + 0.1 * i for i in range(16)]}
# case -> (family, tiny model options)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "gemma2: soft-caps, alternating window, tied head": ("gemma2", {"sliding_window": 6}),
    "gemma3: 5 local : 1 global, two bases, linear global scaling": (  # llama.cpp's fixed pattern of 6
        "gemma3_text", {"sliding_window": 6, "num_layers": 6, "sliding_window_pattern": 6,
                        "rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
    "phi3: fused projections, partial rotary, window": ("phi3", {"sliding_window": 6}),
    "phi3: longrope past its original length": (
        "phi3", {"rope_scaling": LONGROPE, "original_max_position_embeddings": 8, "max_position_embeddings": 64}),
    "llama 3: rope_freqs": ("llama", {"rope_scaling": LLAMA3}),
}


def _paged_logits(model: CausalLM, ids: list[int]) -> torch.Tensor:
    """The prompt's first 12 tokens in one prefill, then one decode step per token: logits at every position."""
    cache = model.allocate_kv_cache(16, BLOCK_SIZE)
    blocks = list(range(15, 0, -1))
    slots = [blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(len(ids))]
    table = blocks[: -(-len(ids) // BLOCK_SIZE)]
    meta = build_attention_metadata([0], [12], [table], BLOCK_SIZE, CPU)
    out = [model(torch.tensor(ids[:12]), torch.arange(12), torch.tensor(slots[:12]), cache, meta, torch.arange(12))]
    for p in range(12, len(ids)):
        meta = build_attention_metadata([p], [1], [table], BLOCK_SIZE, CPU)
        out.append(model(torch.tensor(ids[p : p + 1]), torch.tensor([p]), torch.tensor(slots[p : p + 1]), cache, meta,
                         torch.tensor([0])))
    return torch.cat(out)


def _served(case: str, block_type: str, root: Path) -> tuple[Path, Path, CausalLM]:
    family, options = CASES[case]
    path = write_tiny_gguf(root / f"{block_type}.gguf", family, types=every_projection(block_type), **options)
    model_dir = gguf_model_dir(path, root / "cache")
    return path, model_dir, load_model(model_dir, dtype=torch.float32, device=CPU, dist=DistContext.single())


def _transformers_logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([PROMPT])).logits[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_f32_file_computes_the_model_it_was_written_from(case: str, tmp_path: Path) -> None:
    path, _, model = _served(case, "F32", tmp_path)
    source = path.parent / f"{path.stem}-source"  # the safetensors model write_tiny_gguf converted
    expected = _transformers_logits(AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32,
                                                                         attn_implementation="eager"))
    assert (_paged_logits(model, PROMPT) - expected).abs().max().item() <= 1e-4


@pytest.mark.parametrize("case", sorted(CASES))
def test_q8_0_blocks_compute_their_dequantized_values(case: str, tmp_path: Path) -> None:
    path, _, model = _served(case, "Q8_0", tmp_path)
    config = AutoConfig.from_pretrained(path.parent / f"{path.stem}-source")  # the config the file was written from
    reference = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, config=config,
                                                     dtype=torch.float32, attn_implementation="eager")
    expected = _transformers_logits(reference)
    actual = _paged_logits(model, PROMPT)
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-4 * float(expected.abs().max()))


def test_every_served_architecture_has_a_tiny_file() -> None:
    assert set(ARCHITECTURES.values()) == {"llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "qwen3moe"}


def test_an_unknown_rope_scaling_is_refused_in_one_line(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf", "llama", types=every_projection("F32"))
    header = read_gguf(path)
    header.fields["llama.rope.scaling.type"] = "su"
    with pytest.raises(UnsupportedModelError, match="rope scaling 'su' \\(llama.rope.scaling.type\\) is not supported"):
        reconcile_config({"hidden_size": 256, "num_attention_heads": 4}, header)
