"""Where a shard decode step spends its time: the real ModelRunner path (step inputs, attention
metadata, forward, sampling, bookkeeping) at one batch size and context, plus a bare model-math step.

    python scripts/perf_decode.py --dtype bfloat16 --batch 32 --context 256 --threads 2
    python scripts/perf_decode.py --profile 5      # also print torch.profiler's top ops over 5 steps
    python scripts/perf_decode.py --model-dir DIR --batch 1 --context 128 --steps 200 --outside-kernels

"bare" is the paged forward alone (metadata built once outside the timing, no sampling, no batch
bookkeeping); "roofline" is the bare forward: the same weights and math with contiguous
per-sequence K/V (no paging at all). Prefill is done for real (one forward per request).
Not a test: numbers depend on the machine and its load (printed next to the figures).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not installed

from tgictl.env import apply_shard_library_defaults  # noqa: E402
from tgictl.kernels import build_attention_metadata  # noqa: E402
from tgictl.kernels.attention_fast import _decode_output, _decode_scores  # noqa: E402
from tgictl.kernels.batch_invariance import enable_batch_invariance  # noqa: E402
from tgictl.kernels.native import load_native_kernels  # noqa: E402
from tgictl.quantization import QUANTIZE_METHODS, QuantizeSpec, quantize_spec  # noqa: E402
from tgictl.proto.messages import Batch, Request, SamplingParams, StoppingParams  # noqa: E402
from tgictl.runtime.shard.batch import ShardBatch  # noqa: E402
from tgictl.runtime.shard.dist import DistContext  # noqa: E402
from tgictl.runtime.shard.layers.rotary import apply_rotary  # noqa: E402
from tgictl.runtime.shard.models.base import CausalLM  # noqa: E402
from tgictl.runtime.shard.models.registry import load_model  # noqa: E402
from tgictl.runtime.shard.step import ModelRunner  # noqa: E402

DEFAULT_MODEL = Path.home() / ".cache/tgictl/models/HuggingFaceTB--SmolLM2-135M-Instruct"
BLOCK = 16


def _requests(batch: int, context: int, new_tokens: int, vocab: int) -> tuple[Request, ...]:
    """`batch` requests whose prompts are `context` tokens long, each with its own blocks (1 + ...)."""
    per = -(-(context + new_tokens) // BLOCK)
    gen = torch.Generator().manual_seed(0)
    out = []
    for r in range(batch):
        blocks = tuple(range(1 + r * per, 1 + (r + 1) * per))
        ids = tuple(torch.randint(0, vocab, (context,), generator=gen).tolist())
        out.append(
            Request(
                id=r,
                input_ids=ids,
                sampling=SamplingParams(),
                stopping=StoppingParams(max_new_tokens=new_tokens, ignore_eos=True),
                blocks=blocks,
            )
        )
    return tuple(out)


def decode_batch(model_dir: Path, dtype: torch.dtype, batch: int, context: int, new_tokens: int,
                 quantize: QuantizeSpec | None = None, kv_cache_dtype: str = "auto",
                 ) -> tuple[CausalLM, ModelRunner, ShardBatch, float]:
    """The model, its runner, a decode batch of `batch` random prompts of `context` tokens, each
    prefilled alone (whole prompt) and then concatenated: the decode batch of a server, with room
    for `new_tokens` more tokens per row; and the seconds those prefills took."""
    model = load_model(model_dir, dtype=dtype, device=torch.device("cpu"), dist=DistContext.single(),
                       quantize=quantize)
    requests = _requests(batch, context, new_tokens, model.config.vocab_size)
    # room for every row, then for one more prompt of `context` tokens (--compare-batch-invariant)
    blocks = 1 + (batch + 1) * -(-(context + new_tokens) // BLOCK)
    runner = ModelRunner(
        model, model.allocate_kv_cache(blocks, BLOCK, kv_cache_dtype=kv_cache_dtype), block_size=BLOCK, dist=DistContext.single(),
        device=torch.device("cpu"),
    )
    parts = []
    prefill_start = time.perf_counter()  # not the load: --quantize int4 alone takes seconds there
    for request in requests:
        part = ShardBatch.from_batch(
            Batch(id=request.id, requests=(request,)), block_size=BLOCK, num_blocks=blocks,
            vocab_size=model.config.vocab_size, device=torch.device("cpu"),
        )
        _, kept, _ = runner.generate_token(part)
        if kept is None:
            raise SystemExit("a prefill finished its request: new_tokens must be > 1")
        parts.append(kept)
    return model, runner, ShardBatch.concatenate(parts), time.perf_counter() - prefill_start


def _prefill_seconds(runner: ModelRunner, prompt: list[int], vocab: int) -> float:
    """One prompt's whole prefill through the runner, in blocks after every decode batch's."""
    first = runner.kv_cache.num_blocks - -(-(len(prompt) + 1) // BLOCK)
    blocks = tuple(range(first, runner.kv_cache.num_blocks))
    request = Request(id=10**6, input_ids=tuple(prompt), sampling=SamplingParams(),
                      stopping=StoppingParams(max_new_tokens=2, ignore_eos=True), blocks=blocks)
    part = ShardBatch.from_batch(Batch(id=10**6, requests=(request,)), block_size=BLOCK,
                                 num_blocks=runner.kv_cache.num_blocks, vocab_size=vocab, device=torch.device("cpu"))
    start = time.perf_counter()
    runner.generate_token(part)
    return time.perf_counter() - start


def contiguous_step(model: CausalLM, ids: Tensor, position: int, keys: list[Tensor], values: list[Tensor]) -> Tensor:
    """The roofline: the same weights and math with each sequence's K/V contiguous in
    [batch, T, kv_heads, head_dim] per layer (no paging, no gather, no metadata, no sampling).

    ids: [batch] int64; keys, values: per layer [batch, position + 1, kv_heads, head_dim], contiguous.
    The new token's K/V overwrite the last position in place. Returns logits [batch, vocab].
    """
    batch = ids.shape[0]
    with torch.inference_mode():
        hidden = model.embed(ids)  # [batch, hidden]
        cos, sin = model.rotary(torch.full((batch,), position), None, hidden.dtype)
        for layer, k_ctx, v_ctx in zip(model.layers, keys, values):
            attn = layer.attention
            h, kvh, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
            qkv = attn.qkv(layer.input_norm(hidden))
            qk = apply_rotary(qkv[:, : (h + kvh) * d].view(batch, h + kvh, d), cos, sin)
            k_ctx[:, position] = qk[:, h:]
            v_ctx[:, position] = qkv[:, (h + kvh) * d :].view(batch, kvh, d)
            # the decode kernel's own matmuls, minus its gather from the paged cache
            scores = _decode_scores(qk[:, :h].reshape(batch, kvh, h // kvh, d), k_ctx)  # [batch, h, T]
            probs = torch.softmax(scores.float() * attn.scale, dim=-1).to(hidden.dtype)
            out = _decode_output(probs, v_ctx, h // kvh).reshape(batch, h * d)
            hidden = hidden + attn.o_proj(out)
            hidden = hidden + layer.mlp(layer.post_attention_norm(hidden))
        return model.lm_head(model.norm(hidden))


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def alternating(steps: int, run: Callable[[], object], switch_off: Callable[[], object],
                switch_on: Callable[[], object]) -> tuple[float, float]:
    """Median seconds of `run` with a feature on and with it off, alternating step by step (on first;
    the feature is on again at the end)."""
    on: list[float] = []
    off: list[float] = []
    switch_on()
    for _ in range(steps):
        on.append(timed(run))
        switch_off()
        off.append(timed(run))
        switch_on()
    return statistics.median(on), statistics.median(off)


def print_pair(on_label: str, on_s: float, off_label: str, off_s: float, batch: int) -> None:
    """One line for an on/off comparison of the served step: both times, tok/s, off / on."""
    print(f"served step, {on_label}: {on_s * 1e3:.1f} ms ({batch / on_s:.0f} tok/s); {off_label}: "
          f"{off_s * 1e3:.1f} ms ({batch / off_s:.0f} tok/s): off / on {off_s / on_s:.2f}x; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)


def print_outside_kernels(runner: ModelRunner, batch: ShardBatch, steps: int) -> None:
    """Medians over `steps` served steps of: the decode layers' one C call, model.logits (the LM head with its
    Python), and the rest of the step. With one row the rest is mostly Python and small torch calls that run
    with the caches cold after the step's weight stream (docs/architecture.md)."""
    native = load_native_kernels()
    model = runner.model
    spent = {"layers": 0, "head": 0}

    def timing(fn: Callable[..., object], key: str) -> Callable[..., object]:
        def timed(*args: object) -> object:
            start = time.perf_counter_ns()
            try:
                return fn(*args)
            finally:
                spent[key] += time.perf_counter_ns() - start
        return timed

    layers_fn, logits_fn = (native.decode_layers_bf16 if native is not None else None), model.logits
    if native is not None:
        object.__setattr__(native, "decode_layers_bf16", timing(layers_fn, "layers"))
    model.logits = timing(logits_fn, "head")  # type: ignore[method-assign]
    rows: list[tuple[int, int, int]] = []
    try:
        for i in range(steps + 2):
            spent.update(layers=0, head=0)
            start = time.perf_counter_ns()
            _, kept, _ = runner.generate_token(batch)
            if kept is None:
                break
            batch = kept
            if i >= 2:
                rows.append((time.perf_counter_ns() - start, spent["layers"], spent["head"]))
    finally:
        if native is not None:
            object.__setattr__(native, "decode_layers_bf16", layers_fn)
        del model.logits
    step, layers, head = (statistics.median(r[j] for r in rows) / 1e3 for j in range(3))
    rest = statistics.median((r[0] - r[1] - r[2]) / 1e3 for r in rows)
    print(f"served step {step:.0f} us: decode layers' C call {layers:.0f} us, LM head (model.logits) {head:.0f} us, "
          f"everything else {rest:.0f} us ({rest / step:.0%})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--quantize", choices=QUANTIZE_METHODS, default=None,
                        help="quantize a safetensors model's weights at load, as `tgictl shard --quantize`")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--steps", type=int, default=12, help="timed decode steps")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--profile", type=int, default=0, help="also profile this many steps (torch.profiler)")
    parser.add_argument("--compare-native", action="store_true",
                        help="also time the bare forward with the compiled decode kernel off, alternating")
    parser.add_argument("--compare-batch-invariant", action="store_true",
                        help="also time the served step (and one prompt's prefill) with --batch-invariant "
                        "on and off, alternating")
    parser.add_argument("--compare-fused", action="store_true",
                        help="also time the served step with the fused elementwise kernels and the greedy "
                        "kernel (kernels/fused.py) off, alternating step by step")
    parser.add_argument("--compare-layer-loop", action="store_true",
                        help="also time the served step with the decode layers' compiled loop "
                        "(kernels/decode_layers.py) off, alternating step by step")
    parser.add_argument("--outside-kernels", action="store_true",
                        help="also split the served step into the decode layers' C call, the LM head "
                        "(model.logits) and everything else (Python, small torch calls)")
    args = parser.parse_args()
    apply_shard_library_defaults()  # the shard's huge pages and oneDNN cache, before the first big allocation
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    compares = args.compare_fused + args.compare_batch_invariant + args.compare_layer_loop + args.outside_kernels
    new_tokens = args.steps * (2 + 2 * compares) + args.profile + 8
    model, runner, batch, prefill_seconds = decode_batch(args.model_dir, dtype, args.batch, args.context,
                                                         new_tokens, quantize_spec(args.quantize, None))
    prefill_tps = args.batch * args.context / prefill_seconds
    vocab = model.config.vocab_size

    # bare forward: metadata built once, outside the timing; same cache and context length
    ctx = batch.rows[0].cache_len
    tables = [row.request.blocks for row in batch.rows]
    slots = torch.tensor([row.request.blocks[ctx // BLOCK] * BLOCK + ctx % BLOCK for row in batch.rows])
    ids = torch.randint(0, vocab, (args.batch,))
    meta = build_attention_metadata([ctx] * args.batch, [1] * args.batch, [list(t) for t in tables], BLOCK, "cpu")
    positions = torch.full((args.batch,), ctx, dtype=torch.int64)
    rows = torch.arange(args.batch)
    # contiguous K/V copies of the same context (the values do not change the cost)
    shape = (args.batch, ctx + 1, model.config.num_kv_heads, model.config.head_dim)
    keys = [torch.randn(shape).to(dtype) for _ in range(model.config.num_layers)]
    values = [torch.randn(shape).to(dtype) for _ in range(model.config.num_layers)]

    # The three alternate step by step, so load from other processes falls on all of them alike.
    full: list[tuple[float, float]] = []
    bare: list[float] = []
    roofline: list[float] = []
    for i in range(args.steps + 2):
        start = time.perf_counter()
        _, _, timings = runner.generate_token(batch)
        step = (time.perf_counter() - start, timings.forward_ns / 1e9)
        bare_s = timed(lambda: model(ids, positions, slots, runner.kv_cache, meta, rows))
        roof_s = timed(lambda: contiguous_step(model, ids, ctx, keys, values))
        if i >= 2:  # the first two warm up
            full.append(step)
            bare.append(bare_s)
            roofline.append(roof_s)
    meta_times = []
    for _ in range(20):
        t0 = time.perf_counter()
        build_attention_metadata([ctx] * args.batch, [1] * args.batch, [list(t) for t in tables], BLOCK, "cpu")
        meta_times.append(time.perf_counter() - t0)

    step_s = statistics.median(s for s, _ in full)
    fwd_s = statistics.median(f for _, f in full)
    bare_s = statistics.median(bare)
    roof_s = statistics.median(roofline)
    load = os.getloadavg()[0]
    print(
        f"{args.dtype} batch {args.batch} ctx {args.context} threads {torch.get_num_threads()} load {load:.2f}: "
        f"step {step_s * 1e3:.1f} ms ({args.batch / step_s:.0f} tok/s), runner forward+sample "
        f"{fwd_s * 1e3:.1f} ms, bare forward {bare_s * 1e3:.1f} ms ({args.batch / bare_s:.0f} tok/s), "
        f"metadata build {statistics.median(meta_times) * 1e3:.2f} ms, step/bare {step_s / bare_s:.2f}; "
        f"prefill {prefill_tps:.0f} tok/s ({args.context}-token prompts, one per forward); contiguous-KV "
        f"roofline {roof_s * 1e3:.1f} ms ({args.batch / roof_s:.0f} tok/s): step reaches {roof_s / step_s:.0%}",
        flush=True,
    )
    if args.compare_native:
        import tgictl.kernels.attention_fast as attention_fast

        loader = attention_fast.load_native_kernels
        with_native: list[float] = []
        torch_only: list[float] = []
        for _ in range(args.steps):
            with_native.append(timed(lambda: model(ids, positions, slots, runner.kv_cache, meta, rows)))
            attention_fast.load_native_kernels = lambda: None  # type: ignore[assignment]
            torch_only.append(timed(lambda: model(ids, positions, slots, runner.kv_cache, meta, rows)))
            attention_fast.load_native_kernels = loader
        native_s, torch_s = statistics.median(with_native), statistics.median(torch_only)
        print(f"bare forward, decode attention compiled ({'on' if loader() else 'unavailable'}): "
              f"{native_s * 1e3:.1f} ms; torch ops: {torch_s * 1e3:.1f} ms ({torch_s / native_s:.2f}x)", flush=True)

    def step() -> object:
        return runner.generate_token(batch)

    if args.outside_kernels:
        print_outside_kernels(runner, batch, args.steps)
    if args.compare_fused:
        import tgictl.kernels.fused as fused

        loader = fused.load_native_kernels
        fused_s, torch_s = alternating(args.steps, step, lambda: setattr(fused, "load_native_kernels", lambda: None),
                                       lambda: setattr(fused, "load_native_kernels", loader))
        print_pair("fused kernels on", fused_s, "off (torch ops)", torch_s, args.batch)
    if args.compare_layer_loop:
        stack = model.plain_layer_stack
        loop_s, python_s = alternating(args.steps, step, lambda: setattr(model, "plain_layer_stack", lambda: None),
                                       lambda: setattr(model, "plain_layer_stack", stack))
        print_pair("layer loop on", loop_s, "off (Python layers)", python_s, args.batch)
    if args.compare_batch_invariant:
        on_s, off_s = alternating(args.steps, step, lambda: enable_batch_invariance(False),
                                  lambda: enable_batch_invariance(True))
        print_pair("--batch-invariant", on_s, "default", off_s, args.batch)
        prompt = torch.randint(0, vocab, (args.context,)).tolist()
        for label, enabled in (("--batch-invariant", True), ("default", False), ("--batch-invariant", True),
                               ("default", False)):
            enable_batch_invariance(enabled)
            print(f"  prefill of one {args.context}-token prompt, {label}: "
                  f"{_prefill_seconds(runner, prompt, vocab) * 1e3:.0f} ms", flush=True)
        enable_batch_invariance(False)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.profile):
                runner.generate_token(batch)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
