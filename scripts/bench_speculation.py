#!/usr/bin/env python3
"""`--speculate N` against the same server without it, in one run: two `tgictl launch` servers up side
by side, the loads taking turns (only one server is loaded at a time), medians over the rounds.

Workloads (chat, greedy, up to 128 new tokens, each request unique):
- copy: one client asking to repeat or lightly edit a paragraph or a piece of code (what drafts help);
- free: one client asking for free writing (what they should not slow down);
- copy32 / free32: 32 concurrent clients (large batches draft nothing: they are compute-bound).
Prints tokens/s per workload for both servers, their ratio, and the acceptance rate from /metrics.

    python scripts/bench_speculation.py --model-id DIR --speculate 4 --rounds 3
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys

import httpx
from bench_common import free_port, managed_server, repo_env, timed_load

from tgictl.runtime.bench.client import ApiSettings
from tgictl.runtime.bench.workloads import BenchPrompt

PARAGRAPHS = [
    "The committee met on Tuesday to review the budget for the coming year. After a long discussion, members "
    "agreed to increase funding for the public library, reduce spending on road repairs, and set aside money "
    "for a new community garden near the river. The final vote was seven to two.",
    "Our quarterly results show steady growth across every region. Sales in the north rose by twelve percent, "
    "while the south grew by eight percent thanks to two new stores. Costs stayed flat, so the operating margin "
    "improved for the third quarter in a row.",
    "To reset the router, unplug it from the wall and wait thirty seconds. Plug it back in and wait until the "
    "front light turns solid green, which can take up to two minutes. If the light keeps blinking orange, hold "
    "the reset button on the back for ten seconds.",
    "The museum opens at nine in the morning and closes at six in the evening, except on Mondays, when it is "
    "closed all day. Tickets cost twelve dollars for adults and five dollars for children under twelve. Guided "
    "tours start every hour from the main hall.",
]
CODE = [
    "def total_price(items, tax_rate):\n    subtotal = 0\n    for item in items:\n        subtotal += item.price * "
    "item.quantity\n    tax = subtotal * tax_rate\n    return subtotal + tax\n",
    "def find_user(users, name):\n    for user in users:\n        if user.name == name:\n            return user\n"
    "    return None\n\ndef count_active(users):\n    return sum(1 for user in users if user.active)\n",
]
ASKS = ["Repeat this paragraph exactly:\n\n{}", "Rewrite this text, changing only 'the' to 'The' where it "
        "starts a sentence:\n\n{}", "Copy this text word for word:\n\n{}"]
CODE_ASKS = ["Rename the variable `subtotal` to `base` in this code and show all of it:\n\n{}",
             "Add type hints to this Python code and show the whole code:\n\n{}"]
FREE = ["Write a short story about a dragon who learns to bake.", "Explain how a refrigerator works.",
        "Give me some tips for learning to play the guitar.", "Describe the city of Paris in spring.",
        "Write a poem about the ocean at night.", "What are the benefits of regular exercise?"]


def prompts(kind: str, count: int, round_: int, new_tokens: int) -> list[BenchPrompt]:
    if kind == "copy":
        texts = [a.format(p) for p in PARAGRAPHS for a in ASKS] + [a.format(c) for c in CODE for a in CODE_ASKS]
    else:
        texts = list(FREE)
    out = []
    for i in range(count):
        # A request number in front keeps every prompt unique (no prefix-cache hits across rounds).
        text = f"(request {round_}-{i}) " + texts[i % len(texts)]
        out.append(BenchPrompt(text=text, messages=(("user", text),), max_new_tokens=new_tokens, prompt_tokens=None))
    return out


def accepted_and_drafted(url: str) -> tuple[float, float]:
    text = httpx.get(f"{url}/metrics").text
    values = [re.search(rf"^tgictl_speculative_{name}_tokens_total ([0-9.e+]+)$", text, re.M) for name in
              ("accepted", "draft")]
    return tuple(float(m.group(1)) if m else 0.0 for m in values)  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-id", required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--speculate", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--workloads", default="copy,free,copy32,free32")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    settings = ApiSettings("openai-chat", "tgi", ignore_eos=False)
    shapes = {"copy": ("copy", 1, 6), "free": ("free", 1, 4), "copy32": ("copy", 32, 64), "free32": ("free", 32, 64)}
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in workloads if w not in shapes]
    if unknown:
        raise SystemExit(f"unknown workloads {unknown}: choose from {', '.join(shapes)}")
    ports = {"plain": free_port(), "speculate": free_port()}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    base = [sys.executable, "-m", "tgictl", "launch", "--model-id", args.model_id, "--dtype", args.dtype]
    figures: dict[tuple[str, str], list[float]] = {}
    acceptance: dict[str, list[float]] = {}
    with managed_server("plain", [*base, "--port", str(ports["plain"])], urls["plain"] + "/health",
                        env=repo_env(args.threads)), \
            managed_server("speculate", [*base, "--port", str(ports["speculate"]), "--speculate", str(args.speculate)],
                           urls["speculate"] + "/health", env=repo_env(args.threads)):
        for name, url in urls.items():  # warm-up, unmeasured
            timed_load(url, settings, prompts("copy", 2, 99, 16), 2)
        for round_ in range(args.rounds):
            for workload in workloads:
                kind, clients, count = shapes[workload]
                load = prompts(kind, count, round_, args.new_tokens)
                for name, url in urls.items():
                    before = accepted_and_drafted(url)
                    records, seconds = timed_load(url, settings, load, clients)
                    after = accepted_and_drafted(url)
                    rate = sum(r.output_tokens for r in records) / seconds
                    figures.setdefault((workload, name), []).append(rate)
                    if name == "speculate":
                        drafted = after[1] - before[1]
                        acceptance.setdefault(workload, []).append((after[0] - before[0]) / drafted if drafted else 0.0)
                    print(f"round {round_ + 1} {workload:7s} {name:9s} {rate:7.1f} tok/s", flush=True)
    print(f"\n| workload | clients | without | --speculate {args.speculate} | ratio | drafts accepted |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for workload in workloads:
        plain = statistics.median(figures[(workload, "plain")])
        spec = statistics.median(figures[(workload, "speculate")])
        print(f"| {workload} | {shapes[workload][1]} | {plain:.1f} tok/s | {spec:.1f} tok/s | {spec / plain:.2f}x | "
              f"{statistics.median(acceptance[workload]):.0%} |")


if __name__ == "__main__":
    main()
