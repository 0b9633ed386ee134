"""Choosing the next token for every row of a batch at once (TGI's HeterogeneousNextTokenChooser).

Per step: the grammar mask (tokens a row's grammar forbids become -inf, before every rule below, so
penalties, warpers and seeds work unchanged on what is allowed) -> repetition penalty -> frequency penalty -> presence penalty -> temperature -> top_k ->
top_p -> typical_p -> min_p -> choose (argmax for greedy rows, seeded inverse-CDF sampling for the
others). A processor runs only when some row asks for it, and the sort-based warpers only on those
rows. A greedy batch without penalties, grammar masks or top-n requests takes one compiled pass per row,
which finds the first maximum and its logprob, -log(sum(exp(x - max))) (kernels/fused.py's greedy; the torch
path below is its reference and its fallback). No batch without top-n builds the [B, V] log_softmax: the
chosen tokens' logprobs come from that pass's normaliser, (x - max) - log(sum(exp(x - max))).

Returned logprobs (the chosen token's and the distribution top-n is read from) are the log_softmax of
the RAW model logits, before penalties and warpers. TGI returns the warped distribution, so with
top_k/top_p its logprobs are renormalised over the kept set and removed tokens come back as -inf/null
(TGI issue #2108); ours are the model's own probabilities whatever the sampling settings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from tgictl.errors import GenerationError
from tgictl.kernels import fused
from tgictl.proto.messages import SamplingParams
from tgictl.runtime.shard.sampling import logits_processors as lp
from tgictl.runtime.shard.sampling.inverse_cdf import draw
from tgictl.runtime.shard.sampling.params import (
    RowSelection,
    needs_penalties,
    select_rows,
    validate,
)
from tgictl.runtime.shard.sampling.seeded_uniform import (
    seed_key_table,
    seed_keys,
    seeded_uniform,
    uniform_from_keys,
)
from tgictl.runtime.shard.sampling.token_history import TokenHistory

__all__ = ["ChooserOutput", "NextTokenChooser", "TokenHistory", "needs_history", "top_n_tokens"]


def needs_history(params: Sequence[SamplingParams]) -> bool:
    """Whether a batch with these requests needs a materialised TokenHistory (`needed=`)."""
    return any(needs_penalties(p) for p in params)


@dataclass(frozen=True)
class ChooserOutput:
    next_ids: Tensor  # [B] int64
    logprobs: Tensor  # [B] float32: raw-logits logprob of the chosen token
    log_probs: Tensor | None  # [B, V] float32: log_softmax of the raw logits (for top-n); None if not asked


class NextTokenChooser:
    """The sampling state of one batch: per-row parameters as device tensors, built once."""

    def __init__(self, params: tuple[SamplingParams, ...], vocab_size: int, device: torch.device) -> None:
        self.params = params
        self.vocab_size = vocab_size
        self.device = device
        # Penalties and temperature are elementwise and exact identities at their neutral values,
        # so they run over every row ([B, 1] full columns) when any row needs them.
        self.repetition = _full_column(params, "repetition_penalty", 1.0, device)
        self.frequency = _full_column(params, "frequency_penalty", 0.0, device)
        self.presence = _full_column(params, "presence_penalty", 0.0, device)
        self.temperature = _full_column(params, "temperature", 1.0, device)
        # Row-wise warpers (topk/sort/softmax per row) run only on the rows that asked.
        # top_k >= vocab keeps everything: neutral, so it costs no full-vocabulary topk.
        self.top_k = select_rows(
            params, lambda p: p.top_k if 0 < p.top_k < vocab_size else None, device, dtype=torch.int64
        )
        self.top_p = select_rows(params, lambda p: p.top_p if p.top_p < 1.0 else None, device)
        self.typical_p = select_rows(params, lambda p: p.typical_p if p.typical_p < 1.0 else None, device)
        self.min_p = select_rows(params, lambda p: p.min_p if p.min_p > 0.0 else None, device)
        self.sampling = select_rows(params, lambda p: 1.0 if p.samples else None, device)
        # [S, 4] int64 hash keys of the sampling rows, in the order of sampling.index.
        self.seed_keys = (
            seed_key_table([params[i].seed for i in self.sampling.host_rows], device)
            if self.sampling is not None
            else None
        )
        # The same keys as Python ints: on the CPU the uniforms are computed from them (seeded_uniform.py)
        self.host_seed_keys = [seed_keys(params[i].seed) for i in self.sampling.host_rows] \
            if self.sampling is not None and device.type == "cpu" else None
        self.needs_history = needs_history(params)
        self.fast_path = not self.needs_history and self.sampling is None

    @classmethod
    def from_params(
        cls, params: Sequence[SamplingParams], vocab_size: int, device: torch.device | str
    ) -> NextTokenChooser:
        for row, p in enumerate(params):
            validate(p, row)
        return cls(tuple(params), vocab_size, torch.device(device))

    def filter(self, keep: Sequence[int]) -> NextTokenChooser:
        """Rows `keep` in that order. Rebuilt from the parameters: a few small host-to-device copies,
        only when the batch's membership changes."""
        if any(i < 0 or i >= len(self.params) for i in keep):
            raise GenerationError(f"NextTokenChooser.filter: row indices must lie in [0, {len(self.params)})")
        return NextTokenChooser(tuple(self.params[i] for i in keep), self.vocab_size, self.device)

    @classmethod
    def concatenate(cls, choosers: Sequence[NextTokenChooser]) -> NextTokenChooser:
        if not choosers:
            raise GenerationError("NextTokenChooser.concatenate: needs at least one chooser")
        first = choosers[0]
        if any(c.vocab_size != first.vocab_size or c.device != first.device for c in choosers):
            raise GenerationError("NextTokenChooser.concatenate: choosers differ in vocab_size or device")
        return cls(tuple(p for c in choosers for p in c.params), first.vocab_size, first.device)

    def __call__(
        self, logits: Tensor, history: TokenHistory, steps: Tensor, allowed: Tensor | None = None,
        distribution: bool = True,
    ) -> ChooserOutput:
        """logits: [B, V] float32; steps: [B] int64 tokens each row generated so far; allowed: [B, V]
        bool, False where a row's grammar forbids the token (None: no row is constrained);
        distribution: whether the caller reads `log_probs` (top-n); without it a greedy batch may
        skip the [B, V] log_softmax."""
        batch = len(self.params)
        if logits.shape != (batch, self.vocab_size):
            raise GenerationError(
                f"NextTokenChooser: logits shape {tuple(logits.shape)} != ({batch}, {self.vocab_size})"
            )
        # Without top-n only the chosen tokens' logprobs are read: the greedy kernel's row maximum and
        # -log(sum(exp(x - max))) give them without the [B, V] log_softmax (0.7 ms at [32, 49152] on CPU).
        normaliser = None if distribution else fused.greedy(logits)
        if self.fast_path and allowed is None and normaliser is not None:  # on bf16 logits as they are: no copy
            return ChooserOutput(next_ids=normaliser[0], logprobs=normaliser[1], log_probs=None)
        logits = logits.float()
        raw = logits
        log_probs = logits.log_softmax(dim=-1) if normaliser is None else None  # raw logits' (module docstring)
        if allowed is not None:
            if allowed.shape != logits.shape:
                raise GenerationError(f"NextTokenChooser: mask shape {tuple(allowed.shape)} != {tuple(logits.shape)}")
            logits = logits.masked_fill(~allowed, float("-inf"))
        if self.fast_path:
            next_ids = logits.argmax(dim=-1)  # ties -> lowest id, as transformers' greedy search
        else:
            next_ids = self._choose(self.process(logits, history), steps)
        if log_probs is not None:
            logprobs = log_probs.gather(1, next_ids.unsqueeze(1)).squeeze(1)
        else:  # log_softmax at the chosen token: (x - max) - log(sum(exp(x - max))), the maximum at the kernel's id
            assert normaliser is not None
            best_ids, best_logprobs = normaliser
            logprobs = (raw.gather(1, next_ids.unsqueeze(1)) - raw.gather(1, best_ids.unsqueeze(1))).squeeze(1) \
                + best_logprobs
        return ChooserOutput(next_ids=next_ids, logprobs=logprobs, log_probs=log_probs)

    def process(self, scores: Tensor, history: TokenHistory) -> Tensor:
        """Penalties then warpers (module docstring order): the scores the choice is made from.
        scores: [B, V] float32 raw logits, not modified."""
        if self.needs_history:
            counts = history.counts
            if counts is None or history.size != len(self.params):
                raise GenerationError("NextTokenChooser: penalties need a materialised TokenHistory of the batch")
            present = counts > 0  # [B, V] bool, shared by the repetition and presence penalties
            if self.repetition is not None:
                scores = lp.repetition_penalty(scores, present, self.repetition)
            if self.frequency is not None:
                scores = lp.frequency_penalty(scores, counts, self.frequency)
            if self.presence is not None:
                scores = lp.presence_penalty(scores, present, self.presence)
        if self.temperature is not None:
            scores = lp.temperature(scores, self.temperature)
        if self.top_k is not None:
            k_max = int(max(self.top_k.host_values))
            scores = _on_rows(scores, self.top_k, lambda s, k: lp.top_k(s, k, k_max))
        if self.top_p is not None:
            scores = _on_rows(scores, self.top_p, lp.top_p)
        if self.typical_p is not None:
            scores = _on_rows(scores, self.typical_p, lp.typical_p)
        if self.min_p is not None:
            scores = _on_rows(scores, self.min_p, lp.min_p)
        return scores

    def _choose(self, scores: Tensor, steps: Tensor) -> Tensor:
        """Greedy argmax for the greedy rows, a seeded inverse-CDF draw for the sampling rows."""
        if self.sampling is None or self.seed_keys is None:
            return scores.argmax(dim=-1)  # [B]; ties -> lowest id
        if steps.shape != (len(self.params),):
            raise GenerationError(f"NextTokenChooser: steps shape {tuple(steps.shape)} != ({len(self.params)},)")
        rows = self.sampling.index  # None when every row samples
        steps = steps.to(self.device)
        sub = _rows(scores, rows)  # [S, V]
        if self.host_seed_keys is not None:
            row_steps = _rows(steps, rows).tolist()
            uniform = torch.tensor([uniform_from_keys(k, s) for k, s in zip(self.host_seed_keys, row_steps)],
                                   dtype=torch.float64)
        else:
            uniform = seeded_uniform(self.seed_keys, _rows(steps, rows))  # [S] float64 in [0, 1)
        drawn = draw(_probabilities(sub), uniform)  # [S]
        if rows is None:
            return drawn
        return scores.argmax(dim=-1).index_copy(0, rows, drawn)


