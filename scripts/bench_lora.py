"""Multi-LoRA overhead on the shard's real step path (ModelRunner.generate_token), against the base
model on the same weights in the same run (docs/architecture.md, "Multi-LoRA").

    python scripts/bench_lora.py decode --batch 32 --ranks 8,16,64 --adapters 8
    python scripts/bench_lora.py startup --adapters 8 --rank 16

decode: a batch of `--batch` rows whose every row is on one of `--adapters` random adapters (row i on
adapter i % N), against the same batch on the base model (adapter_index 0: the LoRA code does not
run); both batches live at once and their decode steps alternate, each timed alone; tokens/s from
the median step time of each of `--repeats` runs of `--steps` steps (median over runs), for each
rank and projection set. startup: ShardRuntime.load with and without the adapters, each in a
fresh process: seconds and RSS (VmHWM), against the adapters' bytes on disk.
Not a test: numbers depend on the machine and its load (printed with them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not installed

from tgictl.proto.messages import Batch, Request, SamplingParams, StoppingParams  # noqa: E402
from tgictl.runtime.shard.batch import ShardBatch  # noqa: E402
from tgictl.runtime.shard.dist import DistContext  # noqa: E402
from tgictl.runtime.shard.layers.linear import ColumnParallelLinear, RowParallelLinear  # noqa: E402
from tgictl.runtime.shard.lora.adapter_files import projection_shape  # noqa: E402
from tgictl.runtime.shard.lora.attach import attach_adapters, read_adapters  # noqa: E402
from tgictl.runtime.shard.model_config import ModelConfig  # noqa: E402
from tgictl.runtime.shard.models.registry import load_model  # noqa: E402
from tgictl.runtime.shard.step import ModelRunner  # noqa: E402

DEFAULT_MODEL = Path.home() / ".cache/tgictl/models/HuggingFaceTB--SmolLM2-135M-Instruct"
BLOCK = 16
PROJECTION_SETS = {
    "q,v": ("q_proj", "v_proj"),
    "all 7": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
}
CPU = torch.device("cpu")


def write_adapter(path: Path, config: ModelConfig, rank: int, targets: tuple[str, ...], seed: int) -> int:
    """A random PEFT LoRA directory (float32 factors, as PEFT saves them); returns its weight bytes."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config.num_layers):
        for projection in targets:
            out, inp = projection_shape(config, projection)
            block = "self_attn" if projection in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{block}.{projection}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, inp, generator=gen) * 0.02
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out, rank, generator=gen) * 0.02
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(targets)}
    ))
    return (path / "adapter_model.safetensors").stat().st_size


