"""Logits processors as pure functions over a block of rows, each with its own parameter per row.

Every function takes scores [R, V] float32 and a per-row parameter [R, 1], returns new scores
(inputs are never modified), and is the identity on a row whose parameter is neutral, so the
chooser may run it over rows that did not ask for it. Removed tokens get -inf.

The sort-based warpers (top_p, typical_p) rarely need the whole vocabulary in order: the nucleus or
the typical set of a real model's distribution is usually a few tokens to a few hundred (SmolLM2 writing
a story at temperature 0.7, top_p 0.9: median 2, at most 44 over 120 tokens). They look at the best
`CANDIDATE_LADDER[0]` candidates first (torch.topk), and only rows whose answer is not settled within
them go on to the next rung, the last rung being the full sort. Measured on CPU at [32, 49152] (2 AMD
Zen 5 cores): topk 64 ~0.8 ms, 256 ~1.9 ms, 4096 ~11 ms, full sort ~56 ms. Each rung costs one host sync
to see which rows are settled. A rung's answer is the full sort's: the best j candidates, and their running
sums, are the same whatever the rung's size.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tgictl.kernels import fused

CANDIDATE_LADDER: tuple[int, ...] = (64, 256, 4096)
# Up to this many candidates the values come from kernels/fused.py's one-pass kernel (csrc/topk_values.c): at
# [32, 49152] on 2 Zen 5 cores k 50 0.21 ms against torch.topk's 1.04, 64 0.25 / 0.81, 256 1.03 / 1.66; at 4,096
# torch's is faster (9.7 against 11.4 ms).
NATIVE_TOPK_MAX = 256


def _best_values(scores: Tensor, k: int) -> Tensor:
    """scores.topk(k, dim=-1).values [R, k], descending: the same floats from either implementation."""
    if k <= NATIVE_TOPK_MAX and (values := fused.topk_values(scores, k)) is not None:
        return values
    return scores.topk(k, dim=-1).values


def _rungs(vocab_size: int) -> list[int]:
    """Candidate counts to try, ending with the whole vocabulary."""
    return [k for k in CANDIDATE_LADDER if k < vocab_size] + [vocab_size]


def repetition_penalty(scores: Tensor, present: Tensor, penalty: Tensor) -> Tensor:
    """CTRL-style: a token present in the row's history has a positive score divided by the
    penalty and a negative one multiplied by it, once however often it occurs.
    present: [R, V] bool; penalty: [R, 1] (> 0, 1.0 = off)."""
    # For p >= 1 the wanted value is the smaller of x/p and x*p (x/p when x > 0, x*p when x < 0);
    # for p < 1 it is the larger, and max(a, b) = -min(-a, -b). With sign = -1 for p < 1, the value
    # is sign * min(x / (sign*p), x * (sign*p)): exact, since IEEE rounding is symmetric in sign.
    # Selecting on the sign of each score instead (torch.where(scores > 0, ...)) is ~15x slower on
    # CPU (an unpredictable branch per entry), and so is a where() on a broadcast [R, 1] condition.
    sign = torch.where(penalty >= 1.0, 1.0, -1.0)  # [R, 1]
    signed = sign * penalty  # [R, 1]
    penalised = sign * torch.minimum(scores / signed, scores * signed)
    return torch.where(present, penalised, scores)


def frequency_penalty(scores: Tensor, counts: Tensor, penalty: Tensor) -> Tensor:
    """OpenAI's frequency penalty: score -= penalty * raw count (not TGI's count / row width).
    counts: [R, V] float32; penalty: [R, 1] (0.0 = off)."""
    return scores - penalty * counts


def presence_penalty(scores: Tensor, present: Tensor, penalty: Tensor) -> Tensor:
    """A real presence penalty: score -= penalty once if the token occurred at all (TGI has none on
    the wire and maps it onto the repetition penalty). present: [R, V] bool; penalty: [R, 1]."""
    return torch.where(present, scores - penalty, scores)


def temperature(scores: Tensor, value: Tensor) -> Tensor:
    """score / T. value: [R, 1] (> 0, 1.0 = off: division by 1.0 is exact)."""
    return scores / value


def top_k(scores: Tensor, k: Tensor, k_max: int) -> Tensor:
    """Keep tokens scoring at least the k-th best score, so ties at the k-th place are all kept.
    k: [R, 1] int64 in [1, V] (use V for off); k_max: max(k), known on the host so no sync."""
    best = _best_values(scores, k_max)  # [R, k_max] descending
    kth = best.gather(1, k - 1)  # [R, 1]
    return scores.masked_fill(scores < kth, float("-inf"))


def _rows(tensor: Tensor, pending: Tensor | None) -> Tensor:
    """The pending rows of a [R, ...] tensor (None = all rows, no copy)."""
    return tensor if pending is None else tensor.index_select(0, pending)


def _store(target: Tensor, pending: Tensor | None, settled: Tensor, values: Tensor) -> None:
    """target[pending rows that settled] = values[settled]."""
    rows = settled.nonzero().squeeze(1) if pending is None else pending[settled]
    target[rows] = values[settled]


def _still_pending(pending: Tensor | None, settled: Tensor) -> Tensor:
    unsettled = ~settled
    return unsettled.nonzero().squeeze(1) if pending is None else pending[unsettled]


def top_p(scores: Tensor, p: Tensor) -> Tensor:
    """Nucleus: keep the smallest set of most likely tokens whose probability reaches p; the most
    likely token is always kept, and so is every token exactly as likely as the last one needed
    (as top_k keeps ties), which also makes the result independent of how topk orders equal values.
    p: [R, 1] in (0, 1] (1.0 = off)."""
    probs = scores.softmax(dim=-1)  # [R, V]
    vocab = scores.shape[1]
    threshold = torch.zeros_like(p)  # [R, 1] smallest probability kept; 0 keeps everything
    pending: Tensor | None = None  # rows not settled yet; None = every row
    for rung in _rungs(vocab):
        best = _best_values(_rows(probs, pending), rung)  # [P, rung] descending
        cumulative = best.cumsum(dim=-1)
        # Mass strictly before each candidate; exactly 0 for the first, so the top token stays.
        before = torch.cat([torch.zeros_like(cumulative[:, :1]), cumulative[:, :-1]], dim=1)
        needed = (before < _rows(p, pending)).sum(dim=1, keepdim=True)  # [P, 1] nucleus size, >= 1
        # Settled once a candidate lies outside the nucleus: every later token does too.
        settled = (needed < rung).squeeze(1) | (rung == vocab)
        _store(threshold, pending, settled, best.gather(1, needed - 1))
        if bool(settled.all()):
            break
        pending = _still_pending(pending, settled)
    # Off rows keep everything, even tokens whose mass float32 sums can no longer register.
    threshold = threshold.masked_fill(p >= 1.0, 0.0)
    return scores.masked_fill(probs < threshold, float("-inf"))


def typical_p(scores: Tensor, mass: Tensor) -> Tensor:
    """Locally typical sampling, as transformers' TypicalLogitsWarper (min_tokens_to_keep=1), with a
    mass per row: rank tokens by |-log p - H|, keep the smallest prefix reaching `mass` (plus every
    token tied with its last one). mass: [R, 1] in (0, 1] (1.0 = off)."""
    log_probs = scores.log_softmax(dim=-1)  # [R, V]
    probs = log_probs.exp()
    entropy = -(log_probs * probs).nansum(dim=-1, keepdim=True)  # [R, 1]; -inf * 0 -> nan, skipped
    distance = (-log_probs - entropy).abs()  # [R, V]; inf for removed tokens
    threshold = torch.full_like(mass, float("inf"))  # [R, 1]; +inf keeps everything (off rows)
    active = (mass < 1.0).squeeze(1)
    pending: Tensor | None = None if bool(active.all()) else active.nonzero().squeeze(1)
    vocab = scores.shape[1]
    for rung in _rungs(vocab):
        if pending is not None and pending.numel() == 0:
            break
        nearest, ids = _rows(distance, pending).topk(rung, dim=-1, largest=False)  # [P, rung] ascending
        cumulative = _rows(probs, pending).gather(1, ids).cumsum(dim=-1)  # [P, rung]
        last = (cumulative < _rows(mass, pending)).sum(dim=1, keepdim=True)  # [P, 1]
        settled = (last < rung).squeeze(1) | (rung == vocab)
        _store(threshold, pending, settled, nearest.gather(1, last.clamp(max=rung - 1)))
        if bool(settled.all()):
            break
        pending = _still_pending(pending, settled)
    return scores.masked_fill(distance > threshold, float("-inf"))


def min_p(scores: Tensor, p: Tensor) -> Tensor:
    """Drop tokens whose probability is below p times the best token's. p: [R, 1] in [0, 1)."""
    probs = scores.softmax(dim=-1)
    floor = p * probs.amax(dim=-1, keepdim=True)  # [R, 1]
    return scores.masked_fill(probs < floor, float("-inf"))
