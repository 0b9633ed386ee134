"""Compare grammar engines on a model's vocabulary: compile time and per-token mask time.

Each schema and regex of tgictl.testing.grammar_cases is compiled cold (no cache) by each engine, then
its valid instance is walked token by token (the model's own tokenization of the instance) computing
the next-token mask before every token, as the shard does. Prints one table per engine and the
medians side by side. xgrammar is optional (not a tgictl dependency): `pip install xgrammar`.

    python scripts/bench_grammar_engines.py --model-id DIR [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tgictl.testing.grammar_cases import REGEXES, SCHEMAS  # noqa: E402

Case = tuple[str, str, Any, str]  # (name, kind "json" | "regex", schema or regex, instance text)


def cases() -> list[Case]:
    out: list[Case] = [(n, "json", s, json.dumps(v)) for n, (s, v) in SCHEMAS.items()]
    out += [(n, "regex", r, text) for n, (r, text) in REGEXES.items()]
    return out


def llguidance_engine(model_dir: Path, vocab_size: int, eos: int) -> tuple[float, Callable[[Case, list[int]], tuple[float, list[float]]]]:
    import llguidance

    start = time.perf_counter()
    tokenizer = llguidance.LLTokenizer((model_dir / "tokenizer.json").read_text(), n_vocab=vocab_size, eos_token=eos)
    setup = time.perf_counter() - start
    mask = bytearray((vocab_size + 31) // 32 * 4)

    def run(case: Case, ids: list[int]) -> tuple[float, list[float]]:
        _, kind, spec, _ = case
        t0 = time.perf_counter()
        grammar = (llguidance.LLMatcher.grammar_from_json_schema(spec) if kind == "json"
                   else llguidance.LLMatcher.grammar_from_regex(spec))
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        compile_s = time.perf_counter() - t0
        if matcher.is_error():
            raise RuntimeError(matcher.get_error())
        times = []
        for token in ids:
            t = time.perf_counter()
            matcher.compute_bitmask()
            times.append(time.perf_counter() - t)
            if not matcher.consume_token(token):
                raise RuntimeError(f"llguidance refused token {token}: {matcher.get_error()}")
        return compile_s, times

    return setup, run


def xgrammar_engine(model_dir: Path, vocab_size: int, eos: int) -> tuple[float, Callable[[Case, list[int]], tuple[float, list[float]]]]:
    import xgrammar as xgr
    from transformers import AutoTokenizer

    start = time.perf_counter()
    hf = AutoTokenizer.from_pretrained(model_dir)
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size, stop_token_ids=[eos])
    setup = time.perf_counter() - start
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def run(case: Case, ids: list[int]) -> tuple[float, list[float]]:
        _, kind, spec, _ = case
        compiler = xgr.GrammarCompiler(info, cache_enabled=False)
        t0 = time.perf_counter()
        compiled = (compiler.compile_json_schema(json.dumps(spec), strict_mode=False) if kind == "json"
                    else compiler.compile_regex(spec))
        matcher = xgr.GrammarMatcher(compiled)
        compile_s = time.perf_counter() - t0
        times = []
        for token in ids:
            t = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            times.append(time.perf_counter() - t)
            if not matcher.accept_token(token):
                raise RuntimeError(f"xgrammar refused token {token}")
        return compile_s, times

    return setup, run


ENGINES = {"llguidance": llguidance_engine, "xgrammar": xgrammar_engine}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-id", type=Path, required=True, help="a local model directory (tokenizer.json)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the median is reported")
    parser.add_argument("--engines", default="llguidance,xgrammar")
    args = parser.parse_args()
    from tokenizers import Tokenizer

    config = json.loads((args.model_id / "config.json").read_text())
    vocab_size, eos = int(config["vocab_size"]), int(config["eos_token_id"] if isinstance(config["eos_token_id"], int) else config["eos_token_id"][0])
    tokenizer = Tokenizer.from_file(str(args.model_id / "tokenizer.json"))
    summary: dict[str, dict[str, float]] = {}
    for name in args.engines.split(","):
        try:
            setup, run = ENGINES[name](args.model_id, vocab_size, eos)
        except ImportError as err:
            print(f"{name}: not installed ({err})")
            continue
        print(f"\n{name}: tokenizer setup {setup * 1000:.0f} ms, vocabulary {vocab_size}")
        print(f"{'case':<18} {'compile ms':>10} {'mask us p50':>12} {'mask us max':>12} {'tokens':>7}")
        compiles, masks = [], []
        for case in cases():
            ids = tokenizer.encode(case[3], add_special_tokens=False).ids
            runs = [run(case, ids) for _ in range(args.repeat)]
            compile_s = statistics.median(r[0] for r in runs)
            per_token = [statistics.median(r[1][i] for r in runs) for i in range(len(ids))]
            compiles.append(compile_s)
            masks.extend(per_token)
            print(f"{case[0]:<18} {compile_s * 1000:>10.2f} {statistics.median(per_token) * 1e6:>12.1f} "
                  f"{max(per_token) * 1e6:>12.1f} {len(ids):>7}")
        summary[name] = {
            "compile_p50_ms": statistics.median(compiles) * 1000, "compile_max_ms": max(compiles) * 1000,
            "mask_p50_us": statistics.median(masks) * 1e6, "mask_mean_us": statistics.mean(masks) * 1e6,
            "mask_max_us": max(masks) * 1e6,
        }
    print("\n" + json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
