from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from tgictl.runtime.router.text.detokenizer import IncrementalDetokenizer

TEXTS = [
    "Hello world, this is a plain sentence.",
    "Accents: héllo wörld, naïve café",
    "Emoji split over bytes: 🤗🚀 and CJK 漢字 text",
    "  leading spaces and\nnew lines\n\n  indented",
]


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_tokenizer_dir / "tokenizer.json"))


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_pieces_concatenate_to_the_full_decode(tokenizer: Tokenizer, text: str) -> None:
    prompt = tokenizer.encode("Question: say it. Answer:").ids
    generated = tokenizer.encode(text, add_special_tokens=False).ids
    detok = IncrementalDetokenizer(tokenizer, prompt)
    pieces = [detok.add(t) for t in generated]
    pieces.append(detok.flush())
    assert "".join(pieces) == tokenizer.decode(generated, skip_special_tokens=False)
    assert all("\ufffd" not in piece for piece in pieces)


def test_a_character_split_over_tokens_is_emitted_once_complete(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("🤗", add_special_tokens=False).ids
    assert len(ids) > 1  # byte-level BPE on a small vocab splits the emoji's four bytes
    detok = IncrementalDetokenizer(tokenizer, [])
    pieces = [detok.add(t) for t in ids]
    assert pieces[:-1] == [""] * (len(ids) - 1)
    assert pieces[-1] == "🤗"


def test_flush_releases_an_incomplete_tail(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("a🤗", add_special_tokens=False).ids
    detok = IncrementalDetokenizer(tokenizer, [])
    pieces = [detok.add(t) for t in ids[:-1]]
    assert "".join(pieces) == "a"
    assert detok.flush() != ""  # the held bytes come out (as replacement text) rather than vanish
    assert detok.flush() == ""


def test_special_tokens_keep_their_text(tokenizer: Tokenizer) -> None:
    eos = tokenizer.token_to_id("<|im_end|>")
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode("hi").ids)
    assert detok.add(eos) == "<|im_end|>"
