"""The shard's batch between steps: per-request progress plus the batch's sampling state.

A `ShardBatch` is built once from the router's `messages.Batch` and then lives across steps under its
id. Each row carries what the next forward needs: the tokens seen so far, where its K/V goes (the
router's blocks, docs/architecture.md, "Decisions": The router owns memory: the request's, then the ones
later calls grant; slot = block * block_size + offset), how many tokens are already in the cache and how many
the next forward computes. A row never writes past its blocks: a step runs only while every row's next
positions fit (`fits_next_step`), and drafts are cut to the room left. A row is *prefilling* while part of its prompt has no K/V yet; it then
computes `chunk_len` prompt tokens per step (chunked prefill) and emits nothing until the prompt is
done. Afterwards it decodes one token per step.

`filter` and `concatenate` consume their inputs (rows are moved, not copied), as TGI's do: the
servicer pops a batch from its cache before either call.

Per-step inputs are packed from the rows each step rather than kept as device tensors updated in
place (TGI's way): a decode step packs O(batch) integers (about 0.15 ms at batch 32, measured), and
the step must bring the sampled ids to the host anyway for stopping, so there is no sync to save.
Nothing that grows with the context (block tables, prompts) is re-packed at decode time except the
block tables the attention metadata is built from.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from tgictl.errors import InvalidRequestError
from tgictl.kernels.lora import StepAdapters, group_tokens
from tgictl.kv_groups import KvGroups
from tgictl.proto.messages import Batch, BlockGrant, CachedBatch, Request
from tgictl.runtime.shard.sampling.grammar import GrammarCompiler, GrammarFailure, Matcher
from tgictl.runtime.shard.sampling.sampler import (
    NextTokenChooser,
    TokenHistory,
    needs_history,
)
from tgictl.runtime.shard.speculation.drafter import Drafter


@dataclass(eq=False, slots=True)
class RowState:
    """One request's progress. Mutated by the model runner after every step."""

    request: Request
    all_ids: list[int]  # prompt + generated tokens, in order
    cache_len: int  # positions 0 .. cache_len - 1 have K/V in the cache
    chunk_len: int  # tokens the next forward computes (1 once decoding)
    blocks: list[int]  # the request's blocks, then every granted one, in sequence order
    capacity: int  # positions the blocks hold: len(blocks) * block_size
    generated: int = 0  # tokens emitted so far (also the request's sampling step)
    # Prompt logprobs gathered over the chunks, when the request asked for them (NaN where none exists).
    prompt_logprobs: list[float] | None = None
    # With prompt logprobs and top_n_tokens: the top tokens per prompt position (empty where none exists).
    prompt_top: list[tuple[list[int], list[float]]] | None = None
    # The request's grammar state, advanced over every token it emits; None = unconstrained.
    matcher: Matcher | None = None
    # Draft tokens the next forward verifies after the pending one (speculative decoding); their K/V
    # is written at the positions that follow, and only the accepted ones advance cache_len.
    draft: list[int] = field(default_factory=list)
    drafter: Drafter | None = None  # where this row's drafts come from; None until it first decodes with drafts
    # Why this request ends at its next step (its grammar failed; Generation.error); None while all is well.
    failure: str | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.request.input_ids)

    @property
    def sampling_step(self) -> int:
        """The step its next token is drawn at: the request's tokens so far, earlier rounds included."""
        return self.request.sampling.step_offset + self.generated

    @property
    def fits_next_step(self) -> bool:
        """The next forward writes positions cache_len .. len(all_ids) + len(draft) - 1: all inside the blocks."""
        return len(self.all_ids) + len(self.draft) <= self.capacity

    def add_blocks(self, blocks: Sequence[int], block_size: int) -> None:
        self.blocks.extend(blocks)
        self.capacity = len(self.blocks) * block_size

    def slot(self, position: int, block_size: int) -> int:
        return self.blocks[position // block_size] * block_size + position % block_size

    @property
    def prefilling(self) -> bool:
        return self.cache_len < self.prompt_len

    @property
    def pending(self) -> int:
        """Tokens without K/V yet: the rest of the prompt, or 1 + the tokens a grammar forced."""
        return len(self.all_ids) - self.cache_len

    @property
    def wants_prompt_logprobs(self) -> bool:
        """This step computes prompt logprobs for this row (all positions of its chunk need logits)."""
        return self.prompt_logprobs is not None and self.prefilling


@dataclass(frozen=True, eq=False)
class StepInputs:
    """Everything one forward needs, packed from the rows (T = tokens this step, n = logit rows)."""

    input_ids: Tensor  # [T] int64
    positions: Tensor  # [T] int64
    slots: Tensor  # [T] int64 flat KV slots the new tokens write
    logit_indices: Tensor  # [n] int64 rows of the hidden states that get logits
    # [E] rows of the logits the chooser reads: one per request, or 1 + its draft length for a row
    # verifying drafts (sample_counts); None when they are exactly 0 .. B-1.
    sample_rows: Tensor | None
    # For the attention metadata, one entry per attended sequence: [B], or more when rows verify
    # drafts (each of their tokens is a decode sequence of its own, ShardBatch._attention_layout).
    cache_lens: list[int]
    new_lens: list[int]
    block_tables: list[list[int]]
    # Prompt logprobs: (batch row, first logit row, count) per row that computes them this step.
    prompt_spans: list[tuple[int, int, int]] = field(default_factory=list)
    # [B] logit rows each request samples from (1 + its draft length); None: one each.
    sample_counts: list[int] | None = None
    # The tokens grouped by LoRA adapter; None when no row uses one (docs/architecture.md, "Multi-LoRA").
    adapters: StepAdapters | None = None


def _check_request(
    request: Request, block_size: int, num_blocks: int, vocab_size: int, num_adapters: int, groups: KvGroups | None
) -> None:
    """Reject what would corrupt the cache or index out of range; messages name field and limit."""
    rid, prompt_len = request.id, len(request.input_ids)
    if not 0 <= request.adapter_index <= num_adapters:
        raise InvalidRequestError(
            f"request {rid}: adapter_index must be in 0 .. {num_adapters} (0: the base model), got {request.adapter_index}"
        )
    if prompt_len == 0:
        raise InvalidRequestError(f"request {rid}: input_ids must not be empty")
    if request.stopping.max_new_tokens < 1:
        raise InvalidRequestError(f"request {rid}: max_new_tokens must be >= 1")
    if not 0 <= request.cache_len < prompt_len:
        raise InvalidRequestError(
            f"request {rid}: cache_len must be in 0 .. {prompt_len - 1} (at least one prompt token is "
            f"computed), got {request.cache_len}"
        )
    if request.chunk_len is not None and not 1 <= request.chunk_len <= prompt_len - request.cache_len:
        raise InvalidRequestError(
            f"request {rid}: chunk_len must be in 1 .. {prompt_len - request.cache_len}, got {request.chunk_len}"
        )
    grammar = request.sampling.grammar
    if grammar is not None and grammar.replay_tokens > prompt_len:
        raise InvalidRequestError(
            f"request {rid}: grammar_replay_tokens must be <= {prompt_len}, got {grammar.replay_tokens}"
        )
    if min(request.input_ids) < 0 or max(request.input_ids) >= vocab_size:
        raise InvalidRequestError(f"request {rid}: token ids must be in 0 .. {vocab_size - 1}")
    # The first steps write the prompt; later positions get their blocks with the steps that need them.
    if len(request.blocks) * block_size < prompt_len:
        raise InvalidRequestError(
            f"request {rid}: {len(request.blocks)} blocks of {block_size} cannot hold its {prompt_len} prompt tokens"
        )
    check_block_ids(f"request {rid}", request.blocks, num_blocks, groups)


def check_block_ids(owner: str, blocks: Sequence[int], num_blocks: int, groups: KvGroups | None = None) -> None:
    """Ids within the cache: plain block ids, or (global, local) pairs with two layer groups (kv_groups.py)."""
    if groups is not None:
        problem = groups.check(owner, blocks)
        if problem is not None:
            raise InvalidRequestError(problem)
    elif blocks and (min(blocks) < 0 or max(blocks) >= num_blocks):
        raise InvalidRequestError(f"{owner}: block ids must be in 0 .. {num_blocks - 1}")


def apply_grants(
    batches: Sequence[ShardBatch], grants: Sequence[BlockGrant], num_blocks: int, finished: Collection[int] = (),
    groups: KvGroups | None = None,
) -> None:
    """Append granted blocks to their rows in `batches`; a grant for a request in `finished` (it ended in a
    step run ahead, which the router has not seen yet) is ignored. All or nothing: every grant is checked
    before any row changes."""
    rows = {row.request.id: (row, batch.block_size) for batch in batches for row in batch.rows}
    for grant in grants:
        if grant.request_id not in rows and grant.request_id not in finished:
            raise InvalidRequestError(f"a grant names request {grant.request_id}, which is not in the batch")
        check_block_ids(f"the grant of request {grant.request_id}", grant.blocks, num_blocks, groups)
    for grant in grants:
        if grant.request_id in rows:
            row, block_size = rows[grant.request_id]
            row.add_blocks(grant.blocks, block_size)


def _matcher(request: Request, grammars: GrammarCompiler | None) -> tuple[Matcher | None, str | None]:
    """The request's matcher, or why it has none: a grammar that fails here fails its request only."""
    grammar = request.sampling.grammar
    if grammar is None:
        return None, None
    if grammars is None:
        return None, "this shard does not follow grammars"
    replay = request.input_ids[len(request.input_ids) - grammar.replay_tokens :] if grammar.replay_tokens else ()
    try:
        return grammars.matcher(grammar, replay), None
    except GrammarFailure as failure:
        return None, str(failure)


@dataclass(eq=False)
class ShardBatch:
    id: int
    block_size: int
    rows: list[RowState]
    chooser: NextTokenChooser  # per-row sampling parameters and seeds, [B] rows
    history: TokenHistory  # per-row token counts for the penalties, [B] rows

    @classmethod
    def from_batch(
        cls,
        batch: Batch,
        *,
        block_size: int,
        num_blocks: int,
        vocab_size: int,
        device: torch.device,
        grammars: GrammarCompiler | None = None,
        num_adapters: int = 0,
        groups: KvGroups | None = None,
    ) -> ShardBatch:
        """Validate the router's batch against this shard's cache and build the first step's rows;
        a constrained request gets its matcher from `grammars` (None: grammars are refused);
        `num_adapters`: LoRA adapters loaded (a request's adapter_index is at most this)."""
        if not batch.requests:
            raise InvalidRequestError(f"batch {batch.id}: requests must not be empty")
        if len({r.id for r in batch.requests}) != len(batch.requests):
            raise InvalidRequestError(f"batch {batch.id}: request ids must be unique")
        rows = []
        for request in batch.requests:
            _check_request(request, block_size, num_blocks, vocab_size, num_adapters, groups)
            rest = len(request.input_ids) - request.cache_len
            matcher, failure = _matcher(request, grammars)
            rows.append(
                RowState(
                    request=request,
                    all_ids=list(request.input_ids),
                    cache_len=request.cache_len,
                    chunk_len=rest if request.chunk_len is None else request.chunk_len,
                    blocks=list(request.blocks),
                    capacity=len(request.blocks) * block_size,
                    # Cached prompt tokens were not recomputed and the first token has no predecessor.
                    prompt_logprobs=[float("nan")] * (request.cache_len + 1) if request.prefill_logprobs else None,
                    prompt_top=(
                        [([], [])] * (request.cache_len + 1)
                        if request.prefill_logprobs and request.top_n_tokens else None
                    ),
                    matcher=matcher,
                    failure=failure,
                )
            )
        params = [r.sampling for r in batch.requests]
        return cls(
            id=batch.id,
            block_size=block_size,
            rows=rows,
            chooser=NextTokenChooser.from_params(params, vocab_size, device),
            history=TokenHistory.from_sequences(
                [r.input_ids for r in batch.requests], vocab_size, device, needed=needs_history(params)
            ),
        )

    @property
    def size(self) -> int:
        return len(self.rows)

    @property
    def request_ids(self) -> tuple[int, ...]:
        return tuple(row.request.id for row in self.rows)

    def to_cached(self) -> CachedBatch:
        return CachedBatch(
            id=self.id,
            request_ids=self.request_ids,
            max_tokens=sum(row.capacity for row in self.rows),
            # The next forward's tokens: chunk lengths of prefilling rows, 1 per decoding row (TGI).
            current_tokens=sum(row.chunk_len for row in self.rows),
        )

    def filter(self, request_ids: Sequence[int]) -> ShardBatch:
        """Keep only `request_ids`, in batch order. Consumes `self`."""
        if not request_ids:
            raise InvalidRequestError(f"batch {self.id}: filter needs at least one request id to keep")
        wanted = set(request_ids)
        keep = [i for i, row in enumerate(self.rows) if row.request.id in wanted]
        if len(keep) != len(wanted):
            missing = sorted(wanted - set(self.request_ids))
            raise InvalidRequestError(f"batch {self.id}: request ids {missing} are not in the batch")
        if len(keep) == len(self.rows):
            return self
        return ShardBatch(
            id=self.id,
            block_size=self.block_size,
            rows=[self.rows[i] for i in keep],
            chooser=self.chooser.filter(keep),
            history=self.history.filter(keep),
        )

    @classmethod
    def concatenate(cls, batches: Sequence[ShardBatch]) -> ShardBatch:
        """One batch holding every row, in the given order, under the first batch's id. Consumes inputs."""
        if not batches:
            raise InvalidRequestError("concatenate needs at least one batch")
        if len(batches) == 1:
            return batches[0]
        if len({b.block_size for b in batches}) != 1:
            raise InvalidRequestError("batches with different block sizes cannot be concatenated")
        ids = [rid for b in batches for rid in b.request_ids]
        if len(set(ids)) != len(ids):
            raise InvalidRequestError("concatenated batches must not share request ids")
        return cls(
            id=batches[0].id,
            block_size=batches[0].block_size,
            rows=[row for b in batches for row in b.rows],
            chooser=NextTokenChooser.concatenate([b.chooser for b in batches]),
            history=TokenHistory.concatenate([b.history for b in batches]),
        )

    def fits_next_step(self) -> bool:
        """Whether every row's next forward stays inside its blocks (else the router must grant more first)."""
        return all(row.fits_next_step for row in self.rows)

    def check_fits_next_step(self) -> None:
        """Refuse a step that would write past a row's blocks (the router grants blocks before the step)."""
        for row in self.rows:
            if not row.fits_next_step:
                raise InvalidRequestError(
                    f"request {row.request.id}: its next step writes {len(row.all_ids) + len(row.draft)} positions "
                    f"but its {len(row.blocks)} blocks hold {row.capacity}; grant blocks before the step that needs them"
                )

    def _attention_layout(self) -> tuple[list[int], list[int], list[list[int]]]:
        """(cache_lens, new_lens, block tables) for the attention metadata. A row verifying k drafts is
        k + 1 decode sequences over its one block table (sequence j sees its first cache_len + j + 1
        positions), so each of its tokens is attended exactly as a plain decode step would attend it
        (same kernel, same rounding in bf16): its drafts' K/V is stored before attention runs."""
        if not any(row.draft for row in self.rows):
            return [row.cache_len for row in self.rows], [row.chunk_len for row in self.rows], [
                row.blocks for row in self.rows
            ]
        cache_lens: list[int] = []
        new_lens: list[int] = []
        tables: list[list[int]] = []
        for row in self.rows:
            if row.draft:
                cache_lens.extend(range(row.cache_len, row.cache_len + row.chunk_len))
                new_lens.extend([1] * row.chunk_len)
                tables.extend([row.blocks] * row.chunk_len)
            else:
                cache_lens.append(row.cache_len)
                new_lens.append(row.chunk_len)
                tables.append(row.blocks)
        return cache_lens, new_lens, tables

    def step_inputs(self, device: torch.device, num_adapters: int = 0) -> StepInputs:
        """Pack the next forward's inputs.

        Rows contribute their next tokens in batch order: a prefilling row its chunk
        all_ids[cache_len : cache_len + chunk_len], a decoding row its last token (the same slice, as
        cache_len == len(all_ids) - 1 then). Host work is slicing, O(B) list operations for decode
        rows; the four index vectors cross to the device as ONE tensor.
        """
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logit_rows: list[int] = []
        sample_rows: list[int] = []
        spans: list[tuple[int, int, int]] = []
        counts: list[int] = []
        offset = 0
        bs = self.block_size
        for b, row in enumerate(self.rows):
            start, n = row.cache_len, row.chunk_len
            if row.draft:  # a decoding row: its pending token, then the drafts; every position is scored
                ids.extend(row.all_ids[start:])
                ids.extend(row.draft)
                sample_rows.extend(range(len(logit_rows), len(logit_rows) + n))
                logit_rows.extend(range(offset, offset + n))
                counts.append(n)
            else:
                ids.extend(row.all_ids[start : start + n])
                if row.wants_prompt_logprobs:
                    spans.append((b, len(logit_rows), n))
                    logit_rows.extend(range(offset, offset + n))
                else:
                    logit_rows.append(offset + n - 1)
                sample_rows.append(len(logit_rows) - 1)
                counts.append(1)
            positions.extend(range(start, start + n))
            if n == 1:  # a decode row: one slot, no range
                slots.append(row.slot(start, bs))
            else:
                slots.extend(row.slot(p, bs) for p in range(start, start + n))
            offset += n
        cache_lens, new_lens, tables = self._attention_layout()
        adapters = self._adapters(logit_rows, device, num_adapters) if num_adapters else None
        packed = torch.tensor(ids + positions + slots + logit_rows, dtype=torch.int64).to(device)
        t = len(ids)
        return StepInputs(
            input_ids=packed[:t],
            positions=packed[t : 2 * t],
            slots=packed[2 * t : 3 * t],
            logit_indices=packed[3 * t :],
            sample_rows=(
                None if len(sample_rows) == len(logit_rows) else torch.tensor(sample_rows, dtype=torch.int64).to(device)
            ),
            cache_lens=cache_lens,
            new_lens=new_lens,
            block_tables=tables,
            prompt_spans=spans,
            sample_counts=counts if len(counts) != len(sample_rows) else None,
            adapters=adapters,
        )

    def _adapters(self, logit_rows: list[int], device: torch.device, num_adapters: int) -> StepAdapters | None:
        """Each new token's adapter slot (adapter_index - 1; -1: the base model), grouped once for
        every layer, and the same for the rows the LM head reads."""
        token_slots: list[int] = []
        for row in self.rows:  # a row verifying drafts computes 1 + len(draft) tokens: its chunk_len
            token_slots += [row.request.adapter_index - 1] * row.chunk_len
        groups = group_tokens(token_slots, num_adapters, device)
        if groups is None:  # every row is on the base model
            return None
        return StepAdapters(groups, groups.select(logit_rows, device))

