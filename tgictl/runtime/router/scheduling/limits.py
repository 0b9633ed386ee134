"""Start-up limits: the warmup batch the router sends and the limits it derives from the answer, as
TGI does (its launcher's derived limits, the router's warmup batch, FlashCausalLM.warmup). Pure
functions, so every rule is unit-tested without a shard."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tgictl.config import RouterConfig
from tgictl.errors import ConfigError
from tgictl.kv_groups import KvGroups, hybrid_window
from tgictl.proto.messages import (
    Batch,
    Info,
    Request,
    SamplingParams,
    StoppingParams,
    WarmupRequest,
    WarmupResult,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_PREFILL_TOKENS = 4096  # TGI's fallback when no FLOPs estimate exists
# RouterConfig.prefill_group_tokens on a CPU: bf16 SmolLM2 and Llama-3.2-1B shapes on 2 Zen 4 cores, 16 clients'
# 64-token prompts at once (docs/scheduling.md): the first token's median came down, tokens/s held.
CPU_PREFILL_GROUP_TOKENS = 512

# TGI's probe: every processor switched on, so warmup exercises the slowest sampling path.
_WARMUP_SAMPLING = SamplingParams(
    temperature=0.9, top_k=10, top_p=0.9, typical_p=0.9, do_sample=False, seed=0,
    repetition_penalty=1.2, frequency_penalty=0.1,
)


@dataclass(frozen=True)
class RouterLimits:
    max_input_tokens: int
    max_total_tokens: int
    max_batch_prefill_tokens: int
    max_batch_total_tokens: int  # KV tokens the shards hold (warmup), at most the user's value
    max_batch_size: int | None
    num_blocks: int  # allocator blocks, reserved block 0 included
    # The shards' two layer groups (a model mixing global and sliding-window layers); None: one group.
    kv_groups: KvGroups | None = None


def max_batch_prefill_tokens(config: RouterConfig, info: Info) -> int:
    """The user's value, else TGI's default clamped to the model's positions (prompts longer than it
    are prefilled in chunks)."""
    if config.max_batch_prefill_tokens is not None:
        return config.max_batch_prefill_tokens
    return min(DEFAULT_MAX_BATCH_PREFILL_TOKENS, info.max_position_embeddings)


def prefill_group_tokens(config: RouterConfig, info: Info) -> int | None:
    """The prompt tokens one Prefill gathers from several requests (SchedulerConfig.prefill_group_tokens):
    the user's value (0: no limit), else CPU_PREFILL_GROUP_TOKENS on a CPU and no limit on CUDA. On a CPU a
    prefill is bound by the cores' arithmetic, so one step of a whole burst gives every request its first token
    at the end of all of their prompts; on a GPU a burst's prompts cost little more together than one alone."""
    if config.prefill_group_tokens is not None:
        return config.prefill_group_tokens or None
    return CPU_PREFILL_GROUP_TOKENS if info.device_type == "cpu" else None


def max_request_tokens(num_blocks: int, block_size: int) -> int:
    """The largest input + max_new_tokens one request can be allocated: every usable block (block 0 is
    reserved), plus one, since the last sampled token is never fed back and needs no KV slot."""
    return (num_blocks - 1) * block_size + 1


def warmup_request(config: RouterConfig, info: Info, token_id: int, max_prefill_tokens: int) -> WarmupRequest:
    """Requests of one repeated token id until they fill max_prefill_tokens (or max_batch_size), as
    TGI 1.4 builds its warmup batch; no blocks, the shard assigns them for the probe."""
    requests: list[Request] = []
    n_tokens = 0
    per_request = config.max_input_tokens if config.max_input_tokens is not None else max_prefill_tokens
    while n_tokens < max_prefill_tokens and (config.max_batch_size is None or len(requests) < config.max_batch_size):
        truncate = min(per_request, max_prefill_tokens - n_tokens)
        max_new = config.max_total_tokens - truncate if config.max_total_tokens is not None else 1
        requests.append(
            Request(
                id=len(requests),
                input_ids=(token_id,) * truncate,
                sampling=_WARMUP_SAMPLING,
                stopping=StoppingParams(max_new_tokens=max(max_new, 1), ignore_eos=True),
                prefill_logprobs=True,
                top_n_tokens=20,
            )
        )
        n_tokens += truncate
    batch = Batch(id=0, requests=tuple(requests), max_tokens=config.max_input_tokens or 0)
    return WarmupRequest(
        batch=batch,
        max_prefill_tokens=max_prefill_tokens,
        max_input_tokens=config.max_input_tokens,
        max_total_tokens=config.max_total_tokens,
    )


def derive_limits(config: RouterConfig, info: Info, warmup: WarmupResult, max_prefill_tokens: int) -> RouterLimits:
    """Limits not given come from warmup; then the router-side checks of TGI's v3 main.rs."""
    supported = warmup.max_supported_total_tokens
    batch_total = supported
    if config.max_batch_total_tokens is not None:
        if config.max_batch_total_tokens > supported:
            log.warning(
                "--max-batch-total-tokens %d exceeds the %d KV tokens the shards hold; using %d",
                config.max_batch_total_tokens, supported, supported,
            )
        batch_total = min(config.max_batch_total_tokens, supported)
    num_blocks = batch_total // info.block_size
    if num_blocks < 2:
        raise ConfigError(f"the KV cache holds {batch_total} tokens: fewer than one usable block of {info.block_size}")
    window = hybrid_window(info.layer_windows)
    groups = None
    if warmup.local_blocks and window is not None:
        groups = KvGroups(supported // info.block_size, warmup.local_blocks, window)
    # A prompt takes all its local blocks at admission: one request fits both groups.
    fits = max_request_tokens(min(num_blocks, groups.local_blocks if groups else num_blocks), info.block_size)
    max_total = config.max_total_tokens if config.max_total_tokens is not None else min(warmup.max_total_tokens, fits)
    max_input = config.max_input_tokens if config.max_input_tokens is not None else min(
        warmup.max_input_tokens, max_total - 1
    )
    if config.max_batch_prefill_tokens is None:
        max_prefill_tokens = min(max_prefill_tokens, batch_total)  # a derived default bends to memory
    if max_input >= max_total:
        raise ConfigError(
            f"--max-input-tokens ({max_input}) must be < --max-total-tokens ({max_total}); "
            f"a value not given is derived from the warmup"
        )
    if max_prefill_tokens > batch_total:
        raise ConfigError(
            f"--max-batch-prefill-tokens ({max_prefill_tokens}) must be <= --max-batch-total-tokens "
            f"({batch_total}, at most the KV tokens the shards hold)"
        )
    if max_total > fits:
        raise ConfigError(
            f"Not enough memory to handle --max-total-tokens {max_total}: the shards hold "
            f"{batch_total} KV tokens (--max-batch-total-tokens), {num_blocks - 1} usable blocks of "
            f"{info.block_size}, so one request can have at most {fits}; lower --max-total-tokens"
        )
    return RouterLimits(
        max_input_tokens=max_input,
        max_total_tokens=max_total,
        max_batch_prefill_tokens=max_prefill_tokens,
        max_batch_total_tokens=batch_total,
        max_batch_size=config.max_batch_size,
        num_blocks=num_blocks,
        kv_groups=groups,
    )
