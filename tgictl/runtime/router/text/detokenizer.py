"""Incremental detokenization for streaming (the router's job: docs/architecture.md, "Decisions": Stopping split).

Decoding one token at a time is wrong for byte-level BPE and SentencePiece vocabularies: a multi-byte
character can span several tokens, and a token's leading space depends on its left context. So each
step decodes a small window with some context to its left and emits only the text that the new token
added, and nothing while the window ends in an incomplete UTF-8 sequence (decoded as U+FFFD).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"
# Prompt tokens kept as left context for the first generated token: enough to settle leading-space
# rules of every tokenizer we know, small enough that each step decodes a handful of ids.
PROMPT_CONTEXT_TOKENS = 5


class Decoder(Protocol):
    """What the detokenizer needs from a tokenizer (`tokenizers.Tokenizer` satisfies it)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Turns a stream of token ids into text pieces, one call per token.

    Texts keep special tokens (TGI's per-token `text` shows `</s>` with `special: true`); callers that
    build user-facing content drop the pieces of special ids themselves.
    """

    def __init__(self, decoder: Decoder, prompt_ids: Sequence[int]) -> None:
        self._decoder = decoder
        # ids: [prefix_offset-context .. newest]; offsets index into this window, not the sequence.
        self._ids: list[int] = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def _decode(self, ids: list[int]) -> str:
        return self._decoder.decode(ids, skip_special_tokens=False)

    def add(self, token_id: int) -> str:
        """Append one token; return the text it completes ("" while a character is incomplete)."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return ""
        piece = new_text[len(prefix_text) :]
        # Slide the window: the tokens just read become the context of the next step, and what lies
        # left of them is no longer needed (keeps every decode O(window), not O(sequence)).
        self._ids = self._ids[self._read_offset :]
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        return piece

    def flush(self) -> str:
        """Text of tokens still held back at the end of a generation (an incomplete character)."""
        if self._read_offset == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]
