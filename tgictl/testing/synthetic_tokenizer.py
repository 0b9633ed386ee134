"""Byte-level BPE tokenizers of a real model's exact vocabulary layout, synthesized with `tokenizers`.

A benchmark of a 1B-class model needs its tokenizer's shape (how many ids, which special tokens at which ids,
the pre-tokenizer llama.cpp will name), not its merges: the weights are random anyway. No hub is reachable, so
the regular vocabulary is trained here on a generated lexicon of pseudo-words (syllables, Zipf-weighted),
numbers and English, to exactly the real model's count; the special tokens follow at the real ids. The split
regex is the real family's, so llama.cpp's pre-tokenizer of that name (`llama-bpe`, `qwen2`) tokenizes a GGUF
of it as `tokenizers` does the tokenizer.json: every server of a benchmark counts the same prompt tokens.

Training is deterministic (a seeded lexicon, a fixed trainer): the same layout gives the same tokenizer.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Llama 3's split: letters, numbers in runs of at most three digits, punctuation, whitespace.
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen2's: the same with single digits.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")

LLAMA3_CHAT_TEMPLATE = (
    "{{- bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TokenizerLayout:
    """A real tokenizer's shape: regular (BPE) tokens first, then its special tokens in id order."""

    name: str
    regular_tokens: int
    special_tokens: tuple[str, ...]
    split_regex: str
    llama_cpp_pre: str  # the pre-tokenizer name llama.cpp's converter writes for this split (tokenizer.ggml.pre)
    bos_token: str | None  # prepended to every encoding (None: none)
    eos_token: str
    chat_template: str

    @property
    def vocab_size(self) -> int:
        return self.regular_tokens + len(self.special_tokens)

    def special_id(self, token: str) -> int:
        return self.regular_tokens + self.special_tokens.index(token)


def _llama3_specials() -> tuple[str, ...]:
    named = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 4: "<|finetune_right_pad_id|>", 6: "<|start_header_id|>",
             7: "<|end_header_id|>", 8: "<|eom_id|>", 9: "<|eot_id|>", 10: "<|python_tag|>"}
    reserved = iter(range(256))
    return tuple(named.get(i) or f"<|reserved_special_token_{next(reserved)}|>" for i in range(256))


LLAMA3 = TokenizerLayout(
    name="llama3", regular_tokens=128_000, special_tokens=_llama3_specials(), split_regex=LLAMA3_SPLIT,
    llama_cpp_pre="llama-bpe", bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
    chat_template=LLAMA3_CHAT_TEMPLATE)

QWEN2 = TokenizerLayout(
    name="qwen2", regular_tokens=151_643,
    special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
                    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                    "<|repo_name|>", "<|file_sep|>"),
    split_regex=QWEN2_SPLIT, llama_cpp_pre="qwen2", bos_token=None, eos_token="<|im_end|>",
    chat_template=CHATML_TEMPLATE)

_ONSETS = ("", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "y", "z", "bl",
           "br", "ch", "cl", "cr", "dr", "fl", "fr", "gl", "gr", "pl", "pr", "sc", "sh", "sk", "sl", "sm", "sn", "sp",
           "st", "str", "sw", "th", "tr", "wh")
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ea", "ee", "oo", "ou", "ie", "oa", "y")
_CODAS = ("", "", "b", "ck", "d", "ft", "g", "l", "ld", "m", "n", "nd", "ng", "nk", "nt", "p", "r", "rd", "rn", "s",
          "sh", "st", "t", "th", "x", "z")
_ENGLISH = ("the of and to in is that for it as with was on be by this are or from at an not have which but all "
            "one they you were their there been has more will would can about if its what when so no out up into "
            "some could them other than then now only its also after first two how our work may well way even new "
            "want because any these give day most us model token request server cache prompt batch")


def _lexicon(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    words: set[str] = set()
    while len(words) < count:
        syllables = rng.choice((1, 1, 2, 2, 2, 3, 3, 4))
        words.add("".join(rng.choice(_ONSETS) + rng.choice(_NUCLEI) + rng.choice(_CODAS) for _ in range(syllables)))
    return sorted(words)


def _corpus(seed: int, words: int) -> Iterator[str]:
    """Lines whose pair counts make common English, numbers and then the pseudo-words merge first."""
    for _ in range(200):
        yield " ".join(_ENGLISH.split()) + " " + _ENGLISH.title() + ". "
    for n in range(1000):
        yield f" {n} {n}, {n}." * (3 if n < 100 else 1)
    for rank, word in enumerate(_lexicon(seed, words)):
        repeats = min(5, max(1, 2000 // (rank % 5000 + 1)))  # a Zipf-like head, then single occurrences
        yield f" {word} {word.capitalize()} " * repeats


def synthesize(layout: TokenizerLayout, *, seed: int = 0, regular_tokens: int | None = None,
               lexicon_words: int = 600_000) -> str:
    """tokenizer.json's text for `layout` (a smaller `regular_tokens` for tests). Raises when the lexicon cannot
    give that many merges (a larger `lexicon_words` can)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    regular = layout.regular_tokens if regular_tokens is None else regular_tokens
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(layout.split_regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=regular, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(_corpus(seed, lexicon_words), trainer=trainer)
    if tokenizer.get_vocab_size() != regular:
        raise ValueError(f"the lexicon gave {tokenizer.get_vocab_size()} tokens, not {regular}: raise lexicon_words")
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in layout.special_tokens])
    if layout.bos_token is not None:
        bos = (layout.bos_token, regular + layout.special_tokens.index(layout.bos_token))
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos[0]} $A", pair=f"{bos[0]} $A {bos[0]} $B", special_tokens=[bos])
    return tokenizer.to_str()


def write_tokenizer(path: Path, layout: TokenizerLayout, *, seed: int = 0, regular_tokens: int | None = None,
                    lexicon_words: int = 600_000, model_max_length: int = 131_072) -> None:
    """tokenizer.json and tokenizer_config.json (chat template, BOS/EOS) for `layout` into `path`."""
    path.mkdir(parents=True, exist_ok=True)
    text = synthesize(layout, seed=seed, regular_tokens=regular_tokens, lexicon_words=lexicon_words)
    (path / "tokenizer.json").write_text(text, encoding="utf-8")
    regular = layout.regular_tokens if regular_tokens is None else regular_tokens
    added = {str(regular + i): {"content": token, "lstrip": False, "normalized": False, "rstrip": False,
                                "single_word": False, "special": True}
             for i, token in enumerate(layout.special_tokens)}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": layout.bos_token,
        "eos_token": layout.eos_token,
        "pad_token": layout.eos_token,
        "add_bos_token": layout.bos_token is not None,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": layout.chat_template,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
