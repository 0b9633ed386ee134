"""The 1B-class comparison in one run, the same load for every server (docs/benchmarks.md regenerates from it).

    python scripts/bench_1b.py \\
        [--model ~/.cache/tgictl/bench-models/llama-3.2-1b] [--servers tgictl,tgictl-gguf,vllm,llama-server]
        [--clients 1,16] [--input-len 64] [--output-len 16] [--vllm-python PATH]
        [--llama-bin ~/.cache/llamacpp/bin] [--threads 2] [--tgictl-args ...] [--runs 3] [--busy N,...]
        [--markdown-out table.md]

`--model` is a directory written by scripts/make_bench_models.py: `hf/` (random weights of the real model's
shape, bf16) and one 4-bit GGUF made from it by llama.cpp's converter and quantizer. The servers, one at a time,
each given both cores:
- tgictl: `tgictl launch` on hf/ in bf16 (plus --tgictl-args, e.g. `--kv-cache-dtype int8`);
- tgictl-gguf: `tgictl launch --model-id FILE.gguf`, the 4-bit blocks served natively;
- tgictl-kv8: tgictl with `--kv-cache-dtype int8` (docs/kv-cache.md);
- tgictl-q8 / tgictl-q4: tgictl on hf/ with `--quantize int8` / `--quantize int4` (weights quantized at load);
- tgictl-before: tgictl with its OpenMP threads as before "Sharing the cores" (unbound, libgomp's default spin);
- vllm: vLLM CPU's OpenAI server on hf/ in bf16, VLLM_CPU_OMP_THREADS_BIND=0-(threads-1): both cores compute;
- llama-server: llama.cpp's server on the GGUF, one slot per client;
and llama-bench's own decode loop on the GGUF (no HTTP): `-p input-len -n output-len`, its tokens/s.

For each server and each client count N: N * requests-per-client random prompts of exactly --input-len tokens
(fresh per load, so no prompt cache hits) on /v1/completions, streamed, greedy, `ignore_eos`, --output-len tokens
each. Figures: generated tokens/s over the load, TTFT p50, ITL p50 (the median over requests of
(end - first token) / (tokens - 1): servers that stream several tokens per event have no per-token gaps), and the
server's resident memory (every process in its process group, /proc VmRSS) after the load. A shared machine moves
absolute figures by tens of percent; the ratios beside them are measured minutes apart. With --runs N every server
(and llama-bench) runs N rounds, one after another in the same order: the table gives each figure's median over the
rounds and each ratio's median over the N in-round ratios (a ratio is never taken across rounds). Rounds run as
separate commands (each with --json-out) make one table with --combine FILE...

Sharing the cores (`--busy 1,2`): every client count is measured quiet and then, on the same server, while K
processes spin on the cores for each K given (bench_common.busy_cores; 1 = one core's worth taken from the
server), the loaded rows named `N+Kbusy`; the table adds each server's loaded/quiet ratios (docs/benchmarks.md,
"Sharing the cores").
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from pathlib import Path

from bench_common import (
    ServerSpec,
    busy_cores,
    free_port,
    managed_server,
    server_command,
    timed_load,
    tree_rss_bytes,
)

from tgictl.runtime.bench.client import ApiSettings
from tgictl.runtime.bench.load_test import load_tokenizer
from tgictl.runtime.bench.stats import percentile
from tgictl.runtime.bench.workloads import PromptMaker, random_workload

DEFAULT_MODEL = Path.home() / ".cache/tgictl/bench-models/llama-3.2-1b"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--servers", default="tgictl,tgictl-gguf,vllm,llama-server")
    parser.add_argument("--clients", default="1,16")
    parser.add_argument("--requests-per-client", type=int, default=1)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vllm-python", default="/work/vllm-venv/bin/python")
    parser.add_argument("--llama-bin", type=Path, default=Path.home() / ".cache/llamacpp/bin")
    parser.add_argument("--tgictl-args", default="", help="extra `tgictl launch` arguments for the tgictl rows")
    parser.add_argument("--no-llama-bench", action="store_true")
    parser.add_argument("--busy", default="",
                        help="comma-separated counts: also measure each load while that many processes spin")
    parser.add_argument("--runs", type=int, default=1, help="rounds of every server; the table gives medians")
    parser.add_argument("--combine", type=Path, nargs="+", default=None,
                        help="measure nothing: the table of the rounds in these --json-out files (rounds run apart)")
    parser.add_argument("--markdown-out", type=Path, default=None)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    args.client_counts = [int(c) for c in args.clients.split(",")]
    if min(args.client_counts) < 1 or min(args.requests_per_client, args.input_len, args.output_len, args.runs) < 1:
        parser.error("--clients, --requests-per-client, --input-len, --output-len and --runs must be >= 1")
    try:
        args.busy_counts = [int(b) for b in args.busy.split(",")] if args.busy else []
    except ValueError:
        parser.error(f"--busy takes comma-separated counts, got {args.busy!r}")
    if any(b < 1 for b in args.busy_counts):
        parser.error("--busy counts must be >= 1")
    ggufs = sorted(args.model.glob("*.gguf"))
    if not (args.model / "hf").is_dir() or not ggufs:
        parser.error(f"--model {args.model}: expected hf/ and a .gguf (scripts/make_bench_models.py writes them)")
    args.gguf = ggufs[0]
    return args


def server_spec(args: argparse.Namespace) -> ServerSpec:
    return ServerSpec(hf=args.model / "hf", gguf=args.gguf, threads=args.threads,
                      max_len=args.input_len + args.output_len, slots=max(args.client_counts),
                      vllm_python=args.vllm_python, llama_bin=args.llama_bin,
                      tgictl_args=tuple(args.tgictl_args.split()))


def measure(name: str, args: argparse.Namespace, maker: PromptMaker) -> dict[str, dict[str, float]]:
    port = free_port()
    argv, env, model_field = server_command(name, server_spec(args), port)
    url = f"http://127.0.0.1:{port}"
    settings = ApiSettings("openai-completions", model_field, ignore_eos=True)
    figures: dict[str, dict[str, float]] = {}
    with managed_server(name, argv, url + "/health", env=env) as process:
        timed_load(url, settings, random_workload(maker, 2, (16, 16), (4, 4), 10_000), 2)  # warm-up, short
        for clients in args.client_counts:
            for busy in (0, *args.busy_counts):
                count = clients * args.requests_per_client
                prompts = random_workload(maker, count, (args.input_len,) * 2, (args.output_len,) * 2, clients)
                with busy_cores(busy):
                    records, seconds = timed_load(url, settings, prompts, clients)
                tokens = sum(r.output_tokens for r in records)
                tpots = [r.tpot_s for r in records if r.tpot_s is not None]
                key = load_key(clients, busy)
                figures[key] = {
                    "tok_s": tokens / seconds, "ttft_p50_s": percentile([r.ttft_s for r in records if r.ttft_s], 50),
                    "itl_p50_s": statistics.median(tpots) if tpots else float("nan"),
                    "rss_bytes": tree_rss_bytes(process.pid),
                    "tokens": tokens, "asked": count * args.output_len}
                print(f"{name} {key} clients: {json.dumps(figures[key])}", flush=True)
    return figures


def load_key(clients: int, busy: int) -> str:
    """The table's name for a load: the client count, plus the spinning processes beside it when there were any."""
    return f"{clients}+{busy}busy" if busy else str(clients)


