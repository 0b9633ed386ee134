"""Does the gateway send a document's follow-up questions to the replica that has it cached?

For each policy: `tgictl launch --replicas 2 --gateway-policy POLICY`, then six different documents of
about 700 tokens, three questions about each in turn (OpenAI completions with model "tgi", through the
public port); a follow-up (2nd or 3rd question) "finds the document cached" when the replica reports at
least 90% of the document's tokens as cached (`usage.prompt_tokens_details.cached_tokens`).

    python scripts/bench_gateway_cache.py --model-id DIR [--policies cache_aware round_robin]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tgictl.runtime.launcher.plan import free_port

QUESTIONS = ("Question: what is the main topic? Answer:", "Question: who is named first? Answer:",
             "Question: summarise it in one line. Answer:")


def documents(count: int, words: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    vocabulary = [f"{a}{b}" for a in ("ka", "lo", "mi", "su", "te", "vo", "ra", "ne") for b in "aeiou"]
    return [f"Document {i}. " + " ".join(rng.choice(vocabulary) for _ in range(words)) + "\n" for i in range(count)]


def run_policy(policy: str, model_id: str, docs: list[str], log_dir: Path) -> dict[str, object]:
    port = free_port()
    log = (log_dir / f"launch-{policy}.log").open("wb")
    launch = subprocess.Popen(
        [sys.executable, "-m", "tgictl", "launch", "--model-id", model_id, "--port", str(port), "--replicas", "2",
         "--gateway-policy", policy, "--max-total-tokens", "2048", "--max-input-tokens", "2000"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                body = {"model": "tgi", "prompt": "warm up", "max_tokens": 1}
                if httpx.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if launch.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"launch did not serve; see {log.name}")
            time.sleep(0.5)
        rows = []
        with httpx.Client(timeout=120) as client:
            for index, doc in enumerate(docs):
                doc_tokens = None
                for turn, question in enumerate(QUESTIONS):
                    answer = client.post(f"{url}/v1/completions", json={
                        "model": "tgi", "prompt": doc + question, "max_tokens": 1, "temperature": 0}).json()
                    usage = answer["usage"]
                    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                    if doc_tokens is None:
                        doc_tokens = usage["prompt_tokens"] - 12  # about the question's share
                    rows.append({"doc": index, "turn": turn, "prompt_tokens": usage["prompt_tokens"],
                                 "cached_tokens": cached, "hit": cached >= 0.9 * doc_tokens})
        follow_ups = [r for r in rows if r["turn"] > 0]
        return {"policy": policy, "hits": sum(r["hit"] for r in follow_ups), "follow_ups": len(follow_ups),
                "rows": rows}
    finally:
        launch.send_signal(signal.SIGTERM)
        launch.wait(120)
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-id", required=True)
    parser.add_argument("--policies", nargs="+", default=["cache_aware", "round_robin"])
    parser.add_argument("--words", type=int, default=350, help="words per document (~700 tokens with SmolLM2's)")
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp"))
    args = parser.parse_args()
    docs = documents(6, args.words)
    for policy in args.policies:
        result = run_policy(policy, args.model_id, docs, args.log_dir)
        tokens = sorted({r["prompt_tokens"] for r in result["rows"]})  # type: ignore[index]
        print(json.dumps({"policy": policy, "follow_ups_finding_the_document_cached":
                          f"{result['hits']}/{result['follow_ups']}", "prompt_tokens": [tokens[0], tokens[-1]]}))


if __name__ == "__main__":
    main()
