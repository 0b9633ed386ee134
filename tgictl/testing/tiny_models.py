"""Tiny random-weight models for tests: real HF directories (config, generation config, safetensors,
a real byte-level BPE tokenizer with a chatml template) that transformers loads as it loads any model.

Every later test compares tgictl against transformers on these weights, so they are built BY
transformers (`AutoModelForCausalLM.from_config`) and only the initial values are changed: a larger
init std and perturbed norm weights and biases, so that a missing bias, a skipped q/k norm or a wrong
rotary layout changes the logits visibly and greedy decoding does not collapse onto one token.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tgictl.errors import ConfigError

# Special tokens get the first ids, in this order: <|endoftext|>=0, <|im_start|>=1, <|im_end|>=2.
SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BOS_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
TOKENIZER_VOCAB_SIZE = 512

# Words, single digits, punctuation runs and whitespace runs (the GPT-4/Qwen2 style split).
_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# A few KB of plain English: enough for ~250 merges that make ordinary prose tokenize into
# multi-byte tokens, while the 256 byte symbols keep any UTF-8 text encodable.
_CORPUS = """\
The quick brown fox jumps over the lazy dog. A language model reads a sequence of tokens and
predicts the next one. The server batches requests together, so that many users can share the same
accelerator at the same time. Each request has a prompt, a number of new tokens to generate, and a
set of sampling parameters such as the temperature, the top k and the top p values.
Once upon a time there was a little robot who wanted to learn how to write stories. Every morning it
read a book, and every evening it wrote a new sentence of its own. The other robots laughed at first,
but after a year the little robot had written a whole library of tales about the sea, the mountains,
the stars and the people who lived in the city by the river.
What is the capital of France? The capital of France is Paris. What is the capital of Germany? The
capital of Germany is Berlin. How many days are there in a week? There are seven days in a week.
Hello! How are you today? I am fine, thank you. Can you help me with my homework? Of course, what is
the question? Please write a short poem about the weather. The rain is falling on the roof, the wind
is singing in the trees, and the clouds are moving slowly over the hills.
In computer science, a cache stores the results of previous work so that future requests can be
served faster. A radix tree shares common prefixes between keys, which makes it a good structure for
reusing the attention keys and values of prompts that start with the same text.
The model was trained on a large collection of documents from the web, books, and code. It learned
grammar, facts about the world, and some reasoning abilities. It is not perfect and it can make
mistakes, so users should check important answers.
def add(a, b):
    return a + b

