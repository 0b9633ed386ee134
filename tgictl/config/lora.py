"""LoRA adapters served beside the base model (`--lora-adapters`), and the names that mean the base model."""

from __future__ import annotations

from dataclasses import dataclass

from tgictl.errors import ConfigError

# Names a request can give that mean the base model (OpenAI's `model` field): never an adapter's name.
BASE_MODEL_ALIASES: tuple[str, ...] = ("tgi",)
# The base model's label in the per-adapter metrics: not an adapter name either.
BASE_MODEL_LABEL = "base"


@dataclass(frozen=True)
class LoraAdapterSpec:
    """One `--lora-adapters` entry: `name=PATH` (a local PEFT directory) or a hub id `owner/name[@revision]`
    (named by its id), resolved like models (docs/architecture.md, "Multi-LoRA")."""

    name: str
    source: str  # a local directory or a hub id
    revision: str | None = None

    def flag(self) -> str:
        """The entry as --lora-adapters spells it (the launcher passes resolved directories this way)."""
        return f"{self.name}={self.source}"


def parse_lora_adapters(text: str | None) -> tuple[LoraAdapterSpec, ...]:
    """`a=/path/a,owner/b@main` -> the entries, in order; names must be unique and not a base alias."""
    specs: list[LoraAdapterSpec] = []
    for raw in (text or "").split(","):
        entry = raw.strip()
        if not entry:
            continue
        name, sep, source = entry.partition("=")
        revision = None
        if not sep:
            source, _, rev = entry.partition("@")
            name, revision = source, rev or None
        name, source = name.strip(), source.strip()
        if not name or not source:
            raise ConfigError(f"--lora-adapters entries are name=PATH or a hub id[@revision], got {entry!r}")
        if name in (*BASE_MODEL_ALIASES, BASE_MODEL_LABEL):
            raise ConfigError(f"--lora-adapters: the name {name!r} is reserved for the base model")
        if any(s.name == name for s in specs):
            raise ConfigError(f"--lora-adapters: the name {name!r} is given twice")
        specs.append(LoraAdapterSpec(name, source, revision))
    return tuple(specs)
