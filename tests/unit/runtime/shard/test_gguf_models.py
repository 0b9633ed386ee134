"""GGUF files served natively against transformers' own GGUF load (which dequantizes them): tiny models of
every family with every native block type, a file mixing types (fused and stacked projections, a type
without a native kernel, F16), read through the directory gguf_model.py writes; the names and llama's
q/k row order undone exactly as transformers does."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import Tensor
from transformers import AutoModelForCausalLM
from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

from tgictl.kernels import build_attention_metadata
from tgictl.kernels.linear_methods import BLOCK_TYPES, DenseWeight, GGUFWeight, Int4Weight, StackedLinearWeight
from tgictl.kernels.linear_methods.gguf_repack import REPACKED_TYPES
from tgictl.kernels.linear import fma_linear_available, linear
from tgictl.kernels.prepacked import prepack
from tgictl.runtime.model_files.gguf_model import gguf_model_dir
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.gguf_file import llama_row_order
from tgictl.runtime.shard.models.base import CausalLM
from tgictl.runtime.shard.models.registry import load_model, packing_candidates
from tgictl.testing.tiny_gguf import TypeChoice, every_projection, llama_permute, write_tiny_gguf

CPU = torch.device("cpu")
BLOCK_SIZE = 4
PROMPT = [5, 17, 200, 3, 9, 44, 101, 7, 250, 12, 33]
DECODE_STEPS = 6


def _mixed(name: str) -> str:
    """q, k, v in three types (no fused qkv), gate/up fused, down F16, a type without a native kernel."""
    table = {"attn_q": "Q4_K", "attn_k": "Q6_K", "attn_v": "Q8_0", "attn_output": "Q4_1", "ffn_gate": "Q4_0",
             "ffn_up": "Q4_0", "ffn_down": "F16", "token_embd": "Q5_0", "output.": "Q6_K"}
    return next((kind for key, kind in table.items() if key in name), "F32")


CASES: dict[str, tuple[str, TypeChoice]] = {
    **{f"llama {t}": ("llama", every_projection(t)) for t in sorted(BLOCK_TYPES)},
    "qwen2 Q8_0 (q/k/v bias, tied)": ("qwen2", every_projection("Q8_0")),
    "qwen3 Q4_1 (q/k norms, tied)": ("qwen3", every_projection("Q4_1")),
    "llama mixed types": ("llama", _mixed),
}


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    built: dict[str, Path] = {}
    root = tmp_path_factory.mktemp("tiny-gguf")

    def build(case: str) -> Path:
        if case not in built:
            family, types = CASES[case]
            built[case] = write_tiny_gguf(root / f"{len(built)}.gguf", family, types=types)
        return built[case]

    return build


def _paged_logits(model: CausalLM, ids: list[int]) -> Tensor:
    """Logits at every position: the prompt in one prefill, then one decode step per further token."""
    cache = model.allocate_kv_cache(24, BLOCK_SIZE)
    blocks = list(range(23, 0, -1))  # not in order, as a router's free list hands them out
    slots = [blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(len(ids))]
    table = blocks[: -(-len(ids) // BLOCK_SIZE)]
    n = len(PROMPT)
    meta = build_attention_metadata([0], [n], [table], BLOCK_SIZE, CPU)
    out = [model(torch.tensor(ids[:n]), torch.arange(n), torch.tensor(slots[:n]), cache, meta, torch.arange(n))]
    for p in range(n, len(ids)):
        meta = build_attention_metadata([p], [1], [table], BLOCK_SIZE, CPU)
        out.append(model(torch.tensor(ids[p : p + 1]), torch.tensor([p]), torch.tensor(slots[p : p + 1]), cache,
                         meta, torch.tensor([0])))
    return torch.cat(out)


@pytest.mark.parametrize("case", list(CASES))
def test_native_gguf_matches_transformers_gguf_load(case: str, gguf_files: Callable[[str], Path],
                                                    tmp_path: Path) -> None:
    path = gguf_files(case)
    reference = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    model_dir = gguf_model_dir(path, tmp_path / "cache")
    model = load_model(model_dir, dtype=torch.float32, device=CPU, dist=DistContext.single())
    ids = list(PROMPT)
    with torch.no_grad():
        for _ in range(DECODE_STEPS):  # greedy continuation by the reference
            ids.append(int(reference(torch.tensor([ids])).logits[0, -1].argmax()))
        expected = reference(torch.tensor([ids])).logits[0]  # [len, vocab]
    actual = _paged_logits(model, ids)
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-4 * float(expected.abs().max()))
    attention = model.layers[0].attention
    if case == "llama mixed types":
        assert isinstance(attention.qkv.weight, StackedLinearWeight)  # three block types: side by side
        # one type (Q4_0): fused into one, as int4 tiles for the int4 kernels (gguf_repack.py)
        assert isinstance(model.layers[0].mlp.gate_up.weight, Int4Weight)
        assert isinstance(model.layers[0].mlp.down.weight, DenseWeight)  # F16: a float tensor
        assert isinstance(model.embed.weight, DenseWeight)  # Q5_0 has no native kernel: dequantized
        assert isinstance(model.lm_head.weight, GGUFWeight) and model.lm_head.weight is not model.embed.weight
    else:
        repacked = any(t in case for t in REPACKED_TYPES)
        assert isinstance(attention.qkv.weight, Int4Weight if repacked else GGUFWeight)
        assert isinstance(model.embed.weight, Int4Weight if repacked else GGUFWeight)


def test_types_without_a_native_kernel_are_named_once(gguf_files: Callable[[str], Path], tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    model_dir = gguf_model_dir(gguf_files("llama mixed types"), tmp_path / "cache")
    with caplog.at_level(logging.INFO, logger="tgictl.runtime.shard.gguf_file"):
        load_model(model_dir, dtype=torch.float32, device=CPU, dist=DistContext.single())
    lines = [r.getMessage() for r in caplog.records if "dequantized at load" in r.getMessage()]
    assert len(lines) == 1 and "Q5_0 (1 tensors)" in lines[0] and "token_embd.weight" in lines[0]
    assert "F16" not in lines[0]  # a float type is read as it is, not "dequantized"


@pytest.mark.parametrize(("rows", "heads"), [(256, 4), (128, 2), (576, 9), (192, 3)])
def test_row_order_is_transformers_reverse_permutation(rows: int, heads: int) -> None:
    weights = torch.randn(rows, 8).numpy()
    ours = weights[llama_row_order(rows, heads).numpy()]
    processor = LlamaTensorProcessor(config={"num_attention_heads": heads, "num_key_value_heads": heads})
    theirs = processor.process(weights=weights, name="blk.0.attn_q.weight").weights
    assert (ours == theirs).all()
    assert (llama_permute(weights, heads)[llama_row_order(rows, heads).numpy()] == weights).all()  # undone exactly


def test_a_gguf_lm_head_gets_a_bf16_copy_for_many_rows(gguf_files: Callable[[str], Path], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The quantized LM head is held a second time for oneDNN (kernels/prepacked.py); the projections keep
    only their blocks."""
    monkeypatch.setenv("TGICTL_PREPACK_WEIGHTS", "1")
    model = load_model(gguf_model_dir(gguf_files("llama Q8_0"), tmp_path / "cache"), dtype=torch.bfloat16, device=CPU,
                       dist=DistContext.single())
    head = model.lm_head.weight
    # where oneDNN cannot pack bf16 (AVX2 without AVX512-BW: no bf16 GEMM there) the copy is the plain
    # dequantization, for csrc/fma_linear.c
    packs_here = prepack(torch.zeros(8, 32, dtype=torch.bfloat16)) is not None
    assert isinstance(head, GGUFWeight) and (head.onednn_weight is not None) == packs_here
    assert (head.plain_bf16_weight is not None) == (not packs_here and fma_linear_available())
    if head.plain_bf16_weight is not None:
        assert torch.equal(head.plain_bf16_weight, head.dequantize().bfloat16())
    assert head in packing_candidates(model)
    projections = [m for m in model.modules() if isinstance(m, GGUFWeight) and m is not head]
    assert projections and all(m.onednn_weight is None and m.plain_bf16_weight is None for m in projections)
    x = torch.randn(9, head.in_features).to(torch.bfloat16)  # 9 rows: the packed copy
    torch.testing.assert_close(head(x).float(), (x.float() @ head.dequantize().t()), atol=0.05, rtol=0.02)
    if head.plain_bf16_weight is not None:  # the plain copy's product is kernels/linear.py's on it
        assert torch.equal(head(x), linear(x, head.plain_bf16_weight))
