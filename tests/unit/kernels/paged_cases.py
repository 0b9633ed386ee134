"""Shared builders for the kernel tests: a paged batch with known full K/V, and a naive oracle."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
from torch import Tensor

from tgictl.kernels import AttentionMetadata, build_attention_metadata, store_kv
from tgictl.kernels.kv_pages import Int8Pages, Pages, allocate_pages


@dataclass(frozen=True)
class CaseSpec:
    """A batch shape: (cache_len, new_len) per sequence plus head layout and block size."""

    seqs: tuple[tuple[int, int], ...]
    block_size: int = 4
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 8
    shuffle_blocks: bool = True
    seed: int = 0

    def label(self) -> str:
        seqs = "_".join(f"{c}+{n}" for c, n in self.seqs)
        return f"bs{self.block_size}-h{self.heads}kv{self.kv_heads}-{seqs}"


@dataclass(frozen=True, eq=False)
class PagedCase:
    spec: CaseSpec
    query: Tensor  # [num_tokens, heads, head_dim]
    keys: list[Tensor]  # per sequence [context_len, kv_heads, head_dim]
    values: list[Tensor]
    key_cache: Pages  # [num_blocks, block_size, kv_heads, head_dim] in the case's --kv-cache-dtype
    value_cache: Pages
    block_tables: list[list[int]]
    meta: AttentionMetadata
    scale: float


def nan_pages(kv_cache_dtype: str, shape: tuple[int, int, int, int], dtype: torch.dtype) -> Pages:
    """A cache of the format whose every slot reads as NaN until written (int8: NaN scales)."""
    pages = allocate_pages(kv_cache_dtype, shape, dtype, torch.device("cpu"))
    if isinstance(pages, Int8Pages):
        pages.scales.fill_(float("nan"))
        pages.values.random_(-127, 128, generator=torch.Generator().manual_seed(1))
    else:
        pages.fill_(float("nan"))
    return pages


def build_case(spec: CaseSpec, dtype: torch.dtype = torch.float32, kv_cache_dtype: str = "auto") -> PagedCase:
    """Write every sequence into a NaN-filled paged cache (prefix first, then the new tokens, as the
    model would). NaN makes any read of a never-written slot show up in the output. `keys` and `values`
    hold what was written, before the cache's format rounded it."""
    gen = torch.Generator().manual_seed(spec.seed)
    bs = spec.block_size
    needed = [math.ceil((c + n) / bs) for c, n in spec.seqs]
    num_blocks = sum(needed) + 3  # spare blocks stay NaN
    ids = list(range(1, num_blocks))  # block 0 is reserved (health probes)
    if spec.shuffle_blocks:
        ids = [ids[i] for i in torch.randperm(len(ids), generator=gen).tolist()]
    tables: list[list[int]] = []
    for n in needed:
        tables.append(ids[:n])
        ids = ids[n:]
    shape = (num_blocks, bs, spec.kv_heads, spec.head_dim)
    key_cache = nan_pages(kv_cache_dtype, shape, dtype)
    value_cache = nan_pages(kv_cache_dtype, shape, dtype)
    keys, values, queries = [], [], []
    for (cache_len, new_len), table in zip(spec.seqs, tables):
        ctx = cache_len + new_len
        k = torch.randn(ctx, spec.kv_heads, spec.head_dim, generator=gen).to(dtype)
        v = torch.randn(ctx, spec.kv_heads, spec.head_dim, generator=gen).to(dtype)
        slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(ctx)], dtype=torch.int64)
        store_kv(k[:cache_len], v[:cache_len], key_cache, value_cache, slots[:cache_len])
        store_kv(k[cache_len:], v[cache_len:], key_cache, value_cache, slots[cache_len:])
        keys.append(k)
        values.append(v)
        queries.append(torch.randn(new_len, spec.heads, spec.head_dim, generator=gen).to(dtype))
    meta = build_attention_metadata(
        [c for c, _ in spec.seqs], [n for _, n in spec.seqs], tables, bs, "cpu"
    )
    return PagedCase(
        spec, torch.cat(queries), keys, values, key_cache, value_cache, tables, meta, spec.head_dim**-0.5
    )


