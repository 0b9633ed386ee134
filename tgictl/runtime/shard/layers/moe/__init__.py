"""The mixture-of-experts layer both MoE families use in place of the dense MLP (docs/moe.md): a top-k router
(router.py), the experts' weights with their grouped and reference forwards (experts.py) and the block that joins
them across tensor-parallel ranks (block.py)."""

from tgictl.runtime.shard.layers.moe.block import SparseMoE
from tgictl.runtime.shard.layers.moe.experts import Experts
from tgictl.runtime.shard.layers.moe.router import TopKRouter

__all__ = ["Experts", "SparseMoE", "TopKRouter"]
