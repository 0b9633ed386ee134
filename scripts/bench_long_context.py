"""Long context: 8k-token prompts through each server, one server per run (docs/benchmarks.md regenerates from it).

    flock /work/wt/bench.lock python scripts/bench_long_context.py --servers tgictl \\
        [--model HF_DIR] [--gguf FILE.gguf] [--prompt-len 8064] [--new-tokens 128] [--clients 16]
        [--threads 2] [--kv-cache-memory 3.5GiB] [--vllm-kv-gib 4] [--tgictl-args ARGS] [--json-dir DIR]
    python scripts/bench_long_context.py --combine DIR/*.json [--markdown-out table.md]

Servers (scripts/bench_common.py's commands, both cores each): tgictl (bf16 weights and KV), tgictl-kv8 (the same
with `--kv-cache-dtype int8`), vllm (vLLM CPU, bf16, its KV space VLLM_CPU_KVCACHE_SPACE=--vllm-kv-gib),
llama-server (the GGUF, one slot per client, -c (prompt + new + 16) x clients, its KV f16). Every server is sized
so that --clients prompts of --prompt-len + --new-tokens tokens fit in its KV cache at once; tgictl gets
`--kv-cache-memory`, `--max-input-tokens` and `--max-total-tokens` for that.

Per server, prompts random and unique (no prefix-cache hits), streamed on /v1/completions, greedy, ignore_eos:
- 1 client: one prompt; TTFT, prefill tok/s (prompt tokens / TTFT) and decode tok/s with the prompt cached
  (1 / ITL, ITL = (end - first token) / (tokens - 1));
- --clients clients: that many prompts at once; TTFT p50 and max, and the decode rate with every prompt
  cached: the tokens that arrived in the window in which all streams were decoding (after the last first token,
  up to the first stream's end) over the window's length (tgictl.runtime.bench.stats.all_decoding_window);
  the server's resident memory (its whole process tree) after the load.
Each run writes DIR/<server>.json; --combine makes one markdown table of them with the ratios (tgictl against
llama-server and vLLM, tgictl-kv8 against tgictl). Servers measured in separate runs: say how far apart.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from bench_common import ServerSpec, free_port, managed_server, server_command, timed_load, tree_rss_bytes

from tgictl.runtime.bench.client import ApiSettings, RequestRecord
from tgictl.runtime.bench.load_test import load_tokenizer
from tgictl.runtime.bench.stats import all_decoding_window, percentile
from tgictl.runtime.bench.workloads import PromptMaker, random_workload

DEFAULT_MODEL = Path("/tmp/smol/cache/models/HuggingFaceTB--SmolLM2-135M-Instruct")
DEFAULT_GGUF = Path("/tmp/kvint8-long/smollm2-135m-bf16.gguf")

# (figure, its comparison, the target): ratio = server's figure / peer's figure.
COMPARISONS: tuple[tuple[str, str, str, str, str], ...] = (
    ("tgictl", "llama-server", "ttft_1_s", "TTFT, 1 client", "<= 0.8"),
    ("tgictl", "vllm", "ttft_1_s", "TTFT, 1 client", "<= 1.0"),
    ("tgictl", "llama-server", "ttft_p50_s", "TTFT p50, N clients", ""),
    ("tgictl", "vllm", "ttft_p50_s", "TTFT p50, N clients", ""),
    ("tgictl", "llama-server", "decode_n_tok_s", "decode tok/s, N clients, prompts cached", ">= 1.5"),
    ("tgictl", "vllm", "decode_n_tok_s", "decode tok/s, N clients, prompts cached", ""),
    ("tgictl", "llama-server", "decode_1_tok_s", "decode tok/s, 1 client, prompt cached", ""),
    ("tgictl-kv8", "tgictl", "decode_n_tok_s", "decode tok/s, N clients, prompts cached", ">= 1.3"),
    ("tgictl-kv8", "tgictl", "ttft_1_s", "TTFT, 1 client", ""),
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", default="tgictl,tgictl-kv8,vllm,llama-server")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="the HF directory (bf16)")
    parser.add_argument("--gguf", type=Path, default=DEFAULT_GGUF, help="the same weights as GGUF (llama-server)")
    parser.add_argument("--prompt-len", type=int, default=8064, help="prompt tokens (SmolLM2's context is 8192)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--clients", type=int, default=16, help="the N of the concurrent load; 0: none")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kv-cache-memory", default="3.5GiB", help="tgictl's --kv-cache-memory")
    parser.add_argument("--vllm-kv-gib", type=int, default=4)
    parser.add_argument("--tgictl-args", default="", help="extra `tgictl launch` arguments for the tgictl rows")
    parser.add_argument("--vllm-python", default="/work/vllm-venv/bin/python")
    parser.add_argument("--llama-bin", type=Path, default=Path.home() / ".cache/llamacpp/bin")
    parser.add_argument("--seed", type=int, default=None, help="prompt seed (default: the clock: fresh prompts)")
    parser.add_argument("--json-dir", type=Path, default=Path("/tmp/kvint8-long"))
    parser.add_argument("--combine", type=Path, nargs="+", default=None, help="measure nothing: table these files")
    parser.add_argument("--markdown-out", type=Path, default=None)
    args = parser.parse_args()
    if min(args.prompt_len, args.threads) < 1 or args.clients < 0 or args.new_tokens < 2:
        parser.error("--prompt-len and --threads must be >= 1, --clients >= 0 (0: one client only), --new-tokens >= 2")
    return args


def spec(args: argparse.Namespace) -> ServerSpec:
    max_len = args.prompt_len + args.new_tokens
    tgictl_args = ("--kv-cache-memory", args.kv_cache_memory, "--max-input-tokens", str(args.prompt_len),
                   "--max-total-tokens", str(max_len), *args.tgictl_args.split())
    return ServerSpec(hf=args.model, gguf=args.gguf, threads=args.threads, max_len=max_len,
                      slots=max(args.clients, 1), vllm_python=args.vllm_python, llama_bin=args.llama_bin,
                      tgictl_args=tgictl_args, vllm_kv_gib=args.vllm_kv_gib)


def one_client(record: RequestRecord, prompt_len: int) -> dict[str, float]:
    ttft = record.ttft_s or math.nan
    tpot = record.tpot_s
    return {"ttft_1_s": ttft, "prefill_1_tok_s": prompt_len / ttft,
            "decode_1_tok_s": 1.0 / tpot if tpot else math.nan, "tokens_1": record.output_tokens}


def many_clients(records: list[RequestRecord]) -> dict[str, float]:
    # token_times count from each request's send; start_s puts them on the load's clock
    window = all_decoding_window([[r.start_s + t for t in r.token_times] for r in records])
    ttfts = [r.ttft_s for r in records if r.ttft_s is not None]
    return {"ttft_p50_s": percentile(ttfts, 50), "ttft_max_s": max(ttfts), "decode_n_tok_s": window.tok_s,
            "window_s": window.length_s, "window_tokens": window.tokens,
            "tokens_n": sum(r.output_tokens for r in records), "events_n": sum(r.stream_events for r in records)}


def measure(name: str, args: argparse.Namespace, maker: PromptMaker) -> dict[str, float]:
    port = free_port()
    argv, env, model_field = server_command(name, spec(args), port)
    url = f"http://127.0.0.1:{port}"
    settings = ApiSettings("openai-completions", model_field, ignore_eos=True)
    seed = args.seed if args.seed is not None else time.time_ns()
    new = (args.new_tokens, args.new_tokens)
    length = (args.prompt_len, args.prompt_len)
    with managed_server(name, argv, url + "/health", env=env) as process:
        timed_load(url, settings, random_workload(maker, 2, (16, 16), (4, 4), seed + 1), 2)  # warm-up, short
        records, _ = timed_load(url, settings, random_workload(maker, 1, length, new, seed + 2), 1)
        figures = one_client(records[0], args.prompt_len)
        print(f"{name} 1 client: {json.dumps(figures)}", flush=True)
        if args.clients:
            records, seconds = timed_load(url, settings,
                                          random_workload(maker, args.clients, length, new, seed + 3), args.clients)
            figures |= many_clients(records) | {"load_n_s": seconds}
        figures["rss_bytes"] = tree_rss_bytes(process.pid)
    print(f"{name} {args.clients} clients: {json.dumps(figures)}", flush=True)
    return figures


def shown(figures: dict[str, float], key: str, spec: str) -> str:
    """The figure formatted, or "-" where the run did not measure it (--clients 0)."""
    return format(figures[key], spec) if key in figures else "-"


def ratio_rows(results: dict[str, dict[str, float]]) -> list[str]:
    rows = []
    for name, peer, key, figure, target in COMPARISONS:
        if key in results.get(name, {}) and key in results.get(peer, {}):
            ratio = results[name][key] / results[peer][key]
            rows.append(f"| {name} / {peer} | {figure} | {ratio:.2f}x | {target or '-'} |")
    return rows


def markdown(runs: dict[str, dict]) -> str:
    any_run = next(iter(runs.values()))
    clients = max(run["clients"] for run in runs.values())
    lines = [f"Prompts of {any_run['prompt_len']} tokens (random, unique), {any_run['new_tokens']} generated "
             f"(ignore_eos), greedy, /v1/completions streamed; {clients} clients for the N columns.", "",
             "| server | TTFT 1 client s | prefill tok/s | decode tok/s, 1 client | TTFT p50 / max at N s "
             "| decode tok/s at N (all decoding) | window s | RSS GiB | measured |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, run in runs.items():
        f = run["figures"]
        cells = [shown(f, "ttft_1_s", ".2f"), shown(f, "prefill_1_tok_s", ".0f"), shown(f, "decode_1_tok_s", ".1f"),
                 f"{shown(f, 'ttft_p50_s', '.1f')} / {shown(f, 'ttft_max_s', '.1f')}",
                 shown(f, "decode_n_tok_s", ".1f"), shown(f, "window_s", ".1f"),
                 f"{f['rss_bytes'] / 2**30:.2f}", run["finished_utc"]]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    ratios = ratio_rows({name: run["figures"] for name, run in runs.items()})
    if ratios:
        lines += ["", "| ratio | figure | value | target |", "|---|---|---|---|", *ratios]
    return "\n".join(lines) + "\n"


def main() -> None:
    args = parse_args()
    if args.combine:
        runs = {}
        for path in args.combine:
            run = json.loads(path.read_text())
            runs[run["server"]] = run
    else:
        maker = PromptMaker(load_tokenizer(str(args.model)))
        args.json_dir.mkdir(parents=True, exist_ok=True)
        runs = {}
        for name in args.servers.split(","):
            figures = measure(name, args, maker)
            runs[name] = {"server": name, "figures": figures, "prompt_len": args.prompt_len,
                          "new_tokens": args.new_tokens, "clients": args.clients, "threads": args.threads,
                          "command": server_command(name, spec(args), 0)[0],
                          "finished_utc": time.strftime("%H:%M UTC", time.gmtime())}
            (args.json_dir / f"{name}.json").write_text(json.dumps(runs[name], indent=2) + "\n")
    table = markdown(runs)
    print(table)
    if args.markdown_out is not None:
        args.markdown_out.write_text(table)


if __name__ == "__main__":
    main()
