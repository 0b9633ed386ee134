"""The dataclasses both sides of the gRPC contract speak (docs/architecture.md, "Decisions": TGI's proto shape).

These mirror `generate.proto` one to one, without protobuf and without torch, so the router and the
shard share one vocabulary; `tgictl.proto.convert` is the only place that turns them into protobuf
messages and back. Token ids cross the wire, never text (docs/architecture.md, "Decisions": Token ids on the wire): the shard has no tokenizer
and the router detokenizes, so `Tokens` carries ids and logprobs only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class GrammarType(enum.IntEnum):
    """How Grammar.value is read (generate.proto's GrammarType)."""

    NONE = 0
    JSON = 1  # a JSON schema
    REGEX = 2  # a regex the whole output must match
    LLGUIDANCE = 3  # a compiled llguidance grammar: what the tgictl router sends


@dataclass(frozen=True)
class Grammar:
    """The grammar a request's tokens must follow (docs/architecture.md, "Guided generation")."""

    type: GrammarType
    value: str
    replay_tokens: int = 0  # continuation rounds: the last n input ids were generated under it


@dataclass(frozen=True)
class SamplingParams:
    """How one request chooses its next token. Neutral values switch a processor off."""

    temperature: float = 1.0  # > 0; 1.0 = off
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # (0, 1]; 1.0 = off
    typical_p: float = 1.0  # (0, 1]; 1.0 = off
    min_p: float = 0.0  # [0, 1); 0.0 = off
    do_sample: bool = False  # False = greedy (argmax) unless a warper above is set
    seed: int = 0  # u64; seeds this request's own generator, so its tokens never depend on the batch
    repetition_penalty: float = 1.0  # > 0; 1.0 = off (CTRL-style: divide positive, multiply negative)
    frequency_penalty: float = 0.0  # [-2, 2]; subtracts penalty * count(token) (OpenAI semantics)
    presence_penalty: float = 0.0  # [-2, 2]; subtracts penalty once per token already present
    grammar: Grammar | None = None  # None = unconstrained
    # The sampling step of the first token: tokens generated before (a continuation round or a resumption
    # after preemption), so the random stream (seed, step) goes on where it stopped. 0 for a new request.
    step_offset: int = 0

    @property
    def samples(self) -> bool:
        """Whether the choice is random: explicit do_sample or any warper that reshapes the distribution."""
        return (
            self.do_sample
            or self.temperature != 1.0
            or self.top_k != 0
            or self.top_p < 1.0
            or self.typical_p < 1.0
            or self.min_p > 0.0
        )


@dataclass(frozen=True)
class StoppingParams:
    """When the shard stops a request. Stop strings live in the router (docs/architecture.md, "Decisions": Stopping split)."""

    max_new_tokens: int  # >= 1; tokens this scheduling round may generate
    ignore_eos: bool = False  # benchmarks and warmup: keep going past EOS


@dataclass(frozen=True)
class Request:
    """One sequence as the router schedules it. Lifetime: the whole life of the request on the shard."""

    id: int  # router-assigned, unique while the request lives
    input_ids: tuple[int, ...]  # the whole prompt, already truncated by the router
    sampling: SamplingParams
    stopping: StoppingParams
    # KV placement chosen by the router (docs/architecture.md, "Decisions": The router owns memory): at least
    # the prompt's blocks; more arrive as BlockGrants. Position p writes slot blocks[p // bs] * bs + p % bs.
    # Empty only in warmup, where the shard assigns blocks itself.
    blocks: tuple[int, ...] = ()
    cache_len: int = 0  # prompt tokens whose KV is already in the cache (prefix cache hit)
    chunk_len: int | None = None  # prompt tokens to compute in the first forward; None = all the rest
    prefill_logprobs: bool = False  # return the logprob of every prompt token
    top_n_tokens: int = 0  # also return the n most likely tokens at every step
    adapter_index: int = 0  # LoRA adapter: 0 = the base model, k = Info.adapters[k - 1]


@dataclass(frozen=True)
class Batch:
    """Requests the router sends to be prefilled together."""

    id: int
    requests: tuple[Request, ...]
    max_tokens: int = 0  # router bookkeeping: tokens the batch may occupy
    max_blocks: int = 0  # blocks of the largest request

    @property
    def size(self) -> int:
        return len(self.requests)


@dataclass(frozen=True)
class CachedBatch:
    """A batch the shard keeps between steps, by id."""

    id: int
    request_ids: tuple[int, ...]
    max_tokens: int  # KV tokens the batch's blocks hold
    current_tokens: int  # tokens the next forward processes (chunk lengths while prefilling, else size)

    @property
    def size(self) -> int:
        return len(self.request_ids)


class FinishReason(enum.IntEnum):
    LENGTH = 0
    EOS_TOKEN = 1
    STOP_SEQUENCE = 2  # set by the router only; the shard never sees stop strings


@dataclass(frozen=True)
class Tokens:
    """Token ids with their log-probabilities (texts are the router's business)."""

    ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()  # NaN where no logprob exists (the first prompt token)


@dataclass(frozen=True)
class GeneratedText:
    """Present on a request's last generation."""

    generated_tokens: int
    finish_reason: FinishReason
    seed: int | None  # only when the request sampled


@dataclass(frozen=True)
class Generation:
    """What one request produced in one step."""

    request_id: int
    tokens: Tokens  # the new token(s) of this step
    prefill_tokens: Tokens | None = None  # prompt logprobs, on the first generation, when asked
    top_tokens: tuple[Tokens, ...] = ()  # one entry per token in `tokens` when top_n_tokens > 0
    generated_text: GeneratedText | None = None  # set when the request finished on the shard
    prefill_top_tokens: tuple[Tokens, ...] = ()  # one per prompt token, with prefill_tokens and top_n_tokens
    draft_tokens: int = 0  # speculative drafts verified this step
    accepted_tokens: int = 0  # of them, kept (the tokens then hold these plus the one after them)
    error: str = ""  # the shard ended this request (only it) because of its own input; see generate.proto


@dataclass(frozen=True)
class Timings:
    forward_ns: int = 0  # model forward + sampling
    decode_ns: int = 0  # post-forward bookkeeping (stopping, building generations)
    total_ns: int = 0  # the whole RPC
    concat_ns: int | None = None  # only when batches were concatenated


@dataclass(frozen=True)
class StepResult:
    """Answer to Prefill and Decode."""

    generations: tuple[Generation, ...]
    batch: CachedBatch | None  # None when every request finished
    timings: Timings = field(default_factory=Timings)


@dataclass(frozen=True)
class Info:
    """Static facts about a shard and its model."""

    dtype: str  # "float32" | "bfloat16" | "float16"
    device_type: str  # "cpu" | "cuda"
    block_size: int
    support_chunking: bool
    use_prefix_caching: bool
    attention_impl: str
    model_type: str
    vocab_size: int
    num_layers: int
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]
    world_size: int
    requires_padding: bool = False
    speculate: int = 0
    adapters: tuple[str, ...] = ()  # LoRA adapter slots by name ("" free); adapter_index k is adapters[k - 1]
    # per layer, its sliding window in positions; 0: the whole context (empty from a shard that does not say)
    layer_windows: tuple[int, ...] = ()


