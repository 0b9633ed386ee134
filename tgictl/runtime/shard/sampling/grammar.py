"""Grammar state on the shard: one llguidance matcher per constrained request, token masks for a
step computed in a worker thread while the forward runs, and the tokens a grammar forces
(docs/architecture.md, "Guided generation").

Every rank holds the same matchers and feeds them the same tokens, so every rank computes the same
masks and samples the same tokens: no communication is added to tensor parallelism.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import llguidance
import torch
from torch import Tensor

from tgictl.errors import bounded
from tgictl.proto.messages import Grammar
from tgictl.runtime.guidance import grammar_error, load_tokenizer, to_llguidance

Matcher = llguidance.LLMatcher
log = logging.getLogger(__name__)

# Compiled grammars kept per shard; a request gets a copy of the cached matcher (TGI keeps 32).
CACHED_GRAMMARS = 256
class GrammarFailure(Exception):
    """A request's grammar cannot go on: it exceeded one of llguidance's parser limits (items per row, items
    per step, lexer fuel), or reached a state that allows no token. Ends that request only (Generation.error);
    the rest of its batch goes on."""


def failure_text(what: str, detail: str) -> str:
    """`what: detail` as Generation.error carries it: one bounded line, the first of llguidance's message
    (the rest is its parser state)."""
    first = detail.strip().splitlines()[0] if detail.strip() else "no detail"
    return bounded(f"{what}: {first}")


class GrammarCompiler:
    """The shard's vocabulary for llguidance and an LRU cache of compiled matchers by grammar text.

    The vocabulary is built on the first request that carries a grammar (~0.5 s once, for 49,152
    tokens), not at load: it holds ~60 MiB (llguidance's own tokenizer and token trie), a tenth of a
    4-bit SmolLM2 shard's memory, which a server that never sees a grammar should not pay. The router
    validates grammars with its own copy, so a refused grammar never gets here.
    """

    def __init__(self, model_dir: Path, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self._model_dir = model_dir
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._load_error: Exception | None = None
        self._load_lock = threading.Lock()
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self.executor = llguidance.LLExecutor()

    @property
    def vocabulary_built(self) -> bool:
        return self._tokenizer is not None or self._load_error is not None

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        with self._load_lock:
            if not self.vocabulary_built:
                start = time.perf_counter()
                try:
                    self._tokenizer = load_tokenizer(self._model_dir, self.vocab_size, self.eos_token_ids)
                except Exception as err:  # reported to every request that needs a grammar
                    self._load_error = err
                log.info("grammar vocabulary built for the first guided request in %.2f s",
                         time.perf_counter() - start)
        if self._tokenizer is None:
            raise GrammarFailure(failure_text("this shard cannot follow grammars", str(self._load_error)))
        return self._tokenizer

    def matcher(self, grammar: Grammar, replay: Sequence[int]) -> llguidance.LLMatcher:
        """A fresh matcher for `grammar`, advanced over `replay` (earlier rounds' tokens). GrammarFailure
        when that is impossible: the request fails, not its batch."""
        try:
            text = to_llguidance(grammar)
        except ValueError as err:
            raise GrammarFailure(failure_text("grammar", str(err))) from None
        with self._lock:
            template = self._cache.get(text)
            if template is not None:
                self._cache.move_to_end(text)
        if template is None:
            error = grammar_error(text, self.tokenizer)
            if error is not None:
                raise GrammarFailure(failure_text("grammar is not valid", error))
            template = llguidance.LLMatcher(self.tokenizer, text, log_level=0)
            with self._lock:
                self._cache[text] = template
                while len(self._cache) > CACHED_GRAMMARS:
                    self._cache.popitem(last=False)
        matcher = template.deep_copy()
        if (replay and not matcher.consume_tokens(list(replay))) or matcher.is_error():
            raise GrammarFailure(failure_text("grammar: the replayed tokens do not follow it", matcher.get_error()))
        return matcher


def mask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


class MaskJob:
    """The masks of one step, computed in a worker thread (llguidance releases the GIL) while the
    forward runs. Rows without a matcher keep every bit set."""

    _pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")

    def __init__(self, compiler: GrammarCompiler, rows: Sequence[tuple[Matcher, int]], batch: int) -> None:
        self.bitmask = torch.full((batch, mask_words(compiler.vocab_size)), -1, dtype=torch.int32)
        self.compute_s = 0.0  # the worker's time on the masks
        self.wait_s = 0.0  # what the step waited for them after its forward (the critical-path cost)
        self._future: Future[None] = self._pool.submit(self._fill, compiler.executor, list(rows))

    def _fill(self, executor: llguidance.LLExecutor, rows: list[tuple[Matcher, int]]) -> None:
        start = time.perf_counter()
        words = self.bitmask.shape[1]
        executor.unsafe_compute_mask_ptr(rows, self.bitmask.data_ptr(), words * 4, self.bitmask.shape[0])
        self.compute_s = time.perf_counter() - start

    def allowed(self, vocab_size: int, device: torch.device) -> Tensor:
        """[B, V] bool: True where the row's grammar allows the token. Waits for the worker."""
        start = time.perf_counter()
        self._future.result()
        self.wait_s = time.perf_counter() - start
        return unpack_bitmask(self.bitmask.to(device), vocab_size)


_BITS = torch.arange(32, dtype=torch.int32)


def unpack_bitmask(bitmask: Tensor, vocab_size: int) -> Tensor:
    """[B, W] int32 (bit j of word w = token 32w + j) -> [B, V] bool."""
    bits = _BITS.to(bitmask.device)
    unpacked = (bitmask.unsqueeze(-1) >> bits) & 1  # [B, W, 32]
    return unpacked.view(bitmask.shape[0], -1)[:, :vocab_size].bool()


def advance(matcher: llguidance.LLMatcher, token: int, limit: int, eos_token_ids: frozenset[int]) -> list[int]:
    """Feed the sampled `token`; return the tokens the grammar forces after it, at most `limit`:
    the only continuation it allows (a key, a separator, a closing brace), and EOS once the grammar
    is complete. The forced tokens are fed to the matcher too. A sampled EOS forces nothing."""
    if not matcher.consume_token(token):
        raise GrammarFailure(failure_text(f"the grammar engine refused token {token}", matcher.get_error()))
    if limit <= 0 or token in eos_token_ids:
        return []
    eos = [min(eos_token_ids)] if eos_token_ids else []
    if matcher.is_stopped():
        return eos
    forced = matcher.compute_ff_tokens()[:limit]
    if matcher.is_error() or (forced and not matcher.consume_tokens(forced)):
        raise GrammarFailure(failure_text("the grammar engine stopped", matcher.get_error()))
    if len(forced) < limit and matcher.is_stopped():
        forced += eos
    return forced