def _probabilities(scores: Tensor) -> Tensor:
    """softmax(scores): [S, V]. A tiny temperature (1e-40) or a huge penalty turns scores into +-inf,
    and a row with +inf softmaxes to NaN, which the draw cannot search (a shard-killing index error
    from one request's parameters). Such a row takes its best token: the limit as temperature -> 0."""
    probs = scores.softmax(dim=-1)  # [S, V]
    # A row's sum is finite exactly when all of its entries are (softmax gives no infinities, and one NaN
    # makes the sum NaN): one vectorised reduction, where isfinite().all() took ~1.3 ms at [32, 49152] on CPU.
    finite = probs.sum(dim=-1, keepdim=True).isfinite()  # [S, 1]
    if probs.device.type == "cpu" and bool(finite.all()):  # the usual case, without the fallback's passes
        return probs  # (on CUDA the check would wait for the device, so the fallback is always built there)
    best = scores.nan_to_num(nan=float("-inf")).argmax(dim=-1, keepdim=True)  # [S, 1]
    greedy = torch.zeros_like(probs).scatter_(1, best, 1.0)  # [S, V] one-hot
    return torch.where(finite, probs, greedy)


def _full_column(
    params: Sequence[SamplingParams], field: str, neutral: float, device: torch.device
) -> Tensor | None:
    """[B, 1] float32 column of one parameter, or None when every row is neutral."""
    values = [float(getattr(p, field)) for p in params]
    if all(v == neutral for v in values):
        return None
    return torch.tensor(values, dtype=torch.float32, device=device).unsqueeze(1)


