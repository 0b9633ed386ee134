"""A tiny random reasoning model: the tiny qwen3 of tiny_models.py with `<think>` and `</think>` added to
its vocabulary (added, not special, as in Qwen3's and DeepSeek-R1's tokenizers) and a chat template that
thinks, so `--reasoning-parser` can be tested without a real reasoning model (docs/apis.md, "Reasoning").

Template styles, by what the generation prompt ends with:
- "opens" (DeepSeek-R1, Qwen3-Thinking): `<think>\\n`, so the output begins inside the reasoning;
- "optional" (Qwen3): nothing, the model may open a think block itself.
With `enable_thinking=false` (a chat_template_kwargs key) both end with an empty think block instead, as
Qwen3's template does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from tgictl.testing.tiny_models import TOKENIZER_VOCAB_SIZE, write_tiny_model

THINK_TAGS = ("<think>", "</think>")
THINKING_VOCAB_SIZE = TOKENIZER_VOCAB_SIZE + len(THINK_TAGS)  # the tags take the next ids: 512 and 513

_TURNS = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
)
_OFF = "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
TEMPLATES = {
    "opens": _TURNS + "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    + _OFF + "{% else %}{{ '<think>\\n' }}{% endif %}{% endif %}",
    "optional": _TURNS + "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}" + _OFF + "{% endif %}{% endif %}",
}

Style = Literal["opens", "optional"]


def write_thinking_model(path: Path, style: Style = "opens", **model_kwargs: Any) -> Path:
    """A tiny qwen3 at `path` whose vocabulary has the think tags and whose template thinks in `style`."""
    from tokenizers import AddedToken, Tokenizer

    write_tiny_model(path, "qwen3", vocab_size=THINKING_VOCAB_SIZE, **model_kwargs)
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in THINK_TAGS])
    tokenizer.save(str(path / "tokenizer.json"))
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    for tag in THINK_TAGS:
        config["added_tokens_decoder"][str(tokenizer.token_to_id(tag))] = {
            "content": tag, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": False,
        }
    config["chat_template"] = TEMPLATES[style]
    config_file.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return path
