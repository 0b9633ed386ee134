"""`--num-shard 2` on the real model: SmolLM2-135M's 9 query heads over 3 KV heads split 6 + 3 by
KV-head groups; float32 greedy tokens equal one shard's, logits within 1e-4, both ranks identical."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch import Tensor

from tgictl.kernels import build_attention_metadata
from tgictl.runtime.launcher.plan import free_port
from tgictl.runtime.shard.dist import DistContext, destroy_distributed, init_distributed
from tgictl.runtime.shard.models.registry import load_model

CPU = torch.device("cpu")
BLOCK = 16
STEPS = 24
TIMEOUT_S = 240.0
PROMPT = (1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198)  # a chat turn: "What is the capital of France?"


def greedy(model_dir: Path, dist: DistContext) -> tuple[list[int], list[Tensor]]:
    """Prefill PROMPT, then STEPS greedy decode steps; the tokens and every step's logits."""
    model = load_model(model_dir, dtype=torch.float32, device=CPU, dist=dist)
    cache = model.allocate_kv_cache(8, BLOCK)
    blocks = list(range(1, 8))
    tokens, logits = list(PROMPT), []
    start = 0
    for _ in range(STEPS):
        ids = torch.tensor(tokens[start:])
        positions = torch.arange(start, len(tokens))
        slots = torch.tensor([blocks[p // BLOCK] * BLOCK + p % BLOCK for p in range(start, len(tokens))])
        meta = build_attention_metadata([start], [len(tokens) - start], [blocks], BLOCK, CPU)
        out = model(ids, positions, slots, cache, meta, torch.tensor([len(tokens) - start - 1]))  # [1, vocab]
        logits.append(out[0])
        start = len(tokens)
        tokens.append(int(out[0].argmax()))
    return tokens[len(PROMPT):], logits


def _worker(rank: int, model_dir: str, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist = init_distributed(rank, 2, "127.0.0.1", port, CPU, timeout_s=TIMEOUT_S)
    try:
        torch.save(greedy(Path(model_dir), dist), Path(out_dir) / f"rank{rank}.pt")
    finally:
        destroy_distributed(dist)


def test_two_shards_of_smollm2_generate_what_one_does(smollm2_dir: Path, tmp_path: Path) -> None:
    context = mp.spawn(_worker, args=(str(smollm2_dir), free_port(), str(tmp_path)), nprocs=2, join=False)
    deadline = time.monotonic() + TIMEOUT_S
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("tensor-parallel workers did not finish")
    (tokens0, logits0), (tokens1, logits1) = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    tokens, logits = greedy(smollm2_dir, DistContext.single())
    assert tokens0 == tokens1 == tokens
    assert len(set(tokens)) > 3  # a real answer, not one token repeated
    for ours0, ours1, reference in zip(logits0, logits1, logits):
        assert torch.equal(ours0, ours1)
        assert (ours0 - reference).abs().max().item() <= 1e-4