def _rows(tensor: Tensor, index: Tensor | None) -> Tensor:
    return tensor if index is None else tensor.index_select(0, index)


def _on_rows(scores: Tensor, selection: RowSelection, warp: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """Apply a row-wise processor to the selected rows only; other rows stay untouched."""
    if selection.index is None:
        return warp(scores, selection.values)
    warped = warp(scores.index_select(0, selection.index), selection.values)
    return scores.index_copy(0, selection.index, warped)


def top_n_tokens(log_probs: Tensor, top_n: Sequence[int]) -> list[tuple[list[int], list[float]]]:
    """Per row, the ids and logprobs of its n most likely tokens, as TGI: every token at least as
    likely as the n-th best is returned (ties can make more than n), sorted by logprob descending
    then id ascending; n = 0 gives empty lists. log_probs: [B, V]."""
    batch, vocab = log_probs.shape
    if len(top_n) != batch:
        raise GenerationError(f"top_n_tokens: {len(top_n)} counts for {batch} rows")
    result: list[tuple[list[int], list[float]]] = [([], []) for _ in range(batch)]
    wanted = [row for row, n in enumerate(top_n) if n > 0]
    if not wanted:
        return result
    index = torch.tensor(wanted, device=log_probs.device)
    rows = log_probs.index_select(0, index)  # [W, V]
    host_n = [min(top_n[r], vocab) for r in wanted]
    n = torch.tensor(host_n, device=log_probs.device).unsqueeze(1)  # [W, 1]
    best = rows.topk(max(host_n), dim=-1).values  # [W, n_max]
    threshold = best.gather(1, n - 1)  # [W, 1]: the n-th best logprob
    counts = (rows >= threshold).sum(dim=1)  # [W] with ties
    width = int(counts.max())
    values, ids = rows.topk(width, dim=-1)  # [W, width]; tie order unspecified
    # Order ties by id: sort by id, then a stable sort by value keeps ids ascending within ties.
    ids, by_id = ids.sort(dim=-1)
    values = values.gather(1, by_id)
    values, by_value = values.sort(dim=-1, descending=True, stable=True)
    ids = ids.gather(1, by_value)
    for position, (row_ids, row_values, count) in enumerate(zip(ids.tolist(), values.tolist(), counts.tolist())):
        result[wanted[position]] = (row_ids[:count], row_values[:count])
    return result
