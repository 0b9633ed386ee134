"""The speculative-decoding flags `tgictl shard` and `tgictl launch` share (TGI's --speculate)."""

from __future__ import annotations

from typing import Optional

import typer

from tgictl.config import SpeculationConfig
from tgictl.env import Env
from tgictl.errors import ConfigError

SPECULATE = typer.Option(
    None, "--speculate", show_default=False,
    help="Draft up to N tokens per step from n-grams of the request's own text and verify them in the same "
    "forward (default: $SPECULATE, else 0 = off). Output is unchanged; repetitive text gets faster.",
)
NGRAM_MIN = typer.Option(1, "--speculate-ngram-min", help="Shortest suffix looked up for a draft.")
NGRAM_MAX = typer.Option(3, "--speculate-ngram-max", help="Longest suffix looked up (the longest match wins).")
MAX_BATCH = typer.Option(
    4, "--speculate-max-batch", help="Steps with more decoding requests than this draft nothing (compute-bound)."
)


def speculation_config(tokens: Optional[int], ngram_min: int, ngram_max: int, max_batch: int, env: Env) -> SpeculationConfig:
    """The flags, with $SPECULATE standing in for an absent --speculate."""
    chosen = tokens if tokens is not None else (env.speculate or 0)
    try:
        return SpeculationConfig(tokens=chosen, ngram_min=ngram_min, ngram_max=ngram_max, max_batch=max_batch)
    except ConfigError as err:
        if tokens is None and env.speculate is not None and err.message.startswith("--speculate must"):
            raise ConfigError(f"{err.message} (from SPECULATE)") from None
        raise