def llama_bench(args: argparse.Namespace) -> dict[str, float]:
    """llama-bench's prompt and decode rates on the GGUF, no HTTP."""
    out = subprocess.run([str(args.llama_bin / "llama-bench"), "-m", str(args.gguf), "-p", str(args.input_len), "-n",
                          str(args.output_len), "-t", str(args.threads), "-r", "2", "-o", "json"],
                         capture_output=True, text=True, check=True, timeout=600).stdout
    rates = {("prefill" if row["n_prompt"] else "decode"): row["avg_ts"] for row in json.loads(out)}
    print(f"llama-bench: {rates}", flush=True)
    return rates


Rounds = list[dict[str, dict[str, dict[str, float]]]]  # per round: server -> client count -> figure -> value
PEERS = {"tgictl": "vllm", "tgictl-kv8": "tgictl", "tgictl-gguf": "llama-server", "tgictl-q8": "vllm",
         "tgictl-q4": "llama-server", "tgictl-before": "tgictl"}


def median_over(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def median_figures(rounds: Rounds) -> dict[str, dict[str, dict[str, float]]]:
    """Each server's figures, each one the median over the rounds that measured it."""
    merged: dict[str, dict[str, dict[str, list[float]]]] = {}
    for results in rounds:
        for name, per_clients in results.items():
            for clients, figures in per_clients.items():
                for key, value in figures.items():
                    merged.setdefault(name, {}).setdefault(clients, {}).setdefault(key, []).append(value)
    return {name: {clients: {key: median_over(values) for key, values in figures.items()}
                   for clients, figures in per_clients.items()} for name, per_clients in merged.items()}


def median_ratio(rounds: Rounds, name: str, peer: str, clients: str) -> float | None:
    """The median of `name`'s tok/s over `peer`'s, each ratio taken inside one round."""
    ratios = [r[name][clients]["tok_s"] / r[peer][clients]["tok_s"] for r in rounds
              if clients in r.get(name, {}) and clients in r.get(peer, {})]
    return median_over(ratios) if ratios else None


def median_ratio_loaded(rounds: Rounds, name: str, clients: str, busy: int) -> float | None:
    """The median of `name`'s tok/s with `busy` spinning processes over its tok/s quiet, each inside one round."""
    loaded = load_key(int(clients), busy)
    ratios = [r[name][loaded]["tok_s"] / r[name][clients]["tok_s"] for r in rounds
              if clients in r.get(name, {}) and loaded in r.get(name, {})]
    return median_over(ratios) if ratios else None


def markdown(args: argparse.Namespace, rounds: Rounds, raws: list[dict[str, float]]) -> str:
    results = median_figures(rounds)
    runs = f"median of {len(rounds)} rounds (ratios: median of the in-round ratios)" if len(rounds) > 1 else "one run"
    lines = [f"Model: `{args.model.name}` (hf/ bf16; GGUF `{args.gguf.name}`), prompts of {args.input_len} tokens, "
             f"{args.output_len} generated (ignore_eos), {args.requests_per_client} request(s) per client, "
             f"{args.threads} threads; tgictl extra args: `{args.tgictl_args or '-'}`; {runs}.", "",
             "| server | clients | tok/s | vs peer | TTFT p50 s | ITL p50 ms | RSS GiB |",
             "|---|---|---|---|---|---|---|"]
    for name, per_clients in results.items():
        for clients, f in per_clients.items():
            peer = PEERS.get(name)
            ratio = median_ratio(rounds, name, peer, clients) if peer else None
            shown = f"{ratio:.2f}x {peer}" if ratio is not None else ""
            lines.append(f"| {name} | {clients} | {f['tok_s']:.2f} | {shown} | {f['ttft_p50_s']:.2f} | "
                         f"{f['itl_p50_s'] * 1e3:.0f} | {f['rss_bytes'] / 2**30:.2f} |")
    if args.busy_counts:
        lines += ["", "Sharing the cores: tok/s with K spinning processes over tok/s quiet, the same server one load "
                      "after the other (median of the in-round ratios):", ""]
        for name in results:
            shares = [f"{clients} client(s) +{busy}busy {ratio:.2f}" for clients in map(str, args.client_counts)
                      for busy in args.busy_counts
                      if (ratio := median_ratio_loaded(rounds, name, clients, busy)) is not None]
            lines.append(f"- {name}: {', '.join(shares)}")
    if raws:
        decode = median_over([raw["decode"] for raw in raws])
        rates = f"{decode:.2f} decode, {median_over([raw['prefill'] for raw in raws]):.1f} prefill"
        lines.append(f"| llama-bench (no HTTP) | 1 | {rates} | | | | |")
        paired = [(r["tgictl-gguf"]["1"], raw) for r, raw in zip(rounds, raws) if "1" in r.get("tgictl-gguf", {})]
        if paired:
            one = results["tgictl-gguf"]["1"]
            served = median_over([1 / f["itl_p50_s"] / raw["decode"] for f, raw in paired])
            whole = median_over([f["tok_s"] / raw["decode"] for f, raw in paired])
            # llama-bench's decode rate excludes the prompt; the served decode rate is 1 / ITL (the request's
            # tok/s also pays its TTFT, which --output-len 16 weights heavily): both are shown.
            lines += ["", f"tgictl-gguf at 1 client through HTTP: decode {1 / one['itl_p50_s']:.1f} tok/s "
                          f"(1 / ITL p50) = {served:.2f}x llama-bench's raw decode; "
                          f"the request's tok/s with its TTFT {whole:.2f}x."]
    return "\n".join(lines) + "\n"


def main() -> None:
    args = parse_args()
    failed: dict[str, str] = {}
    maker = PromptMaker(load_tokenizer(str(args.model / "hf")))
    rounds: Rounds = []
    raws: list[dict[str, float]] = []
    for saved in args.combine or ():
        figures = json.loads(saved.read_text())
        rounds += figures["rounds"]
        raws += figures["llama_bench"]
    for round_index in range(0 if args.combine else args.runs):
        results: dict[str, dict[str, dict[str, float]]] = {}
        for name in args.servers.split(","):
            try:
                results[name] = measure(name, args, maker)
            except SystemExit as failure:  # one server that does not start or fails a request: the rest still run
                print(f"{name} (round {round_index + 1}): no figures ({failure})", flush=True)
                failed[name] = str(failure)
        rounds.append(results)
        if not args.no_llama_bench:
            raws.append(llama_bench(args))
    table = markdown(args, rounds, raws) + "".join(f"\n{name}: no figures ({why})\n" for name, why in failed.items())
    print(table)
    if args.markdown_out is not None:
        args.markdown_out.write_text(table)
    if args.json_out is not None:
        args.json_out.write_text(json.dumps({"rounds": rounds, "llama_bench": raws}, indent=2) + "\n")


if __name__ == "__main__":
    main()
