#!/usr/bin/env python3
"""Write a tiny random-weight model directory (for trying tgictl by hand or debugging a test).

    python scripts/make_tiny_model.py /tmp/tiny-llama --family llama
    python scripts/make_tiny_model.py /tmp/tiny-qwen3 --family qwen3 --layers 4 --hidden-size 128
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Run from a checkout without installing: put the repository root on the path.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tgictl.testing.tiny_models import FAMILIES, write_tiny_model  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="directory to write (created)")
    parser.add_argument("--family", choices=sorted(FAMILIES), default="llama")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate-size", type=int, default=128)
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--tie-word-embeddings", action=argparse.BooleanOptionalAction, default=None)
    args = parser.parse_args(argv)
    path = write_tiny_model(
        args.output,
        args.family,
        seed=args.seed,
        num_layers=args.layers,
        hidden_size=args.hidden_size,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        intermediate_size=args.intermediate_size,
        dtype=args.dtype,
        tie_word_embeddings=args.tie_word_embeddings,
    )
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
