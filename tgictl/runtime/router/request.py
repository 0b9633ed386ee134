"""What validation hands to the scheduler, and what the scheduler streams back to the HTTP layer."""

from __future__ import annotations

from dataclasses import dataclass, field

from tgictl.errors import TgictlError
from tgictl.proto.messages import FinishReason, SamplingParams


@dataclass(frozen=True)
class ValidatedRequest:
    """A request that passed every limit, tokenized once (docs/architecture.md, "Decisions": Token ids on the wire)."""

    input_ids: tuple[int, ...]  # after truncation: the last `truncate` tokens
    sampling: SamplingParams
    max_new_tokens: int  # this scheduling round (capped per round: see scheduling/entry.py's continuation)
    stop_sequences: tuple[str, ...] = ()
    ignore_eos: bool = False
    top_n_tokens: int = 0
    decoder_input_details: bool = False  # prompt logprobs: the whole prompt is recomputed, no prefix reuse
    max_total_new_tokens: int | None = None  # across all rounds; None = max_new_tokens
    adapter_index: int = 0  # LoRA adapter: 0 = the base model, k = the shard's Info.adapters[k - 1]
    adapter: str | None = None  # its name (metrics, the OpenAI `model` echo); None = the base model
    priority: int = 0  # --scheduling-policy priority: lower runs first (vLLM's semantics); 0 otherwise
    # The request's OpenTelemetry span context (an opentelemetry SpanContext), for the batch spans'
    # links; None when not traced.
    trace: object | None = field(default=None, compare=False)

    @property
    def input_length(self) -> int:
        return len(self.input_ids)

    @property
    def total_new_tokens(self) -> int:
        return self.max_total_new_tokens if self.max_total_new_tokens is not None else self.max_new_tokens


@dataclass(frozen=True)
class TokenInfo:
    id: int
    text: str  # this token's text, special tokens included
    logprob: float  # NaN when unknown (the first prompt token)
    special: bool


@dataclass(frozen=True)
class PrefillEvent:
    """Prompt tokens with their logprobs (only when decoder_input_details was asked), and with
    top_n_tokens also the most likely tokens at each prompt position (empty where none exists)."""

    tokens: tuple[TokenInfo, ...]
    top_tokens: tuple[tuple[TokenInfo, ...], ...] = ()


@dataclass(frozen=True)
class TokenEvent:
    """One generated token. `content` is the user-visible text it releases: special tokens give "",
    and text that may begin a stop string is held back until it is known not to."""

    token: TokenInfo
    top_tokens: tuple[TokenInfo, ...]
    content: str


@dataclass(frozen=True)
class EndEvent:
    """The last event of a request. `generated_text` excludes a matched stop string and special tokens."""

    token: TokenInfo  # the last generated token
    top_tokens: tuple[TokenInfo, ...]
    content: str
    generated_text: str
    finish_reason: FinishReason
    generated_tokens: int
    seed: int | None
    stop_sequence: str | None  # the stop string that ended it (TGI keeps it in the text; OpenAI drops it)
    input_length: int
    queued_s: float  # seconds spent waiting in the queue
    inference_s: float  # seconds from first scheduling to the end
    cached_tokens: int = 0  # prompt tokens whose KV came from the radix cache (the first round's cache_len)
    first_token_s: float = 0.0  # seconds from first scheduling to the first generated token (prefill)
    ended_at: float = 0.0  # time.monotonic() when the request ended


@dataclass(frozen=True)
class ErrorEvent:
    error: TgictlError


StreamEvent = PrefillEvent | TokenEvent | EndEvent | ErrorEvent
