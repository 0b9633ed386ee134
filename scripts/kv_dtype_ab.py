"""The served step with two KV cache formats side by side, in one process (docs/kv-cache.md's speed figures).

    python scripts/kv_dtype_ab.py --model-dir DIR [--rows 1,16] [--context 8192] [--steps 10]
        [--prefill 8192] [--reps 2] [--formats int8,auto]

Decode: for each --rows, one runner per format over the same model, every row with --context cached tokens, the
steps of the formats alternated (A, B, A, B, ...; medians), so a shared machine's load moves both alike. The caches
are filled with random K/V and each prompt enters as a prefix-cache hit of context - 1 tokens, so the setup
prefills one token per row instead of rows x context (16 x 8k prefills take minutes on two cores): the step reads
the same bytes and does the same arithmetic as after real prefills (attention's cost does not depend on the values).
Prefill (--prefill N > 0): one prompt of N tokens, whole, through each format's runner, alternated --reps times.
Not a test: figures depend on the machine and its load (printed with them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not installed

from tgictl.env import apply_shard_library_defaults  # noqa: E402
from tgictl.kernels.kv_pages import Int8Pages, quantize_int8  # noqa: E402
from tgictl.proto.messages import Batch, Request, SamplingParams, StoppingParams  # noqa: E402
from tgictl.runtime.shard.batch import ShardBatch  # noqa: E402
from tgictl.runtime.shard.dist import DistContext  # noqa: E402
from tgictl.runtime.shard.models.base import CausalLM  # noqa: E402
from tgictl.runtime.shard.models.registry import load_model  # noqa: E402
from tgictl.runtime.shard.step import ModelRunner  # noqa: E402

BLOCK = 16
CPU = torch.device("cpu")


def _batch(model: CausalLM, request: Request, num_blocks: int) -> ShardBatch:
    return ShardBatch.from_batch(Batch(id=request.id, requests=(request,)), block_size=BLOCK, num_blocks=num_blocks,
                                 vocab_size=model.config.vocab_size, device=CPU)


def _random_cache(model: CausalLM, num_blocks: int, kv_cache_dtype: str, gen: torch.Generator) -> ModelRunner:
    """A runner whose cache holds random K/V (int8: quantized by the format's own rule)."""
    cache = model.allocate_kv_cache(num_blocks, BLOCK, kv_cache_dtype=kv_cache_dtype)
    for layer in range(cache.num_layers):
        for pages in cache.layer(layer):
            x = torch.randn(pages.shape, generator=gen).to(torch.bfloat16)
            if isinstance(pages, Int8Pages):
                values, scales = quantize_int8(x)
                pages.values.copy_(values)
                pages.scales.copy_(scales)
            else:
                pages.copy_(x)
    return ModelRunner(model, cache, block_size=BLOCK, dist=DistContext.single(), device=CPU)


def decode_steps(model: CausalLM, formats: list[str], rows: int, context: int, steps: int) -> dict[str, float]:
    """Median seconds of a decode step of `rows` rows with `context` cached tokens, per format."""
    per = -(-(context + steps + 8) // BLOCK)
    num_blocks = 1 + rows * per
    gen = torch.Generator().manual_seed(0)
    setups: dict[str, tuple[ModelRunner, ShardBatch]] = {}
    for kind in formats:
        runner = _random_cache(model, num_blocks, kind, gen)
        parts = []
        for r in range(rows):
            ids = tuple(torch.randint(0, model.config.vocab_size, (context,), generator=gen).tolist())
            request = Request(id=r, input_ids=ids, sampling=SamplingParams(),
                              stopping=StoppingParams(max_new_tokens=steps + 6, ignore_eos=True),
                              blocks=tuple(range(1 + r * per, 1 + (r + 1) * per)), cache_len=context - 1)
            _, kept, _ = runner.generate_token(_batch(model, request, num_blocks))
            if kept is None:
                raise SystemExit("a request finished at its first token")
            parts.append(kept)
        setups[kind] = (runner, ShardBatch.concatenate(parts))
    times: dict[str, list[float]] = {kind: [] for kind in formats}
    for step in range(steps + 2):  # the first two of each warm up
        for kind, (runner, batch) in setups.items():
            start = time.perf_counter()
            _, kept, _ = runner.generate_token(batch)
            if step >= 2:
                times[kind].append(time.perf_counter() - start)
            if kept is None:
                raise SystemExit("the batch finished early")
            setups[kind] = (runner, kept)
    return {kind: statistics.median(t) for kind, t in times.items()}


def prefill_seconds(model: CausalLM, formats: list[str], length: int, reps: int) -> dict[str, float]:
    """Median seconds of one whole prompt's prefill of `length` tokens, per format."""
    per = -(-(length + 4) // BLOCK)
    gen = torch.Generator().manual_seed(1)
    ids = tuple(torch.randint(0, model.config.vocab_size, (length,), generator=gen).tolist())
    runners = {kind: ModelRunner(model, model.allocate_kv_cache(1 + per, BLOCK, kv_cache_dtype=kind),
                                 block_size=BLOCK, dist=DistContext.single(), device=CPU) for kind in formats}
    times: dict[str, list[float]] = {kind: [] for kind in formats}
    for rep in range(reps):
        for kind, runner in runners.items():
            request = Request(id=rep, input_ids=ids, sampling=SamplingParams(),
                              stopping=StoppingParams(max_new_tokens=2, ignore_eos=True),
                              blocks=tuple(range(1, 1 + per)))
            start = time.perf_counter()
            runner.generate_token(_batch(model, request, 1 + per))
            times[kind].append(time.perf_counter() - start)
    return {kind: statistics.median(t) for kind, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--rows", default="1,16")
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--prefill", type=int, default=8192, help="prompt tokens; 0 skips the prefill comparison")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--formats", default="int8,auto",
                        help="two --kv-cache-dtype values, the first against the second")
    args = parser.parse_args()
    formats = args.formats.split(",")
    if len(formats) != 2:
        raise SystemExit(f"--formats takes two formats, got {args.formats!r}")
    apply_shard_library_defaults()
    model = load_model(args.model_dir, dtype=torch.bfloat16, device=CPU, dist=DistContext.single())
    a, b = formats
    print(f"{args.model_dir.name}, bf16 model, {torch.get_num_threads()} threads", flush=True)
    for rows in (int(r) for r in args.rows.split(",")):
        step = decode_steps(model, formats, rows, args.context, args.steps)
        print(f"decode, {rows} row(s) x {args.context} cached, {args.steps} steps each alternated, load "
              f"{os.getloadavg()[0]:.2f}: {a} {step[a] * 1e3:.1f} ms, {b} {step[b] * 1e3:.1f} ms: {a} "
              f"{step[b] / step[a]:.2f}x {b}'s speed", flush=True)
    if args.prefill > 0:
        took = prefill_seconds(model, formats, args.prefill, args.reps)
        print(f"prefill, one prompt of {args.prefill} tokens, {args.reps} each alternated, load "
              f"{os.getloadavg()[0]:.2f}: {a} {took[a]:.2f} s, {b} {took[b]:.2f} s: {a} takes "
              f"{took[a] / took[b]:.2f}x {b}'s time", flush=True)


if __name__ == "__main__":
    main()
