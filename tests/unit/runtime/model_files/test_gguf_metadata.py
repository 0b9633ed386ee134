"""gguf_metadata.drop_tokens_past_the_vocabulary: transformers' GGUF reader appends a default `<|endoftext|>` past a
Llama 3 vocabulary (no unknown token in the file); the written tokenizer must not be larger than the model."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from tgictl.runtime.model_files.gguf_metadata import drop_tokens_past_the_vocabulary
from tgictl.testing.tiny_models import TOKENIZER_VOCAB_SIZE, write_tokenizer


def _with_a_token_past_the_end(directory: Path) -> None:
    write_tokenizer(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert isinstance(tokenizer, PreTrainedTokenizerFast) and len(tokenizer) == TOKENIZER_VOCAB_SIZE
    tokenizer.add_special_tokens({"unk_token": "<|unk_past_the_end|>"})
    tokenizer.save_pretrained(directory)
    assert len(AutoTokenizer.from_pretrained(directory)) == TOKENIZER_VOCAB_SIZE + 1


def test_added_tokens_past_the_vocabulary_are_dropped(tmp_path: Path) -> None:
    clean, extra = tmp_path / "clean", tmp_path / "extra"
    write_tokenizer(clean)
    _with_a_token_past_the_end(extra)
    drop_tokens_past_the_vocabulary(extra, TOKENIZER_VOCAB_SIZE)
    tokenizer = AutoTokenizer.from_pretrained(extra)
    assert len(tokenizer) == TOKENIZER_VOCAB_SIZE
    assert tokenizer.unk_token is None
    text = "hello world <|unk_past_the_end|>"
    assert tokenizer.encode(text) == AutoTokenizer.from_pretrained(clean).encode(text)
    config = json.loads((extra / "tokenizer_config.json").read_text())
    assert all(int(i) < TOKENIZER_VOCAB_SIZE for i in config["added_tokens_decoder"])


def test_a_tokenizer_within_the_vocabulary_is_left_as_it_is(tmp_path: Path) -> None:
    write_tokenizer(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    drop_tokens_past_the_vocabulary(tmp_path, TOKENIZER_VOCAB_SIZE)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
