"""Workloads of `tgictl bench`: the prompts a run sends, built before the first request.

- `random`: prompts of an exact token length (drawn from a range) through the model's own tokenizer;
- `shared-prefix`: G groups x P prompts, each group sharing one long system prompt (what a prefix
  cache is for);
- `file`: prompts from a JSONL file (or a JSON array) of ShareGPT conversations, OpenAI-style
  `messages`, or plain `{"prompt": ...}` objects.

Everything is drawn from one seeded `random.Random`, so a seed names the workload exactly.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tgictl.errors import ConfigError
from tgictl.runtime.router.text.tokenizer import RouterTokenizer

# Below this many whole-word tokens the vocabulary is too odd for word-only prompts (tiny test
# tokenizers); any token that re-encodes to itself is used instead.
_MIN_WORD_CANDIDATES = 64
_MAX_ADJUST_ROUNDS = 64
# ShareGPT spells roles its own way; OpenAI's names pass through.
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
          "bing": "assistant", "bard": "assistant", "system": "system"}


@dataclass(frozen=True)
class BenchPrompt:
    """One request of a workload, in the shapes every API needs."""

    text: str  # /generate and /v1/completions: the whole prompt (a shared prefix included)
    messages: tuple[tuple[str, str], ...]  # /v1/chat/completions: (role, content) pairs
    max_new_tokens: int
    prompt_tokens: int | None  # what the tokenizer counts for `text` (None without a tokenizer)
    group: int | None = None  # shared-prefix: which system prompt this request shares

    def message_dicts(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.messages]


def parse_range(text: str, name: str) -> tuple[int, int]:
    """`128` or `64:256` → an inclusive (low, high) range of token counts >= 1."""
    low_text, sep, high_text = text.partition(":")
    try:
        low = int(low_text)
        high = int(high_text) if sep else low
    except ValueError:
        raise ConfigError(f"{name} must be N or MIN:MAX (token counts), got {text!r}") from None
    if low < 1 or high < low:
        raise ConfigError(f"{name} must satisfy 1 <= MIN <= MAX, got {text!r}")
    return low, high


class PromptMaker:
    """Texts whose encoding has an exact number of tokens.

    Prompts are joined from tokens that decode to a space and a word and re-encode to themselves,
    so the pre-tokenizer splits the joined text back into the same tokens; a few adjustment rounds
    (drop or add tokens, re-encode) cover what merges across boundaries still change.
    """

    def __init__(self, tokenizer: RouterTokenizer) -> None:
        self.tokenizer = tokenizer
        self.candidates = _candidate_ids(tokenizer)

    def count(self, text: str) -> int:
        """Tokens the server counts for a /generate prompt (special tokens such as BOS included)."""
        return len(self.tokenizer.encode(text, add_special_tokens=True))

    def text(self, rng: random.Random, target: int, prefix: str = "") -> str:
        """A text of exactly `target` tokens that starts with `prefix`."""
        base = self.count(prefix)
        if target < base:
            raise ConfigError(f"cannot make a {target}-token prompt: the fixed part alone has {base} tokens")
        ids = rng.choices(self.candidates, k=target - base)
        for _ in range(_MAX_ADJUST_ROUNDS):
            text = prefix + self.tokenizer.decode(ids, skip_special_tokens=True)
            got = self.count(text)
            if got == target:
                return text
            if got > target:
                del ids[len(ids) - min(got - target, len(ids)):]
            else:
                ids.extend(rng.choices(self.candidates, k=target - got))
        raise ConfigError(f"could not build a prompt of exactly {target} tokens with this tokenizer")


def _candidate_ids(tokenizer: RouterTokenizer) -> list[int]:
    backend = tokenizer.tokenizer
    added = set(backend.get_added_tokens_decoder())
    ids = [i for i in range(backend.get_vocab_size(with_added_tokens=False)) if i not in added]
    texts = backend.decode_batch([[i] for i in ids], skip_special_tokens=True)
    encoded = backend.encode_batch(texts, add_special_tokens=False)
    clean = {i: text for i, text, enc in zip(ids, texts, encoded)
             if text.strip() and text.isprintable() and enc.ids == [i]}
    words = [i for i, text in clean.items()
             if len(text) > 2 and text[0] == " " and text[1:].isascii() and text[1:].isalpha()]
    chosen = words if len(words) >= _MIN_WORD_CANDIDATES else list(clean)
    if not chosen:
        raise ConfigError("the tokenizer has no plain-text tokens to build prompts from")
    return chosen


def _draw(rng: random.Random, bounds: tuple[int, int]) -> int:
    return rng.randint(bounds[0], bounds[1])


def random_workload(maker: PromptMaker, count: int, input_len: tuple[int, int], output_len: tuple[int, int],
                    seed: int) -> list[BenchPrompt]:
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        length = _draw(rng, input_len)
        text = maker.text(rng, length)
        prompts.append(BenchPrompt(text, (("user", text),), _draw(rng, output_len), length))
    return prompts


def shared_prefix_workload(maker: PromptMaker, groups: int, prompts_per_group: int, prefix_len: int,
                           input_len: tuple[int, int], output_len: tuple[int, int], seed: int) -> list[BenchPrompt]:
    """Group-major order (every prompt of group 0, then group 1, ...): the first request of a group
    computes its prefix and the rest can find it cached. `input_len` counts the tokens after the prefix."""
    if groups < 1 or prompts_per_group < 1:
        raise ConfigError(f"--groups and --prompts-per-group must be >= 1, got {groups} and {prompts_per_group}")
    rng = random.Random(seed)
    prompts = []
    for group in range(groups):
        system = maker.text(rng, prefix_len)
        for _ in range(prompts_per_group):
            total = prefix_len + _draw(rng, input_len)
            text = maker.text(rng, total, prefix=system)
            messages = (("system", system), ("user", text[len(system):].lstrip()))
            prompts.append(BenchPrompt(text, messages, _draw(rng, output_len), total, group))
    return prompts


def _conversation(entry: Any, line: str) -> tuple[list[tuple[str, str]], str | None]:
    """(messages up to the first user turn, the reference reply after it or None)."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{line}: expected a JSON object, got {type(entry).__name__}")
    if isinstance(entry.get("prompt"), str):
        return [("user", entry["prompt"])], None
    turns = entry.get("conversations", entry.get("messages"))
    if not isinstance(turns, list):
        raise ConfigError(f"{line}: needs \"prompt\", \"conversations\" (ShareGPT) or \"messages\"")
    messages: list[tuple[str, str]] = []
    for index, turn in enumerate(turns):
        role = _ROLES.get(str(turn.get("from", turn.get("role", ""))).lower()) if isinstance(turn, dict) else None
        content = turn.get("value", turn.get("content")) if isinstance(turn, dict) else None
        if role is None or not isinstance(content, str):
            raise ConfigError(f"{line}: turn {index} needs a known role and a text")
        if role == "assistant" and any(r == "user" for r, _ in messages):
            return messages, content
        messages.append((role, content))
        if role == "user" and index == len(turns) - 1:
            break
    if not any(r == "user" for r, _ in messages):
        raise ConfigError(f"{line}: no user turn")
    return messages, None


