"""The decode step's layers in one compiled call (kernels/decode_layers.py) against the Python layers.

The C loop makes the Python layers' calls in their order, so every logprob, token and KV entry must be
equal bit for bit, at the matrix-vector kernels' 1-4 rows and, where the many-row kernels run (AMX for
bf16, bf16 dot products for int4), at 5-32; and it must decline what it does not compute (prefill, more
rows than its kernels take, families other than Llama's layer, whose only extra the loop computes is one
sliding window for every layer and a q|k|v bias) without changing anything.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from shard_helpers import (
    BlockPool,
    Outputs,
    make_request,
    make_runner,
    run_to_end,
    shard_batch,
)

from tgictl.kernels.decode_layers import decode_layers
from tgictl.kernels.kv_pages import Int8Pages
from tgictl.kernels.linear_methods import Int4Weight, Int8Weight, dispatch, gguf_repack
from tgictl.kernels.metadata import AttentionMetadata
from tgictl.kernels.native import cpu_flags
from tgictl.proto.messages import SamplingParams
from tgictl.quantization import QuantizeSpec
from tgictl.runtime.model_files.gguf_model import gguf_model_dir
from tgictl.runtime.shard.models import decoder
from tgictl.runtime.shard.step import ModelRunner
from tgictl.testing.tiny_gguf import every_projection, write_tiny_gguf

PROMPTS = [[3, 17, 45, 200, 9, 31, 77], [100, 101, 102, 7], [11, 400, 12, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                                                               17, 18, 19, 20], [5]]
SAMPLING = [SamplingParams(), SamplingParams(do_sample=True, seed=3, temperature=0.8),
            SamplingParams(repetition_penalty=1.2), SamplingParams()]
# (hidden, heads, kv heads): head size 16 takes the attention kernel's loop, 64 its vector pair kernel.
SHAPES = {"head 16": (64, 4, 2), "head 64": (256, 4, 1)}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def model_dir(request: pytest.FixtureRequest, make_tiny_model: Callable[..., Path]) -> Path:
    hidden, heads, kv_heads = SHAPES[request.param]
    return make_tiny_model("llama", num_layers=4, hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads,
                           intermediate_size=2 * hidden, dtype="bfloat16")


def _generate(runner: ModelRunner, count: int, new_tokens: int) -> Outputs:
    outputs = Outputs()
    pool = BlockPool()
    requests = [make_request(pool, i, PROMPTS[i % len(PROMPTS)], max_new_tokens=new_tokens + i,
                             sampling=SAMPLING[i % len(SAMPLING)], ignore_eos=True) for i in range(count)]
    run_to_end(runner, shard_batch(runner, 0, requests), outputs)
    return outputs


def _python_layers(runner: ModelRunner, monkeypatch: pytest.MonkeyPatch) -> ModelRunner:
    monkeypatch.setattr(runner.model, "plain_layer_stack", lambda: None)
    return runner


def _compare(compiled: ModelRunner, reference: ModelRunner, rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Generate the same requests on both runners; equal tokens, logprobs and KV, and the C loop ran."""
    assert compiled.model.plain_layer_stack() is not None  # this model's layers are plain
    _python_layers(reference, monkeypatch)
    ran: list[bool] = []  # per forward of the compiled runner: did the C loop compute the layers

    def recording(*args: object, **kwargs: object) -> object:
        result = decode_layers(*args, **kwargs)  # type: ignore[arg-type]
        ran.append(result is not None)
        return result

    monkeypatch.setattr(decoder, "decode_layers", recording)
    ours = _generate(compiled, rows, 12)
    monkeypatch.setattr(decoder, "decode_layers", decode_layers)
    theirs = _generate(reference, rows, 12)
    # Never the prefill; every decode step of up to max_rows rows (more decline until enough finish).
    max_rows = compiled.model.plain_layer_stack().max_rows
    assert not ran[0] and ran[1] == (rows <= max_rows) and (all(ran[1:]) if rows <= max_rows else ran[-1])
    for rid in range(rows):
        assert ours.ids(rid) == theirs.ids(rid)
        assert ours.logprobs(rid) == theirs.logprobs(rid)  # float equality: the same logits
    for layer in range(compiled.kv_cache.num_layers):
        for a, b in zip(compiled.kv_cache.layer(layer), reference.kv_cache.layer(layer)):
            if isinstance(a, Int8Pages):
                assert torch.equal(a.values, b.values) and torch.equal(a.scales, b.scales)
            else:
                assert torch.equal(a, b)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 17, 33])
