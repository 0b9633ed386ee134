"""The router's tokenizer: the fast `tokenizers` library (no transformers, no torch) plus the model's
chat template rendered with a sandboxed Jinja environment.

Template sources, first found wins (TGI's router/src/infer/chat_template.rs; transformers 5 writes `chat_template.jinja`):
chat_template.jinja > chat_template.json > tokenizer_config.json `chat_template` (a string, or a list of
named templates where "default" is taken).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from tgictl.errors import ConfigError, TemplateError, ValidationError


class _TemplateRaised(Exception):
    pass


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _encodable(text: str) -> str:
    """`text` itself, or ValidationError when it holds a lone surrogate: JSON's "\\ud800" escapes decode
    to one, and the tokenizer (Rust strings are valid UTF-8) would fail with a TypeError, a 500."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValidationError(f"`inputs` must be valid Unicode: lone surrogate at character {err.start}") from None
    return text


def _token_content(value: object) -> str | None:
    """tokenizer_config.json stores special tokens as strings or as AddedToken dicts."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _load_template(model_dir: Path, config: dict[str, Any]) -> str | None:
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    json_file = model_dir / "chat_template.json"
    template: object = None
    if json_file.is_file():
        template = json.loads(json_file.read_text(encoding="utf-8")).get("chat_template")
    if template is None:
        template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


class ChatTemplate:
    """A model's chat template, compiled once (compiling per request cost more than tokenizing)."""

    def __init__(self, source: str, bos_token: str | None, eos_token: str | None) -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
        try:
            self._template: jinja2.Template | None = env.from_string(source)
            self._compile_error: str | None = None
        except jinja2.TemplateError as err:  # reported per request: the server still serves /generate
            self._template = None
            self._compile_error = f"{type(err).__name__}: {err}"

    @property
    def supports_tools(self) -> bool:
        """The template renders a `tools` list itself (TGI's test: the source mentions it)."""
        return "tools" in self.source

    def render(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None,
               add_generation_prompt: bool = True, extra: Mapping[str, Any] | None = None) -> str:
        """extra: a request's chat_template_kwargs (e.g. enable_thinking); they cannot replace the variables
        set here."""
        if self._template is None:
            raise TemplateError(self._compile_error or "the chat template does not compile")
        try:
            return self._template.render({
                **(extra or {}),
                "messages": list(messages),
                "tools": list(tools) if tools else None,
                "bos_token": self.bos_token or "",
                "eos_token": self.eos_token or "",
                "add_generation_prompt": add_generation_prompt,
            })
        except _TemplateRaised as err:
            raise TemplateError(str(err)) from None
        except jinja2.TemplateError as err:
            raise TemplateError(f"{type(err).__name__}: {err}") from None


class RouterTokenizer:
    """Tokenize once, in the router (docs/architecture.md, "Decisions": Token ids on the wire); decode for streaming and details."""

    def __init__(self, model_dir: Path) -> None:
        tokenizer_file = model_dir / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise ConfigError(f"{model_dir} has no tokenizer.json: the router needs a fast tokenizer")
        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        config_file = model_dir / "tokenizer_config.json"
        config: dict[str, Any] = (
            json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
        )
        self.bos_token = _token_content(config.get("bos_token"))
        self.eos_token = _token_content(config.get("eos_token"))
        template = _load_template(model_dir, config)
        self.chat_template = (
            ChatTemplate(template, self.bos_token, self.eos_token) if template is not None else None
        )
        self.special_ids = frozenset(
            token_id for token_id, token in self.tokenizer.get_added_tokens_decoder().items() if token.special
        )
        max_length = config.get("model_max_length")
        # transformers writes a huge sentinel when the length is unknown.
        self.model_max_length: int | None = (
            int(max_length) if isinstance(max_length, (int, float)) and max_length < 1e9 else None
        )

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(_encodable(text), add_special_tokens=add_special_tokens).ids

    def encode_with_offsets(self, text: str, add_special_tokens: bool = True) -> list[tuple[int, int, int]]:
        """(id, start, stop) per token, offsets in characters of `text`."""
        encoding = self.tokenizer.encode(_encodable(text), add_special_tokens=add_special_tokens)
        return [(i, start, stop) for i, (start, stop) in zip(encoding.ids, encoding.offsets)]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    @property
    def template_supports_tools(self) -> bool:
        return self.chat_template is not None and self.chat_template.supports_tools

    def apply_chat_template(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        if self.chat_template is None:
            raise TemplateError("This model has no chat template")
        return self.chat_template.render(messages, tools, extra=extra)

    def single_token(self, text: str) -> int | None:
        """The id of `text` when the vocabulary has it as one token (a reasoning model's think tags)."""
        return self.tokenizer.token_to_id(text)
