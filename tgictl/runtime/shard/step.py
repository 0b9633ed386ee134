"""One generation step for a mixed batch: forward, vectorised sampling, stopping, generations.

`generate_token` follows TGI's outline (TGI's FlashCausalLM.generate_token) for a batch whose rows may be prefilling a
prompt chunk or decoding: one forward over every row's new tokens; the chooser picks a token for
every row at once; rows still prefilling discard theirs (and, because a row's sampling step is its
count of emitted tokens, no random draw is used up); the others count it, check stopping and emit a
Generation. Afterwards the rows advance and the next chunk sizes are chosen within the prefill budget.

Constrained rows (docs/architecture.md, "Guided generation"): their masks are computed in a worker
thread while the forward runs and applied inside the chooser; after sampling, a row whose grammar
allows exactly one continuation appends those tokens too (forced tokens), within its max_new_tokens,
and the next forward computes their K/V together with the row's next token, like a small chunk.

Speculative decoding (docs/architecture.md, "Speculative decoding"): after a step, decoding rows may get
n-gram drafts; the next forward computes them after the row's pending token and scores every position,
the chooser picks each position's token as the plain path would (speculation/verify.py), and the row
keeps the drafts that match plus the token chosen after them. K/V written for rejected drafts lies past
the new cache_len, in the row's own slots, and is overwritten by the next forward.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import Tensor

from tgictl.config import SpeculationConfig
from tgictl.errors import ConfigError
from tgictl.kernels.metadata import AttentionMetadata
from tgictl.proto.messages import (
    FinishReason,
    GeneratedText,
    Generation,
    Timings,
    Tokens,
)
from tgictl.runtime.shard.batch import RowState, ShardBatch, StepInputs
from tgictl.runtime.shard.chunking import next_chunk_lengths
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.kv_cache import KVCache
from tgictl.runtime.shard.models.base import CausalLM
from tgictl.runtime.shard.sampling.grammar import GrammarCompiler, GrammarFailure, MaskJob, advance, failure_text
from tgictl.runtime.shard.sampling.sampler import TokenHistory, top_n_tokens
from tgictl.runtime.shard.sampling.stopping import finish_reason
from tgictl.runtime.shard.speculation.drafter import Drafter, RowDrafter, batch_drafts
from tgictl.runtime.shard.speculation.verify import accepted_length, expand

# Prompt positions scored per LM head call and log-softmax (see ModelRunner._prompt_logprobs). 128 against 512:
# the bf16 shard's peak RSS during warmup (4,096 prompt tokens) ~100 MiB lower, warmup no slower (4.8-5.9 s
# against 6.0-6.2 s, SmolLM2 on 2 cores).
PROMPT_LOGPROB_ROWS = 128


class ModelRunner:
    """Runs steps of `ShardBatch`es on one rank's model and KV cache."""

    def __init__(
        self,
        model: CausalLM,
        kv_cache: KVCache,
        *,
        block_size: int,
        dist: DistContext,
        device: torch.device,
        grammars: GrammarCompiler | None = None,
        forced_tokens: bool = True,
        num_adapters: int = 0,
    ) -> None:
        if kv_cache.block_size != block_size:
            raise ConfigError(f"KV cache block_size {kv_cache.block_size} != runner block_size {block_size}")
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.dist = dist
        self.device = device
        self.vocab_size: int = model.config.vocab_size
        self.eos_token_ids = frozenset(model.config.eos_token_ids)
        self.max_prefill_tokens: int | None = None  # None: a prompt is computed in one forward
        self.grammars = grammars  # None: grammars are refused
        self.forced_tokens = forced_tokens  # False: forced tokens are sampled one step each (measurements)
        self.last_masks: MaskJob | None = None  # the last step's mask job, for its timings (scripts)
        self.num_adapters = num_adapters  # LoRA adapters attached to the model's linears
        self.speculation = SpeculationConfig()  # off until set_speculation
        self.new_drafter: Callable[[RowState], Drafter] = lambda row: RowDrafter.create(self.speculation)

    def set_speculation(self, config: SpeculationConfig) -> None:
        """Draft and verify n-gram tokens from now on (config.tokens = 0: off)."""
        self.speculation = config

    def set_max_prefill_tokens(self, tokens: int | None) -> None:
        """The per-forward token budget later chunks are sized within (TGI's set_max_prefill_tokens)."""
        if tokens is not None and tokens < 1:
            raise ConfigError(f"max_prefill_tokens must be >= 1, got {tokens}")
        self.max_prefill_tokens = tokens

    def forward_hidden(self, inputs: StepInputs) -> Tensor:
        """The final hidden states [n, H] at `inputs.logit_indices` (`model.logits` of them are the logits);
        writes the new tokens' K/V."""
        meta = AttentionMetadata.build(
            inputs.cache_lens, inputs.new_lens, inputs.block_tables, self.block_size, self.device
        )
        with torch.inference_mode():
            return self.model.forward_hidden(
                inputs.input_ids, inputs.positions, inputs.slots, self.kv_cache, meta, inputs.logit_indices,
                inputs.adapters,
            )

    def generate_token(self, batch: ShardBatch) -> tuple[list[Generation], ShardBatch | None, Timings]:
        start = time.perf_counter_ns()
        inputs = batch.step_inputs(self.device, self.num_adapters)
        rows = batch.rows
        emits = [row.cache_len + row.chunk_len >= row.prompt_len for row in rows]
        constrained = [(row.matcher, b) for b, row in enumerate(rows) if row.matcher is not None and emits[b]]
        masks = MaskJob(self.grammars, constrained, len(rows)) if constrained and self.grammars else None
        self.last_masks = masks
        hidden = self.forward_hidden(inputs)  # [n, H]; the masks are computed meanwhile
        # With prompt logprobs most rows are prompt rows: those get their logits a slice at a time in
        # _prompt_logprobs, never all at once (4,096 prompt tokens: 0.4 GB of bf16 logits).
        sampled = hidden if inputs.sample_rows is None else hidden.index_select(0, inputs.sample_rows)
        sample_logits = self.model.logits(sampled)
        # A row's sampling step is its count of emitted tokens (earlier rounds' included: step_offset), so a
        # discarded chunk token reuses it.
        generated = [row.sampling_step for row in rows]
        allowed = masks.allowed(self.vocab_size, self.device) if masks is not None else None
        for matcher, b in constrained:  # a matcher that hit a parser limit computing its mask: that row ends
            if matcher.is_error():
                rows[b].failure = failure_text("the grammar engine stopped", matcher.get_error())
        chooser, history = batch.chooser, batch.history
        starts = list(range(len(rows)))  # each row's first scored position
        if inputs.sample_counts is None:
            steps = torch.tensor(generated, dtype=torch.int64, device=self.device)
        else:  # some rows verify drafts: one chooser row per scored position
            expansion = expand(chooser, history, generated, [row.draft for row in rows], self.device)
            chooser, history, steps, starts = expansion.chooser, expansion.history, expansion.steps, expansion.starts
            allowed = allowed.index_select(0, expansion.row_of) if allowed is not None else None
        # Every rank computes every row; only rank 0 reports (generate.proto), so only it needs the
        # top-n lists and prompt logprobs. The others keep the rows' state in step.
        reports = self.dist.rank == 0
        top_n = [row.request.top_n_tokens if emit else 0 for row, emit in zip(rows, emits)]
        wants_top = reports and any(top_n)
        with torch.inference_mode():
            chosen = chooser(sample_logits, history, steps, allowed, distribution=wants_top)
        top = None
        if wants_top and chosen.log_probs is not None:  # one count per scored position (drafts included)
            per_position = [n for n, row in zip(top_n, rows) for _ in range(1 + len(row.draft))]
            top = top_n_tokens(chosen.log_probs, per_position)
        prompt_lps, prompt_tops = self._prompt_logprobs(hidden, inputs, rows, reports)
        next_ids: list[int] = chosen.next_ids.tolist()  # waits for the device: the forward ends here
        next_lps: list[float] = chosen.logprobs.tolist()
        forward_done = time.perf_counter_ns()

        first_ids = chosen.next_ids
        if inputs.sample_counts is not None:
            first_ids = first_ids.index_select(0, torch.tensor(starts, dtype=torch.int64, device=self.device))
        _count_emitted(batch.history, first_ids, emits)
        generations: list[Generation] = []
        finished: list[int] = []  # batch rows that stopped this step
        for b, row in enumerate(rows):
            if b in prompt_lps:
                row.prompt_logprobs.extend(prompt_lps[b])  # type: ignore[union-attr]
            if b in prompt_tops:
                row.prompt_top.extend(prompt_tops[b])  # type: ignore[union-attr]
            at, draft = starts[b], row.draft
            accepted = accepted_length(next_ids[at : at + len(draft)], draft) if draft else 0
            scored = 1 + accepted  # tokens the model chose this step: the accepted drafts and one more
            row.cache_len += row.chunk_len - (len(draft) - accepted)  # rejected drafts' K/V is stale
            if draft:
                row.draft = []
                if row.drafter is not None:
                    row.drafter.record(len(draft), accepted, self.speculation)
            stopping = row.request.stopping
            tokens = next_ids[at : at + scored]
            if row.matcher is not None and row.failure is None and emits[b]:
                limit = stopping.max_new_tokens - row.generated - 1 if self.forced_tokens else 0
                try:
                    tokens += advance(row.matcher, tokens[0], limit, self.eos_token_ids)
                except GrammarFailure as failure:
                    row.failure = str(failure)
            if row.failure is not None:  # this request ends here, with its error; the batch goes on
                finished.append(b)
                if reports:
                    generations.append(Generation(request_id=row.request.id, tokens=Tokens(), error=row.failure))
                continue
            if not emits[b]:
                continue
            first = row.generated == 0
            reason = None
            count = 0
            for token in tokens:  # stop at the first token that ends the request
                row.generated += 1
                row.all_ids.append(token)
                count += 1
                reason = finish_reason(
                    row.generated, token, stopping.max_new_tokens, stopping.ignore_eos, self.eos_token_ids
                )
                if reason is not None:
                    break
            if count > 1:
                _count_following(batch.history, b, row.all_ids[-count + 1 :])
            if reason is not None:
                finished.append(b)
            if reports:
                kept = min(count, scored)  # tokens the model scored; the rest were forced
                logprobs = next_lps[at : at + kept] + [float("nan")] * (count - kept)
                top_tokens: tuple[Tokens, ...] = ()
                if top is not None and top_n[b]:
                    top_tokens = tuple(_tokens(top[at + i]) for i in range(kept)) + (Tokens(),) * (count - kept)
                generations.append(_generation(row, logprobs, first, top_tokens, reason, len(draft), accepted))
        next_batch = _without_rows(batch, finished)
        if next_batch is not None:
            progress = [(row.prompt_len, row.cache_len) for row in next_batch.rows]
            pending = [row.pending for row in next_batch.rows]  # 1 + the tokens a grammar forced
            lengths = next_chunk_lengths(progress, self.max_prefill_tokens, pending)
            for row, length in zip(next_batch.rows, lengths):
                row.chunk_len = length
            if self.speculation.tokens:
                self._draft(next_batch.rows)
        end = time.perf_counter_ns()
        timings = Timings(forward_ns=forward_done - start, decode_ns=end - forward_done, total_ns=end - start)
        return generations, next_batch, timings

    def _draft(self, rows: list[RowState]) -> None:
        """Give decoding rows their drafts for the next forward, within their max_new_tokens and their
        blocks (a draft's K/V is written at the positions after the pending token: only where the row
        holds blocks, docs/architecture.md, "Memory model")."""
        config = self.speculation
        decoding = [row for row in rows if row.chunk_len == row.pending == 1 and not row.prefilling]
        if not batch_drafts(config, len(decoding)):
            return
        for row in decoding:
            if row.matcher is not None:  # a grammar's rows get forced tokens instead
                continue
            room = row.capacity - len(row.all_ids)  # positions after the pending token's inside the blocks
            limit = min(config.tokens, row.request.stopping.max_new_tokens - row.generated - 1, room)
            if limit < 1:
                continue
            if row.drafter is None:
                row.drafter = self.new_drafter(row)
            row.draft = row.drafter.propose(row.all_ids, limit)
            row.chunk_len = 1 + len(row.draft)

    def _prompt_logprobs(
        self, hidden: Tensor, inputs: StepInputs, rows: list[RowState], reports: bool
    ) -> tuple[dict[int, list[float]], dict[int, list[tuple[list[int], list[float]]]]]:
        """Raw-logit log-probabilities of each next prompt token, for rows that asked (TGI's FlashCausalLM.generate_token, prefill logprobs),
        and, for rows that also asked for top_n_tokens, the most likely tokens at those positions.

        Logit row j of a chunk starting at position c predicts prompt token c + j + 1; the last row of
        the prompt's final chunk predicts the first generated token instead and is left out.
        hidden: `forward_hidden`'s rows. Every rank runs the LM head on the same slices (its collectives);
        only a rank that `reports` computes the scores (empty results elsewhere).
        """
        if not inputs.prompt_spans:
            return {}, {}
        logit_rows: list[int] = []
        targets: list[int] = []
        counts: dict[int, int] = {}
        for b, first, n in inputs.prompt_spans:
            row = rows[b]
            stop = min(row.cache_len + n, row.prompt_len - 1)  # last predicted prompt position + 1
            count = stop - row.cache_len
            logit_rows.extend(range(first, first + count))
            targets.extend(row.all_ids[row.cache_len + 1 : stop + 1])
            counts[b] = count
        top_n = [rows[b].request.top_n_tokens for b, count in counts.items() for _ in range(count)]
        flat: list[float] = []
        tops: list[tuple[list[int], list[float]]] | None = [] if any(top_n) else None
        # [m, H] -> [m]: only the chosen column survives, but log_softmax needs the whole row; in
        # slices, so a long prompt's scores take a slice's [PROMPT_LOGPROB_ROWS, V] (logits, then their
        # log_softmax), not [m, V] (4,096 prompt tokens: 0.4 GB of bf16 logits, 0.8 GB in float32).
        for at in range(0, len(logit_rows), PROMPT_LOGPROB_ROWS):
            part = slice(at, at + PROMPT_LOGPROB_ROWS)
            index = torch.tensor(logit_rows[part], dtype=torch.int64, device=hidden.device)
            logits = self.model.logits(hidden.index_select(0, index))
            if not reports:
                continue
            target = torch.tensor(targets[part], dtype=torch.int64, device=hidden.device)
            log_probs = torch.log_softmax(logits.float(), dim=-1)
            flat.extend(log_probs.gather(1, target[:, None])[:, 0].tolist())
            # Top-n lists come from the same tensor, so a prompt token that is the most likely one has
            # exactly its top entry's logprob (evaluation harnesses compare them for equality).
            if tops is not None:
                tops.extend(top_n_tokens(log_probs, top_n[part]))
        if not reports:
            return {}, {}
        out: dict[int, list[float]] = {}
        out_top: dict[int, list[tuple[list[int], list[float]]]] = {}
        at = 0
        for b, count in counts.items():
            out[b] = flat[at : at + count]
            if tops is not None and rows[b].prompt_top is not None:
                out_top[b] = tops[at : at + count]
            at += count
        return out, out_top

    def health(self) -> bool:
        """A real one-token forward writing only block 0 (reserved for probes, docs/architecture.md, "Decisions": The router owns memory)."""
        zeros = torch.zeros(1, dtype=torch.int64, device=self.device)
        meta = AttentionMetadata.build([0], [1], [[0]], self.block_size, self.device)
        with torch.inference_mode():
            logits = self.model.forward(zeros, zeros, zeros, self.kv_cache, meta, zeros)
        return bool(torch.isfinite(logits).all().item())


