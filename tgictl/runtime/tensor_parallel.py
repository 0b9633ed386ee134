"""How a model is split over tensor-parallel ranks: one rule that the shard loads by and `tgictl
profile` sizes by (docs/architecture.md, "Decisions": Tensor parallelism). Pure Python, no torch.

Attention is split by KV-head groups (a KV head with the query heads that read it), as evenly as
possible, so a rank's query heads always read KV heads it holds: SmolLM2-135M's 9 query heads over 3
KV heads on 2 ranks become 2 groups (6 query heads) and 1 group (3). With more ranks than KV heads,
each KV head is replicated on the ranks that share its group and the group's query heads are split
among them. Other dimensions (MLP columns, the padded vocabulary) are split as evenly as possible.
TGI and vLLM refuse splits that do not divide evenly; any split works here, at the price of some
imbalance between ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from tgictl.errors import UnsupportedModelError


def even_split(size: int, index: int, parts: int) -> tuple[int, int]:
    """[start, stop) of part `index` when `size` items are cut into `parts` contiguous parts whose sizes
    differ by at most one, the larger parts first."""
    base, extra = divmod(size, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


@dataclass(frozen=True)
class HeadSplit:
    """One rank's attention heads: query heads [q_start, q_start + q_count) and the KV heads they read,
    [kv_start, kv_start + kv_count). Every local query head reads local KV head
    (q_start + j) // group - kv_start, and all of a rank's query heads share one such ratio."""

    q_start: int
    q_count: int
    kv_start: int
    kv_count: int


def head_split(num_heads: int, num_kv_heads: int, rank: int, world_size: int) -> HeadSplit:
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise UnsupportedModelError(
            f"num_attention_heads ({num_heads}) must be a multiple of num_key_value_heads ({num_kv_heads})"
        )
    if world_size > num_heads:
        raise UnsupportedModelError(
            f"{world_size} shards are more than the model's {num_heads} attention heads: every shard needs one"
        )
    group = num_heads // num_kv_heads
    if world_size <= num_kv_heads:
        kv_start, kv_stop = even_split(num_kv_heads, rank, world_size)
        return HeadSplit(kv_start * group, (kv_stop - kv_start) * group, kv_start, kv_stop - kv_start)
    # More ranks than KV heads: ranks are dealt to KV heads as evenly as possible; each rank holds its
    # KV head (replicated) and a share of that head's query group.
    for kv in range(num_kv_heads):
        first, last = even_split(world_size, kv, num_kv_heads)
        if first <= rank < last:
            if last - first > group:
                raise UnsupportedModelError(
                    f"{world_size} shards cannot share {num_kv_heads} KV heads of {group} query heads each: "
                    f"{last - first} shards would share a group of {group}"
                )
            q_start, q_stop = even_split(group, rank - first, last - first)
            return HeadSplit(kv * group + q_start, q_stop - q_start, kv, 1)
    raise UnsupportedModelError(f"rank {rank} is outside a world of {world_size}")  # unreachable for valid ranks


def head_splits(num_heads: int, num_kv_heads: int, world_size: int) -> tuple[HeadSplit, ...]:
    """Every rank's split, in rank order."""
    return tuple(head_split(num_heads, num_kv_heads, rank, world_size) for rank in range(world_size))
