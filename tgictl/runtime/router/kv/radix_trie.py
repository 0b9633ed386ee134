"""The compressed prefix trie behind the radix allocator (TGI radix.rs semantics, block granular).

A node maps a run of prompt tokens (`key`, a multiple of block_size long) to the blocks holding
their KV (`blocks`, one per block_size tokens). Looking up `abcd` also finds `ab`: values have the
same shape as keys, so any block-aligned prefix of a path is a valid hit.

Namespaces: one root per namespace (the LoRA adapter index; 0 the base model), so the same tokens under
two adapters never share a node while eviction stays one LRU over every namespace's leaves. Roots are
the nodes with node_id <= 0 (namespace k's root has id -k): a cheap test on the pin/unpin paths.

Reference counts: `ref_count` = children + allocations pinned directly to the node (a root is
never counted). Nodes with ref_count 0 are the evictable leaves, kept in an LRU min-heap on
(last_accessed, node_id). `pins_below` counts allocation pins in the subtree so the number of
pinned (unevictable) blocks is known without a walk: a node is pinned iff pins_below > 0.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator, Sequence

from tgictl.errors import AllocatorError, AllocatorIntegrityError

# (last_accessed, node_id, node): node ids are unique, so tuples never compare nodes.
_LeafEntry = tuple[int, int, "TrieNode"]


class TrieNode:
    """One edge of the trie. Mutated only by RadixTrie."""

    __slots__ = (
        "node_id", "key", "blocks", "children", "parent", "ref_count", "pins_below",
        "last_accessed", "leaf_entry",
    )

    def __init__(
        self, node_id: int, key: tuple[int, ...], blocks: list[int],
        parent: TrieNode | None, last_accessed: int,
    ) -> None:
        self.node_id = node_id  # creation order; breaks LRU ties like TGI's slot map keys
        self.key = key  # [len(blocks) * block_size] token ids
        self.blocks = blocks  # [len(key) // block_size] block ids
        self.children: dict[Hashable, TrieNode] = {}  # first block of the child's key -> child
        self.parent = parent
        self.ref_count = 0
        self.pins_below = 0
        self.last_accessed = last_accessed
        self.leaf_entry: _LeafEntry | None = None  # the live heap entry while evictable

    def __repr__(self) -> str:
        return (
            f"TrieNode(id={self.node_id}, key={self.key}, blocks={self.blocks}, "
            f"ref={self.ref_count})"
        )


class RadixTrie:
    """Prefix trie with LRU eviction. `find` and `insert` each advance a logical clock."""

    def __init__(self, block_size: int) -> None:
        self._bs = block_size
        self.root = TrieNode(0, (), [], None, 0)  # namespace 0's
        self._roots: dict[int, TrieNode] = {0: self.root}
        self._next_id = 1
        self._time = 0
        # Lazily deleted: an entry is live iff it is its node's leaf_entry.
        self._heap: list[_LeafEntry] = []
        self._leaf_count = 0
        self._num_blocks = 0  # blocks held by all nodes
        self._pinned_blocks = 0  # blocks of nodes with pins_below > 0

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def pinned_blocks(self) -> int:
        return self._pinned_blocks

    @property
    def evictable_blocks(self) -> int:
        """Every unpinned node is reachable by repeated leaf eviction, so this is exact."""
        return self._num_blocks - self._pinned_blocks

    def root_for(self, namespace: int) -> TrieNode:
        """The root of `namespace` (>= 0), created on first use."""
        root = self._roots.get(namespace)
        if root is None:
            if namespace < 0:
                raise AllocatorError(f"namespace must be >= 0, got {namespace}")
            root = self._roots[namespace] = TrieNode(-namespace, (), [], None, 0)
        return root

    def _edge(self, key: tuple[int, ...], pos: int) -> Hashable:
        # Children are keyed by their first block; a 1-token block by the token itself, which is
        # cheaper to hash than a 1-tuple. find/insert inline this on their hot path.
        return key[pos] if self._bs == 1 else key[pos : pos + self._bs]

    def _shared(self, node_key: tuple[int, ...], key: tuple[int, ...], pos: int) -> int:
        """Tokens node_key shares with key[pos:], rounded down to whole blocks."""
        n = min(len(node_key), len(key) - pos)
        n -= n % self._bs
        if node_key[:n] == key[pos : pos + n]:  # the usual case: one C-level comparison
            return n
        i = 0
        while node_key[i] == key[pos + i]:
            i += 1
        return i - i % self._bs

    def find(self, key: Sequence[int], namespace: int = 0) -> tuple[TrieNode, list[int]]:
        """Longest cached block-aligned prefix of `key`: (deepest node touched, its blocks).

        The node may match only partly; pinning it then protects the whole node. Refreshes the
        access time of every node on the path."""
        key = tuple(key)
        self._time += 1
        now, bs = self._time, self._bs
        node, blocks, pos = self.root_for(namespace), [], 0
        last = len(key) - bs  # a child can match only while a whole block remains
        while pos <= last:
            child = node.children.get(key[pos] if bs == 1 else key[pos : pos + bs])
            if child is None:
                break
            child.last_accessed = now
            if child.leaf_entry is not None:
                self._relist_leaf(child)
            node_len = len(child.key)
            if key[pos : pos + node_len] == child.key:  # the common case: the whole node matches
                blocks.extend(child.blocks)
                node, pos = child, pos + node_len
                continue
            shared = self._shared(child.key, key, pos)
            blocks.extend(child.blocks[: shared // bs])
            return child, blocks
        return node, blocks

    def insert(self, tokens: Sequence[int], blocks: Sequence[int], namespace: int = 0) -> int:
        """Publish `blocks` as the KV of `tokens`. Returns how many leading tokens were already
        cached: for those the trie keeps its own blocks and the caller's are duplicates."""
        tokens = tuple(tokens)
        bs = self._bs
        if len(tokens) != len(blocks) * bs:
            raise AllocatorError(
                f"insert: {len(tokens)} tokens do not fill {len(blocks)} blocks of {bs} tokens"
            )
        self._time += 1
        now = self._time
        node, pos, end = self.root_for(namespace), 0, len(tokens)
        while pos < end:
            child = node.children.get(tokens[pos] if bs == 1 else tokens[pos : pos + bs])
            if child is None:
                self._add_node(node, tokens[pos:], list(blocks[pos // bs :]))
                return pos
            child.last_accessed = now
            if child.leaf_entry is not None:
                self._relist_leaf(child)
            shared = self._shared(child.key, tokens, pos)
            if pos + shared == end:
                return end  # a prefix of an existing path: nothing new, no split needed
            if shared < len(child.key):
                child = self._split(child, shared)
            node = child
            pos += shared
        return pos

    def evict(self, n: int) -> list[int]:
        """Free up to `n` blocks, least recently used leaves first. A leaf with more blocks than
        still needed loses only its last ones. Returns the evicted blocks (fewer if the cache
        runs out of evictable blocks)."""
        evicted: list[int] = []
        while len(evicted) < n:
            node = self._pop_leaf()
            if node is None:
                break
            needed = n - len(evicted)
            if needed >= len(node.blocks):
                evicted.extend(node.blocks)
                self._remove(node)
            else:
                keep = len(node.blocks) - needed
                evicted.extend(node.blocks[keep:])
                del node.blocks[keep:]
                node.key = node.key[: keep * self._bs]
                self._num_blocks -= needed
                self._make_leaf(node)  # keeps its access time, so it stays first in line
        return evicted

    def drop_namespace(self, namespace: int) -> list[int]:
        """Remove every node of `namespace` (an adapter unloaded, so its cached KV is stale): returns their
        blocks. Nothing of it may be pinned; namespace 0 (the base model) is never dropped."""
        root = self._roots.get(namespace)
        if namespace == 0 or root is None:
            return []
        nodes = list(self.nodes_of(root))
        if any(node.pins_below for node in nodes):
            raise AllocatorError(f"namespace {namespace} is in use: its cached prefixes cannot be dropped")
        blocks: list[int] = []
        for node in nodes:
            if node.leaf_entry is not None:
                self._unleaf(node)
            blocks.extend(node.blocks)
            node.parent = None
        self._num_blocks -= len(blocks)
        del self._roots[namespace]
        return blocks

    def pin(self, node: TrieNode) -> None:
        """Reference `node` for a live allocation: it and its ancestors cannot be evicted."""
        if node.node_id <= 0:  # a root
            return
        if node.ref_count == 0:
            self._unleaf(node)
        node.ref_count += 1
        while node.node_id > 0:
            if node.pins_below == 0:
                self._pinned_blocks += len(node.blocks)
            node.pins_below += 1
            node = node.parent  # type: ignore[assignment]  # only the root has no parent

    def unpin(self, node: TrieNode) -> None:
        if node.node_id <= 0:
            return
        if node.ref_count <= len(node.children):
            raise AllocatorIntegrityError(f"unpin of {node!r}, which no allocation pins")
        node.ref_count -= 1
        if node.ref_count == 0:
            self._make_leaf(node)
        while node.node_id > 0:
            node.pins_below -= 1
            if node.pins_below == 0:
                self._pinned_blocks -= len(node.blocks)
            node = node.parent  # type: ignore[assignment]

    def path_blocks(self, node: TrieNode) -> list[int]:
        """The blocks from its root down to `node`, in token order."""
        parts: list[list[int]] = []
        while node.node_id > 0:
            parts.append(node.blocks)
            if node.parent is None:
                raise AllocatorIntegrityError(f"{node!r} is detached from the trie")
            node = node.parent
        return [b for part in reversed(parts) for b in part]

    def nodes(self) -> Iterator[TrieNode]:
        """Every node except the roots, parents before children."""
        for root in list(self._roots.values()):
            yield from self.nodes_of(root)

    def nodes_of(self, root: TrieNode) -> Iterator[TrieNode]:
        """Every node under `root`, parents before children."""
        stack = list(root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def check_integrity(self) -> None:
        """Structure, keys, reference counts, pin counts, leaf set and block totals."""
        bs, fail = self._bs, AllocatorIntegrityError
        for namespace, root in self._roots.items():
            if root.key or root.blocks or root.parent is not None or root.ref_count or root.leaf_entry:
                raise fail(f"the root of namespace {namespace} must stay empty, parentless and unreferenced")
        leaves: set[int] = set()
        total = pinned = 0
        # Post-order so children's pins_below are known when their parent is checked.
        order = list(self.nodes())
        seen: set[int] = set()
        for node in reversed(order):
            if node.node_id in seen:
                raise fail(f"{node!r} is reachable twice")
            seen.add(node.node_id)
            if not node.key or len(node.key) != len(node.blocks) * bs:
                raise fail(f"{node!r}: key length is not len(blocks) * {bs} (or is empty)")
            parent = node.parent
            if parent is None or parent.children.get(self._edge(node.key, 0)) is not node:
                raise fail(f"{node!r} is not its parent's child under its first block")
            direct = node.ref_count - len(node.children)
            if direct < 0:
                raise fail(f"{node!r}: ref_count below its {len(node.children)} children")
            below = direct + sum(c.pins_below for c in node.children.values())
            if node.pins_below != below:
                raise fail(f"{node!r}: pins_below {node.pins_below}, subtree holds {below}")
            is_leaf = node.ref_count == 0
            entry = node.leaf_entry
            if is_leaf != (entry is not None):
                raise fail(f"{node!r}: leaf set membership disagrees with ref_count")
            if entry is not None:
                if entry != (node.last_accessed, node.node_id, node) or entry[2] is not node:
                    raise fail(f"{node!r}: stale leaf entry {entry[:2]}")
                leaves.add(id(entry))
            total += len(node.blocks)
            pinned += len(node.blocks) if node.pins_below else 0
        live = {id(e) for e in self._heap if e[2].leaf_entry is e}
        if live != leaves or self._leaf_count != len(leaves):
            raise fail(f"leaf heap has {len(live)} live entries, the trie {len(leaves)} leaves")
        if total != self._num_blocks or pinned != self._pinned_blocks:
            raise fail(
                f"block totals: counted {total} ({pinned} pinned), "
                f"tracked {self._num_blocks} ({self._pinned_blocks} pinned)"
            )

    # -- internals -------------------------------------------------------------------------

    def _relist_leaf(self, node: TrieNode) -> None:
        """A leaf's access time changed: its heap entry must move."""
        self._leaf_count -= 1
        self._make_leaf(node)

    def _make_leaf(self, node: TrieNode) -> None:
        entry = (node.last_accessed, node.node_id, node)
        node.leaf_entry = entry
        heapq.heappush(self._heap, entry)
        self._leaf_count += 1
        if len(self._heap) > 2 * self._leaf_count + 64:
            # Drop stale entries so the heap stays O(leaves) despite lazy deletion.
            self._heap = [e for e in self._heap if e[2].leaf_entry is e]
            heapq.heapify(self._heap)

    def _unleaf(self, node: TrieNode) -> None:
        node.leaf_entry = None  # its heap entry is now stale
        self._leaf_count -= 1

    def _pop_leaf(self) -> TrieNode | None:
        heap = self._heap
        while heap:
            entry = heapq.heappop(heap)
            node = entry[2]
            if node.leaf_entry is entry:
                self._unleaf(node)
                return node
        return None

    def _add_node(self, parent: TrieNode, key: tuple[int, ...], blocks: list[int]) -> TrieNode:
        node = TrieNode(self._next_id, key, blocks, parent, self._time)
        self._next_id += 1
        parent.children[self._edge(key, 0)] = node
        if parent.node_id > 0:
            if parent.ref_count == 0:
                self._unleaf(parent)
            parent.ref_count += 1
        self._make_leaf(node)
        self._num_blocks += len(blocks)
        return node

    def _split(self, node: TrieNode, shared: int) -> TrieNode:
        """Cut `node` after `shared` tokens. The node keeps its identity (allocations pin it) and
        becomes the suffix; a new parent takes the shared part. Returns the new parent."""
        parent = node.parent
        if parent is None:
            raise AllocatorIntegrityError(f"split of detached {node!r}")
        cut = shared // self._bs
        head = TrieNode(self._next_id, node.key[:shared], node.blocks[:cut], parent, self._time)
        self._next_id += 1
        node.key = node.key[shared:]
        del node.blocks[:cut]
        parent.children[self._edge(head.key, 0)] = head  # replaces node: parent's refs unchanged
        head.children[self._edge(node.key, 0)] = node
        head.ref_count = 1
        head.pins_below = node.pins_below  # same pinned subtree, so pinned block total holds
        node.parent = head
        return head

    def _remove(self, node: TrieNode) -> None:
        """Unlink an evicted leaf (already popped from the heap)."""
        parent = node.parent
        if parent is None or node.children:
            raise AllocatorIntegrityError(f"eviction of {node!r}, which is not an attached leaf")
        del parent.children[self._edge(node.key, 0)]
        node.parent = None
        self._num_blocks -= len(node.blocks)
        if parent.node_id > 0:
            parent.ref_count -= 1
            if parent.ref_count == 0:
                self._make_leaf(parent)