def test_the_compiled_layers_equal_the_python_layers_bit_for_bit(
    model_dir: Path, rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    _compare(make_runner(model_dir, dtype=torch.bfloat16), make_runner(model_dir, dtype=torch.bfloat16), rows,
             monkeypatch)


@pytest.mark.parametrize("rows", [1, 3, 9])
def test_an_int8_kv_cache_runs_in_the_loop_as_the_python_layers_do(
    model_dir: Path, rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--kv-cache-dtype int8: the loop stores rows and scales and attends over them with the kernels the Python
    layers call on that cache (head size 64: the VNNI kernel; 16: its portable loop), so the same bits."""
    _compare(make_runner(model_dir, dtype=torch.bfloat16, kv_cache_dtype="int8"),
             make_runner(model_dir, dtype=torch.bfloat16, kv_cache_dtype="int8"), rows, monkeypatch)


def _native_kernels_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python layers' int4 and int8 products on the C kernels, as the loop computes them: the
    matrix-vector ones up to 4 rows, the bf16 ones above (bf16 tiles, decoded int8 strips; the dispatch
    table may choose torch's kernel for some shapes; they differ by float rounding)."""
    monkeypatch.setattr(dispatch, "backend_order", lambda weight, x: ("native",) if x.shape[0] <= 4 else
                        ("native_bf16", "native"))


@pytest.mark.parametrize("rows", [1, 3, 9])
@pytest.mark.parametrize("group", [32, 64])
def test_int4_layers_equal_the_python_layers_on_the_c_kernel(
    model_dir: Path, rows: int, group: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = QuantizeSpec("int4", group)
    compiled = make_runner(model_dir, dtype=torch.bfloat16, quantize=spec)
    assert isinstance(compiled.model.layers[0].mlp.down.weight, Int4Weight)
    _native_kernels_only(monkeypatch)
    _compare(compiled, make_runner(model_dir, dtype=torch.bfloat16, quantize=spec), rows, monkeypatch)


def test_a_gguf_s_q4_1_layers_equal_the_python_layers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf", "llama", types=every_projection("Q4_1"))
    directory = gguf_model_dir(path, tmp_path / "cache")
    compiled = make_runner(directory, dtype=torch.bfloat16)
    assert isinstance(compiled.model.layers[0].attention.qkv.weight, Int4Weight)  # Q4_1 re-laid as int4 tiles
    _native_kernels_only(monkeypatch)
    for rows in (2, 6):
        _compare(compiled, make_runner(directory, dtype=torch.bfloat16), rows, monkeypatch)


@pytest.mark.parametrize("rows", [1, 4, 9])
def test_int8_layers_equal_the_python_layers_on_the_c_kernel(
    model_dir: Path, rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled = make_runner(model_dir, dtype=torch.bfloat16, quantize=QuantizeSpec("int8"))
    assert isinstance(compiled.model.layers[0].mlp.down.weight, Int8Weight)
    _native_kernels_only(monkeypatch)
    _compare(compiled, make_runner(model_dir, dtype=torch.bfloat16, quantize=QuantizeSpec("int8")), rows,
             monkeypatch)


def _decode_inputs(
    runner: ModelRunner, rows: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]:
    """hidden, cos, sin, slots and the metadata of one decode step of `rows` one-token sequences."""
    model = runner.model
    slots = torch.arange(rows, dtype=torch.int64) * runner.block_size + 3  # position 3 of blocks 0..rows-1
    meta = AttentionMetadata.build([3] * rows, [1] * rows, [[b] for b in range(rows)], runner.block_size,
                                   runner.device)
    hidden = model.embed(torch.arange(rows, dtype=torch.int64) + 5)
    cos, sin = model.rotary(torch.full((rows,), 3, dtype=torch.int64), None, hidden.dtype)
    return hidden, cos, sin, slots, meta


def test_the_loop_declines_what_it_does_not_compute(model_dir: Path) -> None:
    runner = make_runner(model_dir, dtype=torch.bfloat16)
    stack = runner.model.plain_layer_stack()
    assert stack is not None
    caches = [runner.kv_cache.layer(i) for i in range(stack.count)]
    hidden, cos, sin, slots, meta = _decode_inputs(runner, 2)
    assert decode_layers(stack, hidden, None, cos, sin, slots, caches, meta) is not None
    many = _decode_inputs(runner, stack.max_rows + 1)  # more rows than its kernels take
    assert decode_layers(stack, many[0], None, many[1], many[2], many[3], caches, many[4]) is None
    prefill = AttentionMetadata.build([0], [2], [[0]], runner.block_size, runner.device)  # two new tokens
    assert decode_layers(stack, hidden, None, cos, sin, slots, caches, prefill) is None
    assert decode_layers(stack, hidden.float(), None, cos, sin, slots, caches, meta) is None
    assert decode_layers(stack, hidden, None, cos, sin, slots, [*caches, caches[0]], meta) is None  # past its layers
    with pytest.raises(Exception, match="outside the cache"):
        outside = torch.tensor([runner.kv_cache.num_blocks * runner.block_size, 0], dtype=torch.int64)
        decode_layers(stack, hidden, None, cos, sin, outside, caches, meta)


@pytest.mark.parametrize("rows", [1, 3, 9])
def test_a_sliding_window_on_every_layer_runs_in_the_loop(
    rows: int, make_tiny_model: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mistral's window (6 positions; the prompts reach 19 + 12 + 8 positions) is the loop's too: it reads
    the windowed decode plan, and gives the Python layers' results bit for bit."""
    model_dir = make_tiny_model("mistral", num_layers=4, hidden_size=256, num_heads=4, num_kv_heads=1,
                                intermediate_size=512, dtype="bfloat16", sliding_window=6)
    compiled = make_runner(model_dir, dtype=torch.bfloat16)
    stack = compiled.model.plain_layer_stack()
    assert stack is not None and stack.shape.window == 6
    _compare(compiled, make_runner(model_dir, dtype=torch.bfloat16), rows, monkeypatch)


@pytest.mark.parametrize("rows", [1, 3, 9])
def test_qwen2_s_qkv_bias_runs_in_the_loop_as_the_python_layers_add_it(
    rows: int, make_tiny_model: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwen2's q|k|v bias, the one family field the loop computes off Llama's default: the projection's kernel
    adds the same float32 bias the Python layer's call hands it, so the same bits (head size 64: 256 / 4)."""
    model_dir = make_tiny_model("qwen2", num_layers=3, hidden_size=256, num_heads=4, num_kv_heads=2,
                                intermediate_size=512, dtype="bfloat16")
    compiled = make_runner(model_dir, dtype=torch.bfloat16)
    stack = compiled.model.plain_layer_stack()
    assert stack is not None and stack.qkv_bias_pointers is not None
    assert compiled.model.layers[0].attention.qkv.bias.abs().sum() > 0  # a bias that changes the result
    _compare(compiled, make_runner(model_dir, dtype=torch.bfloat16), rows, monkeypatch)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q8_0"])
def test_a_qwen2_gguf_s_biased_layers_equal_the_python_layers(
    type_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwen2.5's GGUF as llama.cpp quantizes it: Q4_0 projections (int4 tiles here) with float q|k|v biases; and
    Q8_0, whose blocks no loop kernel reads: the Python layers keep it."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf", "qwen2", types=every_projection(type_name))
    directory = gguf_model_dir(path, tmp_path / "cache")
    compiled = make_runner(directory, dtype=torch.bfloat16)
    if type_name == "Q8_0":
        assert compiled.model.plain_layer_stack() is None
        return
    assert isinstance(compiled.model.layers[0].attention.qkv.weight, Int4Weight)
    assert compiled.model.layers[0].attention.qkv.bias is not None
    _native_kernels_only(monkeypatch)
    for rows in (1, 6):
        _compare(compiled, make_runner(directory, dtype=torch.bfloat16), rows, monkeypatch)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_q4_0_s_scales_alone_in_the_loop_equal_the_python_layers_on_the_zeros_layout(
    family: str, rows: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Q4_0 tiles without zeros (2 bytes per 32 weights fewer) in the C loop against the layout they replace, a
    zero of 0 beside each scale, on the Python layers: the same tokens, logprobs and KV bit for bit, Llama- and
    Qwen2-shaped (its q|k|v bias), on the matrix-vector kernels (1-4 rows) and the bf16-tile one (5, 9)."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf", family, types=every_projection("Q4_0"))
    directory = gguf_model_dir(path, tmp_path / "cache")
    compiled = make_runner(directory, dtype=torch.bfloat16)
    monkeypatch.setattr(gguf_repack, "as_int4_tiles", functools.partial(gguf_repack.as_int4_tiles,
                                                                         zero_for_q4_0=True))
    reference = make_runner(directory, dtype=torch.bfloat16)
    monkeypatch.undo()
    for runner, zeros in ((compiled, False), (reference, True)):
        weights = [runner.model.layers[0].attention.qkv.weight, runner.model.layers[0].mlp.down.weight]
        assert all(isinstance(w, Int4Weight) and w.has_zeros == zeros for w in weights)
    _native_kernels_only(monkeypatch)
    _compare(compiled, reference, rows, monkeypatch)


@pytest.mark.parametrize("family", ["qwen3", "gemma2", "gemma3_text", "phi3", "smollm3", "olmo2", "granite"])
def test_other_families_keep_the_python_layers(family: str, make_tiny_model: Callable[..., Path]) -> None:
    """Biases, q/k norms, other norms, layouts, activations, scales, rotaries: every field off Llama's default."""
    runner = make_runner(make_tiny_model(family, num_layers=3, dtype="bfloat16"), dtype=torch.bfloat16)
    assert not runner.model.config.family.runs_llama_loop()
    assert runner.model.plain_layer_stack() is None


def test_float32_keeps_the_python_layers(model_dir: Path) -> None:
    assert make_runner(model_dir, dtype=torch.float32).model.plain_layer_stack() is None


def test_the_loop_takes_many_rows_where_its_many_row_kernels_run(model_dir: Path) -> None:
    from tgictl.kernels.linear import (
        AMX_FIRST_MAX_ROWS,
        amx_available,
        dpbf16_linear_available,
        fma_linear_available,
    )

    stack = make_runner(model_dir, dtype=torch.bfloat16).model.plain_layer_stack()
    many_rows = amx_available() or dpbf16_linear_available() or fma_linear_available()
    assert stack is not None and stack.max_rows == (AMX_FIRST_MAX_ROWS if many_rows else 4)
    flags = set(cpu_flags().split())
    # AMX CPUs, AVX512-BF16 CPUs (csrc/dpbf16_linear.c), and AVX2 CPUs without AVX512-BW (csrc/fma_linear.c): the
    # 5-32 row comparisons above ran the loop
    if {"amx_bf16", "avx512_bf16"} & flags or ("avx2" in flags and not {"avx512bw", "avx_ne_convert"} & flags):
        assert stack.max_rows == AMX_FIRST_MAX_ROWS


def test_the_first_layers_of_the_stack_then_the_python_layers_equal_the_whole_stack(model_dir: Path) -> None:
    """A prefix of the stack (the model's last layer stays in Python where it picks logit rows) hands the
    Python layers the residual stream they would have computed themselves."""
    runner = make_runner(model_dir, dtype=torch.bfloat16)
    model = runner.model
    stack = model.plain_layer_stack()
    assert stack is not None and stack.count == len(model.layers)
    caches = [runner.kv_cache.layer(i) for i in range(stack.count)]
    hidden, cos, sin, slots, meta = _decode_inputs(runner, 3)
    whole = decode_layers(stack, hidden, None, cos, sin, slots, caches, meta)
    prefix = decode_layers(stack, hidden, None, cos, sin, slots, caches[:2], meta)
    assert whole is not None and prefix is not None and whole[2] is None and prefix[2] is None
    out, delta, _ = prefix
    for i in range(2, stack.count):
        out, delta = model.layers[i](out, delta, cos, sin, slots, *caches[i], meta)
    assert torch.equal(out, whole[0]) and torch.equal(delta, whole[1])


def test_the_final_norm_in_the_same_call_equals_the_models(model_dir: Path) -> None:
    runner = make_runner(model_dir, dtype=torch.bfloat16)
    model = runner.model
    stack = model.plain_layer_stack()
    assert stack is not None
    caches = [runner.kv_cache.layer(i) for i in range(stack.count)]
    hidden, cos, sin, slots, meta = _decode_inputs(runner, 3)
    plain = decode_layers(stack, hidden, None, cos, sin, slots, caches, meta)
    normed = decode_layers(stack, hidden, None, cos, sin, slots, caches, meta, (model.norm.weight, model.norm.eps))
    assert plain is not None and normed is not None and normed[2] is not None
    total, expected = model.norm.add_forward(plain[0], plain[1])
    assert torch.equal(normed[2], expected) and torch.equal(normed[0], total) and torch.equal(normed[1], plain[1])
    # a weight the kernel does not take (float32) leaves the norm to the caller
    other = decode_layers(stack, hidden, None, cos, sin, slots, caches, meta, (model.norm.weight.float(), 1e-5))
    assert other is not None and other[2] is None and torch.equal(other[0], plain[0])
