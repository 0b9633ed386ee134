"""Per-request decoding state in the batcher: turns shard generations into stream events.

The shard stops on EOS and max_new_tokens; the router stops on stop strings (DESIGN decision 2).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from tgictl.proto.messages import FinishReason, Generation, Tokens
from tgictl.runtime.router.detokenizer import Decoder, IncrementalDetokenizer
from tgictl.runtime.router.queue import Entry
from tgictl.runtime.router.request import EndEvent, PrefillEvent, TokenEvent, TokenInfo
from tgictl.runtime.router.stop_sequences import StopSequenceMatcher


@dataclass(frozen=True)
class TokenTexts:
    """How the router names tokens: the tokenizer plus its special ids."""

    decoder: Decoder
    special_ids: frozenset[int]

    def info(self, token_id: int, logprob: float, text: str | None = None) -> TokenInfo:
        if text is None:
            text = self.decoder.decode([token_id], skip_special_tokens=False)
        return TokenInfo(id=token_id, text=text, logprob=logprob, special=token_id in self.special_ids)

    def infos(self, tokens: Tokens) -> tuple[TokenInfo, ...]:
        return tuple(self.info(i, lp) for i, lp in zip(tokens.ids, tokens.logprobs))


class RequestState:
    """Everything the router tracks for one in-flight request."""

    def __init__(self, entry: Entry, texts: TokenTexts) -> None:
        self.entry = entry
        self._texts = texts
        self._detokenizer = IncrementalDetokenizer(texts.decoder, entry.request.input_ids)
        self._stops = StopSequenceMatcher(entry.request.stop_sequences)
        self._content: list[str] = []
        self.generated_tokens = 0
        self.prompt_computed = False  # true once the shard has produced a token: all prompt KV exists
        self.finished = False

    def on_generation(self, generation: Generation) -> None:
        """Route one generation to the client; sets `finished` when the request ended."""
        self.prompt_computed = True
        send = self.entry.send
        if generation.prefill_tokens is not None and self.generated_tokens == 0:
            send(PrefillEvent(tokens=self._texts.infos(generation.prefill_tokens)))
        tokens = generation.tokens
        for index, (token_id, logprob) in enumerate(zip(tokens.ids, tokens.logprobs)):
            self.generated_tokens += 1
            top = self._texts.infos(generation.top_tokens[index]) if generation.top_tokens else ()
            piece = self._detokenizer.add(token_id)
            token = self._texts.info(token_id, logprob, piece)
            visible = "" if token.special else piece
            check = self._stops.feed(visible)
            self._content.append(check.emit)
            last = index == len(tokens.ids) - 1
            if check.matched is not None:
                self._end(token, top, check.emit, FinishReason.STOP_SEQUENCE, None, check.matched)
                return
            if last and generation.generated_text is not None:
                done = generation.generated_text
                tail = self._stops.feed(self._detokenizer.flush()).emit + self._stops.flush()
                self._content.append(tail)
                self._end(token, top, check.emit + tail, done.finish_reason, done.seed, None)
                return
            send(TokenEvent(token=token, top_tokens=top, content=check.emit))

    def _end(
        self,
        token: TokenInfo,
        top: Sequence[TokenInfo],
        content: str,
        reason: FinishReason,
        seed: int | None,
        stop: str | None,
    ) -> None:
        entry = self.entry
        now = time.monotonic()
        started = entry.batch_time if entry.batch_time is not None else now
        self.finished = True
        entry.send(
            EndEvent(
                token=token,
                top_tokens=tuple(top),
                content=content,
                generated_text="".join(self._content),
                finish_reason=reason,
                generated_tokens=self.generated_tokens,
                seed=seed if seed is not None else _seed_of(entry),
                stop_sequence=stop,
                input_length=entry.request.input_length,
                queued_s=started - entry.queue_time,
                inference_s=now - started,
            )
        )

    def computed_prompt(self) -> tuple[int, ...] | None:
        """Prompt ids whose KV is known to be complete: what the prefix cache may publish."""
        return self.entry.request.input_ids if self.prompt_computed else None


def _seed_of(entry: Entry) -> int | None:
    sampling = entry.request.sampling
    return sampling.seed if sampling.samples else None

