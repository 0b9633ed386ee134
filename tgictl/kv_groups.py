"""The per-layer-group paged KV cache of models that mix global and sliding-window layers (Gemma 2 and 3, SmolLM3,
Qwen2/3 with `max_window_layers`): what the shard, the router and `tgictl profile` all need of it. Pure Python, no
torch (docs/scheduling.md, "Sliding windows"; vLLM's hybrid KV cache manager, two groups).

The layers form two groups: the global layers (no window) and the local layers (a sliding window). Each group has
its own pages on the shard: `global_blocks` blocks in every global layer, `local_blocks` in every local layer. A
sequence's block table holds, for every block_size positions, a PAIR (global block, local block), sent as one id:

    id = local << 32 | global        (global = id & 0xFFFFFFFF, local = id >> 32)

so the wire, the shard's rows, the slots and the block tables stay one list of ids (uint64 on the wire), and the
shard splits them per group in one place (KVCache.layer_inputs). The stride is fixed, not a group's size, so
tensor-parallel ranks whose caches differ in size read the router's ids alike. Block 0 of each group is reserved, so
id 0 is the reserved pair. The router gives a local block back once every local layer has left it behind while the
global block stays: the id stays in the table (block i still maps positions i * block_size ..) and the shard is
not told, as no local layer reads those positions again.

How the memory is split (`split_blocks`): the local group needs, for a sequence of the reference length L (the
longest request), min(L, window + 2 blocks) positions for L global ones (the window plus the release margin). The
budget is split so that both groups hold the same number of such sequences, i.e. each group gets its bytes per
token as kept: the local group's share is keep / L of the global group's positions. It never holds fewer than one
whole sequence of L positions, because a prompt's local blocks are all taken at admission and only released once it
decodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tgictl.errors import ConfigError

PAIR_SHIFT = 32  # a pair id's local block sits above its global block's 32 bits
MAX_GROUP_BLOCKS = 1 << PAIR_SHIFT


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks of `block_size` positions that hold `tokens` positions."""
    return -(-tokens // block_size)


@dataclass(frozen=True)
class KvGroups:
    """The two groups' block counts (each including its reserved block 0) and the local layers' window."""

    global_blocks: int
    local_blocks: int
    window: int  # the widest local layer's window: a local block goes back once all local layers left it

    def __post_init__(self) -> None:
        if self.global_blocks < 1 or self.local_blocks < 1 or self.window < 1:
            raise ConfigError(f"KV groups need >= 1 block each and a window >= 1, got {self}")
        if max(self.global_blocks, self.local_blocks) > MAX_GROUP_BLOCKS:
            raise ConfigError(f"{self} has more blocks in a group than a pair id can name (2**32)")

    @staticmethod
    def pair(global_block: int, local_block: int) -> int:
        return local_block << PAIR_SHIFT | global_block

    @staticmethod
    def split(block_id: int) -> tuple[int, int]:
        """(global block, local block) of a pair id."""
        return block_id & (MAX_GROUP_BLOCKS - 1), block_id >> PAIR_SHIFT

    def check(self, owner: str, blocks: Sequence[int]) -> str | None:
        """Why `blocks` are not pair ids of these groups (naming `owner`), or None when they are."""
        for block in blocks:
            global_block, local_block = self.split(block)
            if block < 0 or global_block >= self.global_blocks or local_block >= self.local_blocks:
                return (f"{owner}: block ids must pair a global block in 0 .. {self.global_blocks - 1} with a "
                        f"local one in 0 .. {self.local_blocks - 1} (id = local << 32 | global), got {block}")
        return None


@dataclass(frozen=True)
class GroupShape:
    """What splitting a KV budget between the groups needs: one block's bytes in each group, the local window."""

    global_block_bytes: int  # K and V of block_size positions in every global layer
    local_block_bytes: int  # ... in every local layer
    window: int


def hybrid_window(layer_windows: Sequence[int | None]) -> int | None:
    """The local group's window when the layers mix global ones (None or 0) and windowed ones; None otherwise (no
    window, or every layer windowed: then whole blocks are released, scheduler.release_window)."""
    windows = [w for w in layer_windows if w]
    if not windows or len(windows) == len(layer_windows):
        return None
    return max(windows)


def local_keep(window: int, block_size: int) -> int:
    """Positions a decoding sequence's local group holds at most: the window, one block of margin (the scheduler
    releases blocks wholly behind the window less one) and the partial block being written."""
    return window + 2 * block_size


def local_blocks_for(global_blocks: int, window: int, block_size: int, reference_len: int) -> int:
    """The local group's blocks (reserved block included) for `global_blocks` global ones: keep / L of the usable
    global positions, and at least one whole sequence of L positions."""
    keep = min(reference_len, local_keep(window, block_size))
    share = blocks_for((global_blocks - 1) * keep, reference_len)
    return 1 + max(share, blocks_for(reference_len, block_size))


def split_blocks(budget: int, shape: GroupShape, block_size: int, reference_len: int) -> tuple[int, int]:
    """(global_blocks, local_blocks), reserved blocks included, the most global blocks whose pair of groups fits
    `budget` bytes (module docstring); (0, 0) when not even one sequence of `reference_len` fits."""
    global_block_bytes, window = shape.global_block_bytes, shape.window

    def cost(n: int) -> int:
        return n * global_block_bytes + local_blocks_for(n, window, block_size, reference_len) * shape.local_block_bytes

    low, high = 0, budget // max(global_block_bytes, 1) + 1
    while high - low > 1:  # cost is increasing in n: the largest n with cost(n) <= budget
        mid = (low + high) // 2
        low, high = (mid, high) if cost(mid) <= budget else (low, mid)
    if low < 1 + blocks_for(reference_len, block_size):
        return 0, 0
    return low, local_blocks_for(low, window, block_size, reference_len)