def _batch(config: ModelConfig, size: int, context: int, new_tokens: int, adapters: int, first_block: int) -> Batch:
    per = -(-(context + new_tokens) // BLOCK)
    gen = torch.Generator().manual_seed(0)
    requests = []
    for r in range(size):
        blocks = tuple(range(first_block + r * per, first_block + (r + 1) * per))
        requests.append(Request(
            id=r, input_ids=tuple(torch.randint(0, config.vocab_size, (context,), generator=gen).tolist()),
            sampling=SamplingParams(), stopping=StoppingParams(max_new_tokens=new_tokens, ignore_eos=True),
            blocks=blocks,
            adapter_index=1 + r % adapters if adapters else 0,
        ))  # fmt: skip
    return Batch(id=1, requests=tuple(requests))


def _paired_step_seconds(runner: ModelRunner, batches: list[Batch], steps: int) -> list[list[float]]:
    """Each batch prefilled, then their decode steps interleaved (which goes first alternates), each
    step timed alone: slow drifts of a shared machine hit both alike. Per batch, its step times."""
    current = []
    for batch in batches:
        shard = ShardBatch.from_batch(
            batch, block_size=BLOCK, num_blocks=runner.kv_cache.num_blocks, vocab_size=runner.vocab_size,
            device=CPU, num_adapters=runner.num_adapters,
        )
        _, state, _ = runner.generate_token(shard)  # the prefill
        _, state, _ = runner.generate_token(state)  # one untimed decode step
        current.append(state)
    times: list[list[float]] = [[] for _ in batches]
    for step in range(steps):
        order = range(len(batches)) if step % 2 == 0 else reversed(range(len(batches)))
        for k in order:
            start = time.perf_counter()
            _, current[k], _ = runner.generate_token(current[k])
            times[k].append(time.perf_counter() - start)
    return times


def decode(args: argparse.Namespace) -> None:
    model = load_model(args.model_dir, dtype=getattr(torch, args.dtype), device=CPU, dist=DistContext.single())
    config = model.config
    new_tokens = args.steps + 4
    per_batch = args.batch * -(-(args.context + new_tokens) // BLOCK)
    runner = ModelRunner(model, model.allocate_kv_cache(1 + 2 * per_batch, BLOCK), block_size=BLOCK,
                         dist=DistContext.single(), device=CPU, num_adapters=args.adapters)
    base_batch = _batch(config, args.batch, args.context, new_tokens, 0, first_block=1)
    lora_batch = _batch(config, args.batch, args.context, new_tokens, args.adapters, first_block=1 + per_batch)
    print(f"{args.model_dir.name} {args.dtype} batch {args.batch} context {args.context} threads "
          f"{torch.get_num_threads()} adapters {args.adapters}, load {os.getloadavg()[0]:.2f}")
    for set_name, targets in PROJECTION_SETS.items():
        for rank in args.ranks:
            with tempfile.TemporaryDirectory() as tmp:
                dirs = [(f"a{k}", Path(tmp) / f"a{k}") for k in range(args.adapters)]
                for k, (_, path) in enumerate(dirs):
                    write_adapter(path, config, rank, targets, seed=k)
                for module in model.modules():  # the previous configuration's deltas off
                    if isinstance(module, (ColumnParallelLinear, RowParallelLinear)):
                        module.lora = None
                attach_adapters(model, read_adapters(dirs, config, model.dtype), CPU)
            _paired_step_seconds(runner, [base_batch, lora_batch], 2)  # warm-up: both paths' shapes once
            base, lora = [], []
            for _ in range(args.repeats):
                base_times, lora_times = _paired_step_seconds(runner, [base_batch, lora_batch], args.steps)
                base.append(args.batch / statistics.median(base_times))
                lora.append(args.batch / statistics.median(lora_times))
            b, lo = statistics.median(base), statistics.median(lora)
            print(f"  rank {rank:3d} {set_name:6s}: base {b:7.1f} tok/s, LoRA {lo:7.1f} tok/s, "
                  f"ratio {lo / b:.3f} (load {os.getloadavg()[0]:.2f})", flush=True)


def _vm_hwm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def load_once(args: argparse.Namespace) -> None:
    """Child mode: one ShardRuntime.load; prints {"seconds", "hwm"} as JSON."""
    from tgictl.runtime.shard.runtime import ShardRuntime

    pairs = [(p.name, p) for p in sorted(Path(args.adapter_root).iterdir())] if args.adapter_root else []
    start = time.perf_counter()
    ShardRuntime.load(args.model_dir, args.dtype, "cpu", DistContext.single(), lora_adapters=pairs)
    print(json.dumps({"seconds": time.perf_counter() - start, "hwm": _vm_hwm_bytes()}))


def startup(args: argparse.Namespace) -> None:
    config = ModelConfig.from_dir(args.model_dir)
    with tempfile.TemporaryDirectory() as tmp:
        on_disk = sum(
            write_adapter(Path(tmp) / f"a{k}", config, args.rank, PROJECTION_SETS["all 7"], seed=k)
            for k in range(args.adapters)
        )
        # The shard holds the factors in its dtype: float32 on disk, half of it in bfloat16.
        served_bytes = on_disk * torch.empty((), dtype=getattr(torch, args.dtype)).element_size() // 4
        runs: dict[str, list[dict[str, float]]] = {"base": [], "lora": []}
        for _ in range(args.repeats):
            for kind, root in (("base", None), ("lora", tmp)):
                command = [sys.executable, __file__, "load-once", "--model-dir", str(args.model_dir), "--dtype", args.dtype]
                out = subprocess.run([*command, *(["--adapter-root", root] if root else [])], check=True,
                                     capture_output=True, text=True).stdout
                runs[kind].append(json.loads(out.strip().splitlines()[-1]))
    med = {k: {f: statistics.median(r[f] for r in v) for f in ("seconds", "hwm")} for k, v in runs.items()}
    extra_s = med["lora"]["seconds"] - med["base"]["seconds"]
    extra_mib = (med["lora"]["hwm"] - med["base"]["hwm"]) / 2**20
    print(f"{args.model_dir.name} {args.dtype}, {args.adapters} adapters rank {args.rank} all 7 projections, "
          f"load {os.getloadavg()[0]:.2f}: load {med['base']['seconds']:.2f} s -> {med['lora']['seconds']:.2f} s "
          f"(+{extra_s:.2f} s); peak RSS +{extra_mib:.1f} MiB for {served_bytes / 2**20:.1f} MiB of factors "
          f"in {args.dtype} ({on_disk / 2**20:.1f} MiB float32 on disk)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["decode", "startup", "load-once"])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--ranks", type=lambda s: [int(r) for r in s.split(",")], default=[16])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--adapter-root", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    {"decode": decode, "startup": startup, "load-once": load_once}[args.mode](args)


if __name__ == "__main__":
    main()