def naive_attention(case: PagedCase, softcap: float | None = None, window: int | None = None) -> Tensor:
    """Dense causal attention over each sequence's full K/V, head by head, float32; with `window`, a query at
    position p sees only the keys after p - window (a sliding window)."""
    spec = case.spec
    group = spec.heads // spec.kv_heads
    outs = []
    start = 0
    for (cache_len, new_len), k, v in zip(spec.seqs, case.keys, case.values):
        ctx = cache_len + new_len
        q = case.query[start : start + new_len].float()
        out = torch.empty(new_len, spec.heads, spec.head_dim)
        causal = torch.ones(ctx, ctx).tril().bool()[cache_len:]  # rows = new tokens' positions
        if window is not None:
            causal &= torch.ones(ctx, ctx).triu(1 - window).bool()[cache_len:]  # key > position - window
        for h in range(spec.heads):
            s = q[:, h] @ k[:, h // group].float().T * case.scale
            if softcap is not None:
                s = softcap * torch.tanh(s / softcap)
            s = s.masked_fill(~causal, float("-inf"))
            out[:, h] = torch.softmax(s, dim=-1) @ v[:, h // group].float()
        outs.append(out)
        start += new_len
    return torch.cat(outs)


# Layouts every attention implementation must get right.
BASE_SPECS: tuple[CaseSpec, ...] = (
    CaseSpec(seqs=((0, 7),)),  # prefill only, one sequence
    CaseSpec(seqs=((0, 5), (0, 9), (0, 1))),  # prefill batch (plus a 1-token prompt)
    CaseSpec(seqs=((6, 1), (13, 1), (3, 1))),  # decode only
    CaseSpec(seqs=((5, 1), (0, 6), (9, 1), (4, 3))),  # mixed, decode rows not first
    CaseSpec(seqs=((5, 1), (9, 1), (0, 6))),  # mixed, decode rows lead the batch
    CaseSpec(seqs=((8, 4), (3, 9))),  # prefill after a cached prefix (prefix reuse / chunking)
    CaseSpec(seqs=((0, 6), (7, 1)), heads=4, kv_heads=1),  # GQA, one KV head
    CaseSpec(seqs=((5, 3), (7, 1)), heads=4, kv_heads=4),  # plain MHA
    # decode's per-KV-head matmuls (more KV heads than its block-diagonal path takes), and SmolLM2's 9/3
    CaseSpec(seqs=((5, 1), (11, 1), (2, 4)), heads=6, kv_heads=6),
    CaseSpec(seqs=((5, 1), (11, 1), (2, 4)), heads=9, kv_heads=3),
    CaseSpec(seqs=((3, 2), (4, 1), (0, 5)), block_size=1),
    CaseSpec(seqs=((20, 1), (17, 5), (0, 33)), block_size=16),  # not block aligned, spans blocks
    CaseSpec(seqs=((16, 1), (12, 4)), block_size=16),  # exactly block aligned
    CaseSpec(seqs=((9, 1), (2, 6)), shuffle_blocks=False),
)


def random_spec(seed: int) -> CaseSpec:
    """A seeded random batch: mostly decode rows, some prompts with and without a cached prefix."""
    rng = random.Random(seed)
    kv_heads = rng.choice([1, 2, 3])
    seqs = []
    for _ in range(rng.randint(1, 9)):
        if rng.random() < 0.6:
            seqs.append((rng.randint(0, 40), 1))  # decode row (cache_len 0: a one-token prompt)
        else:
            seqs.append((rng.choice([0, rng.randint(1, 30)]), rng.randint(2, 25)))
    return CaseSpec(
        seqs=tuple(seqs),
        block_size=rng.choice([1, 2, 4, 16]),
        heads=kv_heads * rng.choice([1, 2, 3]),
        kv_heads=kv_heads,
        head_dim=rng.choice([4, 8, 16]),
        seed=seed,
    )
