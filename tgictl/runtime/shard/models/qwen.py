"""Qwen2 (bias on q/k/v, none on o) and Qwen3 (per-head RMSNorm on q and k before rotary)."""

from __future__ import annotations

from tgictl.runtime.shard.layers.attention import AttentionOptions
from tgictl.runtime.shard.model_config import ModelConfig
from tgictl.runtime.shard.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def attention_options(cls, config: ModelConfig) -> AttentionOptions:
        # Qwen2's q/k/v projections always carry a bias, whatever the config says; o_proj never does.
        return AttentionOptions(qkv_bias=True, o_bias=False, qk_norm=False)


class Qwen3ForCausalLM(LlamaForCausalLM):
    @classmethod
    def attention_options(cls, config: ModelConfig) -> AttentionOptions:
        return AttentionOptions(qkv_bias=config.attention_bias, o_bias=config.attention_bias, qk_norm=True)