def _read_entries(path: Path) -> list[tuple[str, Any]]:
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read --dataset {str(path)!r}: {err.strerror}") from None
    try:
        if raw.lstrip().startswith("["):  # ShareGPT's own dump is one JSON array
            return [(f"{path}[{i}]", e) for i, e in enumerate(json.loads(raw))]
        return [(f"{path}:{n}", json.loads(line)) for n, line in enumerate(raw.splitlines(), start=1) if line.strip()]
    except json.JSONDecodeError as err:
        raise ConfigError(f"--dataset {str(path)!r} is not JSON lines: {err}") from None


def file_workload(path: Path, maker: PromptMaker | None, count: int | None, output_len: tuple[int, int] | None,
                  default_output_len: tuple[int, int], seed: int) -> list[BenchPrompt]:
    """Prompts of the file in order (the first `count` usable ones). The output length is
    `output_len` when given, else the reference reply's token count when the file has one and a
    tokenizer is known, else `default_output_len`. The prompt is the conversation up to its first
    user turn; for /generate and /v1/completions its user text alone."""
    rng = random.Random(seed)
    prompts: list[BenchPrompt] = []
    for line, entry in _read_entries(path):
        if count is not None and len(prompts) >= count:
            break
        messages, reply = _conversation(entry, line)
        text = next(content for role, content in reversed(messages) if role == "user")
        if output_len is not None:
            new_tokens = _draw(rng, output_len)
        elif reply is not None and maker is not None:
            new_tokens = max(1, len(maker.tokenizer.encode(reply, add_special_tokens=False)))
        else:
            new_tokens = _draw(rng, default_output_len)
        prompt_tokens = maker.count(text) if maker is not None else None
        prompts.append(BenchPrompt(text, tuple(messages), new_tokens, prompt_tokens))
    if not prompts:
        raise ConfigError(f"--dataset {str(path)!r} holds no prompts")
    return prompts


def cycle(prompts: Sequence[BenchPrompt], index: int) -> BenchPrompt:
    """The prompt of request `index`: a --duration run goes round the workload as often as it needs."""
    return prompts[index % len(prompts)]
