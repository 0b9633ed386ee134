"""One request inside the scheduler, from the moment it is queued until its last event: the router's
only per-request state (docs/architecture.md, "One request's path").

An Entry turns the shard's generations into stream events (incremental text, stop strings: the
router's half of stopping, "Decisions"), and runs the continuation of long generations: a round
generates at most `max_new_tokens_per_round` tokens; when a round ends on length with tokens still
owed, the same Entry goes back to the queue with its output appended to its prompt (ids, not text:
nothing is re-tokenized). A preempted request (its blocks taken back mid-round, docs/architecture.md,
"Scheduling") goes back the same way, as the rest of its round. Its detokenizer, stop matcher, seed,
random stream (the shard's sampling step goes on from `step_offset`) and timings carry over, so the
client sees one seamless stream whatever the number of rounds and preemptions.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tgictl.proto.messages import FinishReason, Generation, Tokens
from tgictl.runtime.router.kv.block_allocator import BlockAllocation
from tgictl.runtime.router.request import (
    EndEvent,
    PrefillEvent,
    StreamEvent,
    TokenEvent,
    TokenInfo,
    ValidatedRequest,
)
from tgictl.runtime.router.text.detokenizer import Decoder, IncrementalDetokenizer
from tgictl.runtime.router.text.stop_sequences import StopSequenceMatcher


class RequestStatus(enum.Enum):
    """Where an entry is in its life (vLLM's request states)."""

    WAITING = "waiting"  # queued and not running: new, or the next round of a long generation
    RUNNING = "running"  # in the shard's batch, holding blocks
    PREEMPTED = "preempted"  # queued again after the scheduler took its blocks back; resumes where it stopped
    FINISHED = "finished"  # ended (its last event sent), or failed


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


def _unwritten_tail(logprobs: Sequence[float]) -> int:
    """Tokens of a generation (one step or several merged) whose KV no step has written yet: the last one
    the model scored (sampled, or the token after accepted drafts) and the forced ones after it, which carry
    a NaN logprob (docs/architecture.md, "Guided generation"); every earlier token was fed to a later step."""
    tail = 1
    for logprob in reversed(logprobs):
        if not math.isnan(logprob):
            return tail
        tail += 1
    return len(logprobs)


class Entry:
    """Owned by the batching task. `request` is what validation produced; `round` is what the current
    round asks of the shard (the prompt plus everything generated so far, after the first round)."""

    def __init__(
        self,
        request: ValidatedRequest,
        send: Callable[[StreamEvent], None],  # delivers an event to the client's stream
        is_cancelled: Callable[[], bool],  # true once the client went away
        max_new_tokens_per_round: int | None = None,  # None: the request's own round size
    ) -> None:
        self.request = request
        self.round = request
        self.send = send
        self.is_cancelled = is_cancelled
        self.queue_time = time.monotonic()
        self.id = -1  # assigned by the queue, anew for every round and resumption
        self.arrival = -1  # the queue's order of first arrival: rounds and resumptions keep it
        self.status = RequestStatus.WAITING
        self.preemptions = 0
        self.batch_time: float | None = None  # first scheduled (every round counts from here)
        self.cached_tokens = 0  # the first round's cache_len: prompt tokens the radix cache supplied
        self.first_token_time: float | None = None  # when the shard returned the first token
        self.allocation: BlockAllocation | None = None
        self.generated_ids: list[int] = []  # across all rounds
        self.finished = False
        self._per_round = max_new_tokens_per_round or request.max_new_tokens
        self._rounds = 0
        self._texts: TokenTexts | None = None
        self._detokenizer: IncrementalDetokenizer | None = None
        self._stops = StopSequenceMatcher(request.stop_sequences)
        self._content: list[str] = []
        self._round_tokens = 0  # generated in the current round
        self._unwritten = 0  # trailing generated tokens whose KV no step has written yet (_unwritten_tail)
        self._continues = False

    def start(self, texts: TokenTexts) -> None:
        """The batcher schedules this entry (again): reset what a round counts."""
        if self._detokenizer is None:
            self._texts = texts
            self._detokenizer = IncrementalDetokenizer(texts.decoder, self.request.input_ids)
        self._round_tokens = 0
        self._continues = False

    @property
    def priority(self) -> int:
        return self.request.priority

    @property
    def context_len(self) -> int:
        """Tokens of the round's sequence so far (its prompt, then what it generated): the KV positions its
        next step writes end at context_len - 1, so its blocks must hold context_len of them."""
        return self.round.input_length + self._round_tokens

    @property
    def written_len(self) -> int:
        """KV positions a step has written so far: the next forward's first query is at this position."""
        return self.context_len - self._unwritten

    @property
    def max_context_len(self) -> int:
        """The most KV positions the round ever writes: its prompt and all its tokens but the last."""
        return self.round.input_length + self.round.max_new_tokens - 1

    @property
    def prompt_computed(self) -> bool:
        """True once the shard produced a token this round: all of the round's prompt KV exists."""
        return self._round_tokens > 0

    @property
    def continues(self) -> bool:
        """The round ended on length with tokens still owed: the batcher queues the next round."""
        return self._continues

    def on_generation(self, generation: Generation) -> None:
        """Route one generation to the client; sets `finished` when the request ended, or
        `continues` when only this round did."""
        texts, detokenizer = self._texts, self._detokenizer
        assert texts is not None and detokenizer is not None, "start() comes first"
        send = self.send
        if generation.prefill_tokens is not None and not self.generated_ids:
            tops = tuple(texts.infos(t) for t in generation.prefill_top_tokens)
            send(PrefillEvent(tokens=texts.infos(generation.prefill_tokens), top_tokens=tops))
        tokens = generation.tokens
        if tokens.ids:
            self._unwritten = _unwritten_tail(tokens.logprobs)
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()
        for index, (token_id, logprob) in enumerate(zip(tokens.ids, tokens.logprobs)):
            self.generated_ids.append(token_id)
            self._round_tokens += 1
            top = texts.infos(generation.top_tokens[index]) if generation.top_tokens else ()
            piece = detokenizer.add(token_id)
            token = texts.info(token_id, logprob, piece)
            check = self._stops.feed(piece, visible=not token.special)
            self._content.append(check.emit)
            last = index == len(tokens.ids) - 1
            if check.matched is not None:
                self._end(token, top, check.emit, FinishReason.STOP_SEQUENCE, check.matched)
                return
            done = generation.generated_text if last else None
            if done is not None and self._next_round_budget(done.finish_reason) > 0:
                self._continues = True  # this round's last token is an ordinary token of the one stream
            elif done is not None:
                tail = self._stops.feed(detokenizer.flush()).emit + self._stops.flush()
                self._content.append(tail)
                self._end(token, top, check.emit + tail, done.finish_reason, None)
                return
            send(TokenEvent(token=token, top_tokens=top, content=check.emit))

    def _next_round_budget(self, reason: FinishReason) -> int:
        if reason != FinishReason.LENGTH:
            return 0
        return min(self.request.total_new_tokens - len(self.generated_ids), self._per_round)

    def next_round(self) -> None:
        """Become the next round's request (see `_go_on`) with the next round's budget."""
        self._rounds += 1
        self._go_on(self._next_round_budget(FinishReason.LENGTH))
        self.status = RequestStatus.WAITING
        self._continues = False

    def preempt(self) -> None:
        """The scheduler took this entry's blocks back mid-round: become the rest of the round (see `_go_on`).
        Before its first token the round is simply run again (prompt logprobs included, if asked)."""
        if self._round_tokens:
            self._go_on(self.round.max_new_tokens - self._round_tokens)
        self.status = RequestStatus.PREEMPTED
        self.preemptions += 1

    def _go_on(self, max_new_tokens: int) -> None:
        """The request from here on: the output so far joins the prompt (ids, nothing re-tokenized); prompt
        logprobs were sent already; the shard's random stream goes on at the step after the tokens so far
        (it is keyed by (seed, step)), so a seeded request samples what it would have sampled in one go; a
        grammar's matcher is replayed over them."""
        original = self.request
        generated = len(self.generated_ids)
        sampling = dataclasses.replace(original.sampling, step_offset=generated)
        if sampling.grammar is not None:  # the shard's new matcher replays what was generated so far
            sampling = dataclasses.replace(sampling, grammar=dataclasses.replace(sampling.grammar, replay_tokens=generated))
        self.round = dataclasses.replace(
            original,
            input_ids=original.input_ids + tuple(self.generated_ids),
            sampling=sampling,
            max_new_tokens=max_new_tokens,
            max_total_new_tokens=None,
            decoder_input_details=False,
        )

    def _end(
        self, token: TokenInfo, top: Sequence[TokenInfo], content: str, reason: FinishReason, stop: str | None
    ) -> None:
        now = time.monotonic()
        started = self.batch_time if self.batch_time is not None else now
        self.finished = True
        self.status = RequestStatus.FINISHED
        sampling = self.request.sampling
        self.send(
            EndEvent(
                token=token,
                top_tokens=tuple(top),
                content=content,
                generated_text="".join(self._content),
                finish_reason=reason,
                generated_tokens=len(self.generated_ids),
                seed=sampling.seed if sampling.samples else None,
                stop_sequence=stop,
                input_length=self.request.input_length,
                queued_s=started - self.queue_time,
                inference_s=now - started,
                cached_tokens=self.cached_tokens,
                first_token_s=(self.first_token_time or now) - started,
                ended_at=now,
            )
        )

    def computed_tokens(self, resumes: bool = False) -> tuple[int, ...] | None:
        """Tokens whose KV is known to be complete: what the prefix cache may publish. The round's
        prompt once the shard produced a token; when the request goes on (the round ended with tokens
        still owed, or `resumes`: the scheduler preempts it) also every generated token whose KV a step
        wrote (all but the last generation's sampled token and the tokens a grammar forced after it,
        which only the next forward would write), so that the next round's prefill finds them cached."""
        if not self.prompt_computed:
            return None
        if self._continues or resumes:
            written = len(self.generated_ids) - self._unwritten
            return self.request.input_ids + tuple(self.generated_ids[:written])
        return self.round.input_ids
