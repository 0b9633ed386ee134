"""OpenAI's legacy completions shapes: the `logprobs` object and `echo`, as vLLM answers them.

`echo` puts the prompt before the completion, in the text and in the logprobs: one entry per prompt
token, the first with null logprob and null top_logprobs (nothing predicts it). The prompt's logprobs
are TGI's prompt logprobs (decoder_input_details), so an echoed prompt is computed in full, never
taken from the prefix cache. `max_tokens: 0` with echo returns the prompt alone: the one token the
shard must generate to end the request is dropped. Evaluation harnesses (lm-evaluation-harness's
`local-completions`) score a continuation this way: they send context + continuation as token ids with
`echo`, `logprobs: 1` and `max_tokens: 1`, sum the continuation's token_logprobs and check it was the
greedy choice by comparing each token's logprob with the largest in its top_logprobs, so every dict
also holds the token itself (OpenAI: up to logprobs + 1 entries), with the very same float.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tgictl.errors import ValidationError
from tgictl.runtime.router.http.outcome import OPENAI_FINISH_REASONS, Outcome
from tgictl.runtime.router.http.schemas_openai import CompletionRequest
from tgictl.runtime.router.request import TokenInfo


def _top_dict(token: TokenInfo, top: Sequence[TokenInfo]) -> dict[str, float]:
    """Texts are the keys, and different tokens can share one (partial UTF-8 decodes to U+FFFD):
    the most likely keeps the key, so the largest value stays the best token's."""
    entries: dict[str, float] = {}
    for t in top:  # most likely first
        entries.setdefault(t.text, t.logprob)
    entries.setdefault(token.text, token.logprob)
    return entries


def legacy_logprobs(
    tokens: Sequence[TokenInfo], tops: Sequence[Sequence[TokenInfo]], offset: int, *, unknown_first: bool = False
) -> dict[str, Any]:
    """`unknown_first`: the first token is the prompt's first, which has no logprob (null, and null
    top_logprobs, as vLLM)."""
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token.text)
    top_logprobs: list[dict[str, float] | None] = [_top_dict(t, top) for t, top in zip(tokens, tops)]
    if unknown_first and top_logprobs:
        top_logprobs[0] = None
    return {
        "tokens": [t.text for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],  # NaN (the first prompt token) is sent as null
        "top_logprobs": top_logprobs,
        "text_offset": offsets,
    }


@dataclass(frozen=True)
class CompletionShape:
    """What one /v1/completions body asks of every choice's response."""

    echo: bool
    logprobs: int | None
    prompt_only: bool  # max_tokens 0 with echo: the generated token is dropped

    @classmethod
    def of(cls, body: CompletionRequest) -> CompletionShape:
        if body.suffix is not None:
            raise ValidationError("`suffix` is not supported")
        if body.echo and body.stream:
            raise ValidationError("`echo` is not supported when streaming")
        if body.logprobs is not None and body.logprobs < 0:
            raise ValidationError(f"`logprobs` must be >= 0. Given: {body.logprobs}")
        return cls(echo=body.echo, logprobs=body.logprobs, prompt_only=body.echo and body.max_tokens == 0)

    @property
    def max_new_tokens_delta(self) -> int:
        """max_tokens 0 with echo still needs one token generated to end the request."""
        return 1 if self.prompt_only else 0

    @property
    def prompt_logprobs(self) -> bool:
        return self.echo and self.logprobs is not None

    def completion_tokens(self, generated: int) -> int:
        return 0 if self.prompt_only else generated

    def choice(self, index: int, prompt_text: str, outcome: Outcome) -> dict[str, Any]:
        end = outcome.end
        tokens = [] if self.prompt_only else list(outcome.tokens)
        tops = [] if self.prompt_only else list(outcome.top_tokens)
        text = "" if self.prompt_only else end.generated_text
        logprobs = None
        if self.logprobs is not None and self.echo:
            prompt_tops = list(outcome.prefill_top) or [()] * len(outcome.prefill)
            logprobs = legacy_logprobs(list(outcome.prefill) + tokens, prompt_tops + tops, 0, unknown_first=True)
        elif self.logprobs is not None:
            logprobs = legacy_logprobs(tokens, tops, 0)
        return {
            "index": index,
            "text": (prompt_text if self.echo else "") + text,
            "logprobs": logprobs,
            "finish_reason": "length" if self.prompt_only else OPENAI_FINISH_REASONS[end.finish_reason],
        }