def _without_rows(batch: ShardBatch, finished: list[int]) -> ShardBatch | None:
    """The batch minus the rows that stopped this step; None when none is left.

    Finished rows leave on the shard, so the cached batch never holds a request that cannot take
    another step (a Decode of one would overrun its slots), and the router needs no FilterBatch round
    trip when the only change is a request that stopped on EOS or max_new_tokens.
    """
    if not finished:
        return batch
    if len(finished) == batch.size:
        return None
    gone = set(finished)
    return batch.filter([row.request.id for b, row in enumerate(batch.rows) if b not in gone])


def _generation(
    row: RowState,
    logprobs: list[float],
    first: bool,
    top_tokens: tuple[Tokens, ...],
    reason: FinishReason | None,
    drafted: int,
    accepted: int,
) -> Generation:
    """What `row` reports for the tokens it just appended to all_ids (one per entry of `logprobs`):
    those the model chose (the sampled one, or the accepted drafts and the one after them), then any
    its grammar forced (NaN logprob, no top tokens: the model never scored them)."""
    request = row.request
    prefill = None
    prefill_top: tuple[Tokens, ...] = ()
    if first and row.prompt_logprobs is not None:
        prefill = Tokens(ids=request.input_ids, logprobs=tuple(row.prompt_logprobs))
        if row.prompt_top is not None:
            prefill_top = tuple(_tokens(entry) for entry in row.prompt_top)
    done = None
    if reason is not None:
        seed = request.sampling.seed if request.sampling.samples else None
        done = GeneratedText(generated_tokens=row.generated, finish_reason=reason, seed=seed)
    count = len(logprobs)
    return Generation(
        request_id=request.id,
        tokens=Tokens(ids=tuple(row.all_ids[-count:]), logprobs=tuple(logprobs)),
        prefill_tokens=prefill,
        top_tokens=top_tokens,
        generated_text=done,
        prefill_top_tokens=prefill_top,
        draft_tokens=drafted,
        accepted_tokens=accepted,
    )


def _count_emitted(history: TokenHistory, next_ids: Tensor, emits: list[bool]) -> None:
    """Add the emitted tokens to the penalty counts; a discarded chunk token is not part of the text."""
    if all(emits):
        history.append(next_ids)
    elif history.counts is not None and any(emits):
        # TokenHistory.append has no row mask, so the partial update goes to its counts directly.
        rows = torch.tensor([b for b, emit in enumerate(emits) if emit], dtype=torch.int64, device=history.device)
        history.counts[rows, next_ids.index_select(0, rows)] += 1.0


def _count_following(history: TokenHistory, row: int, tokens: list[int]) -> None:
    """The tokens a row appended after its first one this step (accepted drafts and the token after
    them, or forced tokens) are part of the text: the penalties count them like sampled ones."""
    if history.counts is None:
        return
    for token in tokens:
        history.counts[row, token] += 1.0


def _tokens(entry: tuple[list[int], list[float]]) -> Tokens:
    ids, logprobs = entry
    return Tokens(ids=tuple(ids), logprobs=tuple(logprobs))