@dataclass(frozen=True)
class WarmupRequest:
    batch: Batch  # probe batch at max_prefill_tokens; its requests carry no blocks (the shard assigns)
    max_prefill_tokens: int
    max_input_tokens: int | None = None
    max_total_tokens: int | None = None


@dataclass(frozen=True)
class WarmupResult:
    max_supported_total_tokens: int  # KV tokens the cache holds (num_blocks * block_size)
    max_input_tokens: int
    max_total_tokens: int
    # A model mixing global and sliding-window layers: the local layer group's blocks (reserved included), and
    # max_supported_total_tokens is the global group's; 0: one group (tgictl/kv_groups.py).
    local_blocks: int = 0


# Request messages of the RPCs whose arguments are more than one plain value. Health and Info take no
# arguments; FilterBatch answers with a CachedBatch and ServiceDiscovery with a list of URLs.


@dataclass(frozen=True)
class ClearCacheRequest:
    batch_id: int | None = None  # None = drop every cached batch


@dataclass(frozen=True)
class FilterBatchRequest:
    batch_id: int
    request_ids: tuple[int, ...]  # requests to keep; non-empty


@dataclass(frozen=True)
class BlockGrant:
    """More KV blocks for a running request, appended to its blocks before the step that needs them."""

    request_id: int
    blocks: tuple[int, ...]


@dataclass(frozen=True)
class PrefillRequest:
    batch: Batch
    cached_batch: CachedBatch | None = None  # chunking: concatenated before the new batch
    max_prefill_tokens: int | None = None  # the router's budget for later chunks; None: unchanged
    grants: tuple[BlockGrant, ...] = ()  # for requests of cached_batch


@dataclass(frozen=True)
class DecodeRequest:
    batches: tuple[CachedBatch, ...]  # non-empty; merged into one forward, in this order
    steps: int = 1  # decode steps before the answer (runtime/shard/decode_steps.py)
    grants: tuple[BlockGrant, ...] = ()  # for requests of `batches`, before the first step


@dataclass(frozen=True)
class LoadAdapterRequest:
    name: str
    path: str  # a local PEFT adapter directory
    adapter_index: int  # the slot (from 1): a free one, or len(Info.adapters) + 1
