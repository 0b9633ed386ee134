"""The per-layer-group paged KV cache of models that mix global and sliding-window layers (Gemma 2 and 3, SmolLM3,
Qwen2/3 with `max_window_layers`): what the shard, the router and `tgictl profile` all need of it. Pure Python, no
torch (docs/scheduling.md, "Sliding windows"; vLLM's hybrid KV cache manager, two groups).

The layers form two groups: the global layers (no window) and the local layers (a sliding window). Each group has
its own pages on the shard: `global_blocks` blocks in every global layer, `local_blocks` in every local layer. A
sequence's block table holds, for every block_size positions, a PAIR (global block, local block), sent as one id:

    id = local * global_blocks + global        (global = id % global_blocks, local = id // global_blocks)

so the wire, the shard's rows, the slots and the block tables stay one list of ids (uint64 on the wire), and the
shard splits them per group in one place (ModelRunner.forward_hidden). Block 0 of each group is reserved, so id 0
is the reserved pair. The router gives a local block back once every local layer has left it behind while the
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

UINT64_IDS = 1 << 64  # block ids cross the wire as uint64


def blocks_for(tokens: int, block_size: int) -> int:
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
        if self.global_blocks * self.local_blocks > UINT64_IDS:
            raise ConfigError(f"{self} has more block pairs than a uint64 id can name")

    @property
    def num_ids(self) -> int:
        """Valid pair ids are 0 .. num_ids - 1."""
        return self.global_blocks * self.local_blocks

    def pair(self, global_block: int, local_block: int) -> int:
        return local_block * self.global_blocks + global_block

    def split(self, block_id: int) -> tuple[int, int]:
        """(global block, local block) of a pair id."""
        return block_id % self.global_blocks, block_id // self.global_blocks


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


def split_blocks(
    budget: int, global_block_bytes: int, local_block_bytes: int, window: int, block_size: int, reference_len: int
) -> tuple[int, int]:
    """(global_blocks, local_blocks), reserved blocks included, the most global blocks whose pair of groups fits
    `budget` bytes (module docstring); (0, 0) when not even one sequence of `reference_len` fits."""
    def cost(n: int) -> int:
        return n * global_block_bytes + local_blocks_for(n, window, block_size, reference_len) * local_block_bytes

    low, high = 0, budget // max(global_block_bytes, 1) + 1
    while high - low > 1:  # cost is increasing in n: the largest n with cost(n) <= budget
        mid = (low + high) // 2
        low, high = (mid, high) if cost(mid) <= budget else (low, mid)
    if low < 1 + blocks_for(reference_len, block_size):
        return 0, 0
    return low, local_blocks_for(low, window, block_size, reference_len)
