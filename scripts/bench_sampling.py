"""Time NextTokenChooser per step, and the random-number designs it was chosen from.

    python scripts/bench_sampling.py [--device cpu|cuda] [--vocab 49152] [--repeats 20] [--threads N]

Scenarios, each at batch 1, 32 and 64, as a request without top_n_tokens takes them, then with top-n:
  greedy        no sampling, no penalties: the fast path (argmax + log_softmax)
  top_p peaked  do_sample, temperature 0.8, top_p 0.95 on model-like peaked logits (small nucleus)
  top_p flat    the same on nearly flat logits: the nucleus is most of the vocabulary (worst case)
  penalties     greedy with repetition, frequency and presence penalties (512-token histories)
  everything    penalties + temperature + top_k 50 + top_p 0.9 + typical_p 0.95 + min_p 0.05
Then the RNG comparison at batch 32 (seeded_uniform's docstring quotes it).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch import Tensor

from tgictl.proto.messages import SamplingParams
from tgictl.runtime.shard.sampling.inverse_cdf import draw
from tgictl.runtime.shard.sampling.sampler import (
    NextTokenChooser,
    TokenHistory,
    needs_history,
)
from tgictl.runtime.shard.sampling.seeded_uniform import seed_key_table, seeded_uniform

BATCHES = (1, 32, 64)
HISTORY_LEN = 512


def timed(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Fastest of `repeats` calls in milliseconds, after two warm-up calls (the minimum is the
    figure least disturbed by other processes sharing the CPU)."""
    for _ in range(2):
        fn()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        samples.append((time.perf_counter() - start) * 1e3)
    return min(samples)


def scenario_params(name: str, batch: int) -> list[SamplingParams]:
    if name == "greedy":
        return [SamplingParams()] * batch
    if name.startswith("top_p"):
        return [SamplingParams(do_sample=True, temperature=0.8, top_p=0.95, seed=s) for s in range(batch)]
    if name == "penalties":
        return [SamplingParams(repetition_penalty=1.2, frequency_penalty=0.5, presence_penalty=0.5)] * batch
    return [
        SamplingParams(
            temperature=0.7, top_k=50, top_p=0.9, typical_p=0.95, min_p=0.05, repetition_penalty=1.1,
            frequency_penalty=0.2, presence_penalty=0.2, seed=s,
        )
        for s in range(batch)
    ]


def make_logits(name: str, batch: int, vocab: int, device: torch.device) -> Tensor:
    generator = torch.Generator().manual_seed(0)
    # Peaked: a heavy right tail like a trained LM head (a handful of tokens hold most mass).
    # With scale 4 and T=0.8 the 0.95-nucleus holds ~30-230 tokens.
    scale = 0.05 if name == "top_p flat" else 4.0
    return (torch.randn(batch, vocab, generator=generator) * scale).to(device)


def bench_chooser(device: torch.device, vocab: int, repeats: int, distribution: bool) -> None:
    asked = "with top-n (the [B, V] distribution kept)" if distribution else "without top-n (most requests)"
    print(f"NextTokenChooser per step, V={vocab}, device={device}, {asked} (best of N, ms)")
    names = ("greedy", "top_p peaked", "top_p flat", "penalties", "everything")
    print(f"{'scenario':<14}" + "".join(f"{'B=' + str(b):>10}" for b in BATCHES))
    for name in names:
        cells = []
        for batch in BATCHES:
            params = scenario_params(name, batch)
            logits = make_logits(name, batch, vocab, device)
            generator = torch.Generator().manual_seed(1)
            prompts = torch.randint(0, vocab, (batch, HISTORY_LEN), generator=generator).tolist()
            history = TokenHistory.from_sequences(prompts, vocab, device, needs_history(params))
            chooser = NextTokenChooser.from_params(params, vocab, device)
            steps = torch.full((batch,), 10, dtype=torch.int64, device=device)
            cells.append(timed(lambda: chooser(logits, history, steps, distribution=distribution), device, repeats))
        print(f"{name:<14}" + "".join(f"{ms:>10.2f}" for ms in cells))


def rng_counter_gumbel(scores: Tensor, keys: Tensor, steps: Tensor) -> Tensor:
    """Alternative 1: hash (seed, step, vocab index) for every entry, then a Gumbel-max race."""
    mask = 0xFFFFFFFF
    vocab_ids = torch.arange(scores.shape[1], device=scores.device)  # [V]
    row_key = seeded_uniform(keys, steps).mul(2**32).long().unsqueeze(1)  # [B, 1] u32 per (seed, step)
    x = ((vocab_ids.unsqueeze(0) * 0x9E3779B1) & mask) ^ row_key  # [B, V]
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & mask
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & mask
    x = x ^ (x >> 16)
    uniform = ((x >> 8).float() + 0.5) * (1.0 / 2**24)  # (0, 1)
    return (scores - (-uniform.log()).log()).argmax(dim=-1)


def rng_generator_per_row(scores: Tensor, seeds: list[int], steps: list[int]) -> Tensor:
    """Alternative 2: a torch.Generator per row seeded from (seed, step), exponential race."""
    chosen = []
    for row, (seed, step) in enumerate(zip(seeds, steps)):
        generator = torch.Generator(device=scores.device)
        generator.manual_seed((seed * 1_000_003 + step) % 2**63)
        noise = torch.empty(scores.shape[1], device=scores.device).exponential_(generator=generator)
        chosen.append((scores[row].softmax(-1) / noise).argmax())
    return torch.stack(chosen)


def rng_inverse_cdf_flat(scores: Tensor, keys: Tensor, steps: Tensor) -> Tensor:
    """Alternative 3: one hashed uniform per row, inverse CDF over a float64 cumsum of the vocabulary."""
    uniform = seeded_uniform(keys, steps)
    cumulative = scores.softmax(-1).cumsum(-1, dtype=torch.float64)
    target = (uniform * cumulative[:, -1]).unsqueeze(1)
    return torch.searchsorted(cumulative, target, right=True).squeeze(1)


def rng_inverse_cdf_blocks(scores: Tensor, keys: Tensor, steps: Tensor) -> Tensor:
    """Chosen: one hashed uniform per row, two-level inverse CDF (what NextTokenChooser does)."""
    return draw(scores.softmax(-1), seeded_uniform(keys, steps))


def bench_rng(device: torch.device, vocab: int, repeats: int) -> None:
    batch = 32
    scores = make_logits("top_p peaked", batch, vocab, device)
    seeds = list(range(batch))
    keys = seed_key_table(seeds, device)
    steps = torch.full((batch,), 10, dtype=torch.int64, device=device)
    designs: list[tuple[str, Callable[[], Tensor]]] = [
        ("counter hash per vocab entry + Gumbel-max", lambda: rng_counter_gumbel(scores, keys, steps)),
        ("torch.Generator per row + exponential race", lambda: rng_generator_per_row(scores, seeds, [10] * batch)),
        ("counter hash per row + flat inverse CDF", lambda: rng_inverse_cdf_flat(scores, keys, steps)),
        ("counter hash per row + 2-level inverse CDF (chosen)", lambda: rng_inverse_cdf_blocks(scores, keys, steps)),
    ]
    print(f"\nRNG designs, B={batch}, V={vocab} (best of N, ms to draw one token per row)")
    for name, fn in designs:
        print(f"  {name:<52}{timed(fn, device, repeats):8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    bench_chooser(device, args.vocab, args.repeats, distribution=False)
    print()
    bench_chooser(device, args.vocab, args.repeats, distribution=True)
    bench_rng(device, args.vocab, args.repeats)


if __name__ == "__main__":
    main()