for i in range(10):
    print(i, add(i, i))
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 2024 3.14 42.
"""


@dataclass(frozen=True)
class Family:
    """How to build one model family: its transformers config class name and family defaults."""

    model_type: str
    config_class: str
    tie_word_embeddings: bool
    defaults: tuple[tuple[str, Any], ...] = ()


# Ties differ between families on purpose, so tests cover both a separate and a tied LM head. The defaults make
# each family's differences show in a short test: soft-caps that bind, scales unlike head_dim ** -0.5, layers
# without positions and global layers within a few layers; sliding windows are set per test (sliding_window=).
FAMILIES: dict[str, Family] = {
    "llama": Family("llama", "LlamaConfig", tie_word_embeddings=False),
    "mistral": Family("mistral", "MistralConfig", tie_word_embeddings=False, defaults=(("sliding_window", None),)),
    "qwen2": Family("qwen2", "Qwen2Config", tie_word_embeddings=True, defaults=(("use_sliding_window", False),)),
    "qwen3": Family("qwen3", "Qwen3Config", tie_word_embeddings=True, defaults=(("attention_bias", False),)),
    "gemma2": Family("gemma2", "Gemma2Config", tie_word_embeddings=False, defaults=(
        ("sliding_window", 4096), ("query_pre_attn_scalar", 24), ("attn_logit_softcapping", 2.0),
        ("final_logit_softcapping", 4.0))),
    "gemma3_text": Family("gemma3_text", "Gemma3TextConfig", tie_word_embeddings=False, defaults=(
        ("sliding_window", 4096), ("sliding_window_pattern", 2), ("query_pre_attn_scalar", 24),
        ("final_logit_softcapping", 4.0))),
    "phi3": Family("phi3", "Phi3Config", tie_word_embeddings=False, defaults=(
        ("partial_rotary_factor", 0.5), ("sliding_window", None), ("original_max_position_embeddings", 2048))),
    "smollm3": Family("smollm3", "SmolLM3Config", tie_word_embeddings=True, defaults=(("no_rope_layer_interval", 2),)),
    "olmo2": Family("olmo2", "Olmo2Config", tie_word_embeddings=False),
    "granite": Family("granite", "GraniteConfig", tie_word_embeddings=False, defaults=(
        ("embedding_multiplier", 3.0), ("residual_multiplier", 0.5), ("attention_multiplier", 0.1),
        ("logits_scaling", 2.0))),
    # Mixture of experts: enough experts that the rows of a short batch are routed to different ones.
    "mixtral": Family("mixtral", "MixtralConfig", tie_word_embeddings=False, defaults=(
        ("sliding_window", None), ("num_local_experts", 8), ("num_experts_per_tok", 2))),
    "qwen3_moe": Family("qwen3_moe", "Qwen3MoeConfig", tie_word_embeddings=True, defaults=(
        ("num_experts", 16), ("num_experts_per_tok", 4), ("moe_intermediate_size", 32), ("norm_topk_prob", True),
        ("use_sliding_window", False), ("attention_bias", False))),
}

_DTYPES = ("float32", "bfloat16", "float16")


def window_options(family: str, window: int) -> dict[str, Any]:
    """write_tiny_model options that turn on `family`'s sliding windows of `window` positions, as its config
    does: every layer (Mistral, Mixtral, Phi-3, Qwen3-MoE), alternate layers (Gemma 2, Gemma 3 with
    sliding_window_pattern 2), the layers from max_window_layers on (Qwen), the layers without positions (SmolLM3);
    {} for a family without."""
    if family in ("mistral", "mixtral", "phi3", "gemma2", "gemma3_text"):
        return {"sliding_window": window}
    if family in ("qwen2", "qwen3"):
        return {"use_sliding_window": True, "sliding_window": window, "max_window_layers": 1}
    if family in ("smollm3", "qwen3_moe"):
        return {"use_sliding_window": True, "sliding_window": window}
    return {}


@functools.lru_cache(maxsize=1)
def tokenizer_json() -> str:
    """Train the byte-level BPE tokenizer once per process; returns tokenizer.json's text.

    Cached as an immutable string (not a Tokenizer object), so no caller can mutate the cached value.
    Training is deterministic: same corpus, same trainer settings, same merges.
    """
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )

    tokenizer = Tokenizer(models.BPE())
    # The same pipeline as Qwen2's tokenizer (NFC, Qwen split regex, byte level without prefix space):
    # transformers forces its Qwen2Tokenizer class onto qwen2 checkpoints, and only an identical
    # pipeline makes that class and the plain tokenizer.json encode alike. Any NFC text round-trips.
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        min_frequency=1,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS.splitlines(keepends=True), trainer=trainer)
    return tokenizer.to_str()


def write_tokenizer(path: Path) -> dict[str, int]:
    """Write tokenizer.json and tokenizer_config.json into `path`; returns the special token ids."""
    from tokenizers import Tokenizer

    path.mkdir(parents=True, exist_ok=True)
    text = tokenizer_json()
    (path / "tokenizer.json").write_text(text, encoding="utf-8")
    tokenizer = Tokenizer.from_str(text)
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    added = {
        str(ids[token]): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token in SPECIAL_TOKENS
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": [t for t in SPECIAL_TOKENS if t not in (BOS_TOKEN, EOS_TOKEN)],
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": BOS_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
        "chat_template": CHATML_TEMPLATE,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")
    return ids


def write_tiny_model(
    path: Path,
    family: str = "llama",
    *,
    seed: int = 0,
    num_layers: int = 2,
    hidden_size: int = 64,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    tie_word_embeddings: bool | None = None,
    rope_scaling: dict[str, Any] | None = None,
    dtype: str = "float32",
    max_position_embeddings: int = 2048,
    init_std: float = 0.2,
    **config_overrides: Any,
) -> Path:
    """Write a tiny random-weight model of `family` into `path` (created) and return `path`.

    tie_word_embeddings=None takes the family default (FAMILIES).
    init_std: std of the normal init of every matrix; 0.2 on hidden size 64 gives logits with a std
    of ~1.5, far from uniform, so greedy decoding varies from token to token.
    config_overrides go straight into the transformers config (e.g. rope_theta=1e6).
    """
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    if family not in FAMILIES:
        raise ConfigError(f"unknown tiny model family {family!r}; known: {', '.join(sorted(FAMILIES))}")
    if dtype not in _DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    if hidden_size % num_heads != 0 or num_heads % num_kv_heads != 0:
        raise ConfigError(
            f"hidden_size ({hidden_size}) must divide by num_heads ({num_heads}) "
            f"and num_heads by num_kv_heads ({num_kv_heads})"
        )
    spec = FAMILIES[family]
    path = Path(path)
    special_ids = write_tokenizer(path)

    kwargs: dict[str, Any] = dict(spec.defaults)
    kwargs.update(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings if tie_word_embeddings is None else tie_word_embeddings,
        initializer_range=init_std,
        bos_token_id=special_ids[BOS_TOKEN],
        eos_token_id=special_ids[EOS_TOKEN],
        pad_token_id=special_ids[BOS_TOKEN],
    )
    if rope_scaling is not None:
        kwargs["rope_scaling"] = rope_scaling
    kwargs.update(config_overrides)
    config = getattr(transformers, spec.config_class)(**kwargs)

    # The family joins the seed so llama and mistral (the same architecture here) get different
    # weights: a test that loads the wrong family's weights must not pass by accident.
    weight_seed = seed * 100 + list(FAMILIES).index(family)
    torch.manual_seed(weight_seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _perturb(model, weight_seed)
    model = model.to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    model.save_pretrained(path, safe_serialization=True)
    return path


def _perturb(model: Any, seed: int) -> None:
    """Give norm weights and biases non-trivial values (transformers initialises them to 1 and 0).

    With all-ones norms a model that forgets a norm's weight still matches; with zero biases one that
    forgets qwen2's qkv bias does. Random values make both mistakes show up in the logits.
    """
    import torch

    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if "norm" in name and name.endswith("weight"):
                param.copy_(torch.empty(param.shape).uniform_(0.5, 1.5, generator=generator))
            elif name.endswith("bias"):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
