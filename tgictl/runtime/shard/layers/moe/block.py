"""The sparse MoE block that replaces the dense MLP in a MoE family's sparse layers: route, run the chosen experts,
sum over tensor-parallel ranks (each holds a slice of every expert: experts.py)."""

from __future__ import annotations

from torch import Tensor, nn

from tgictl.kernels.lora import AdapterGroups
from tgictl.runtime.shard.dist import DistContext, all_reduce
from tgictl.runtime.shard.layers.moe.experts import Experts
from tgictl.runtime.shard.layers.moe.router import TopKRouter
from tgictl.runtime.shard.moe_config import MoEConfig
from tgictl.runtime.shard.weights import Weights


class SparseMoE(nn.Module):
    def __init__(self, router: TopKRouter, experts: Experts, dist: DistContext) -> None:
        super().__init__()
        if router.num_experts != experts.num_experts:
            raise ValueError(f"the router scores {router.num_experts} experts; the layer has {experts.num_experts}")
        self.router = router
        self.experts = experts
        self.dist = dist

    @classmethod
    def load(cls, weights: Weights, layer_prefix: str, moe: MoEConfig) -> SparseMoE:
        router = TopKRouter(weights.get(f"{layer_prefix}.{moe.names.block}.{moe.names.router}.weight"), moe.top_k,
                            normalize=moe.normalize_top_k, weights_in_float32=moe.weights_in_float32)
        return cls(router, Experts.load(weights, layer_prefix, moe), weights.dist)

    def forward(self, x: Tensor, adapters: AdapterGroups | None = None) -> Tensor:
        """x: [tokens, hidden] -> [tokens, hidden], the same on every rank. LoRA adapters never target experts
        (refused at start-up: runtime/shard/lora/adapter_files.py), so `adapters` is not read."""
        ids, weights = self.router(x)
        # The ranks' float32 partial sums are added before the one rounding to x's dtype: in bf16 the sum is then
        # one shard's up to float32 rounding, which keeps the next layer's routing that of one shard.
        return all_reduce(self.experts(x, ids, weights), self.dist).to(x.dtype)
