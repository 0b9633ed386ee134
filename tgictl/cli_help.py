"""`--help` that reads at any width, 80 columns and pipes included.

Typer's rich help lays options out in a table whose name column it squeezes, so at 80 columns it cut
flag names (`--max-batch-prefi…`). The plain layout (click's) never cuts a name: a long one puts its
description on the next line, and only descriptions wrap. Its wrapper also breaks words at hyphens,
which splits a flag named inside a description (`--replica-` / `cpus`); the formatter here wraps at
spaces only. `plain_help(app)` puts every command of an app on this layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

# A hyphen no text wrapper breaks at, standing in for every hyphen while text is wrapped (one character
# for one, so every width is computed as for the real text).
_UNBREAKABLE_HYPHEN = "\u2011"


def _protect(text: str) -> str:
    return text.replace("-", _UNBREAKABLE_HYPHEN)


def _restore(text: str) -> str:
    return text.replace(_UNBREAKABLE_HYPHEN, "-")


_Formatter: Any = TyperCommand.context_class.formatter_class


class FlagSafeFormatter(_Formatter):  # type: ignore[misc, valid-type]
    """The plain help formatter, wrapping descriptions at spaces only (a flag named in one stays whole)."""

    def write_text(self, text: str) -> None:
        start = len(self.buffer)
        super().write_text(_protect(text))
        self.buffer[start:] = [_restore(piece) for piece in self.buffer[start:]]

    def write_dl(self, rows: Sequence[tuple[str, str]], col_max: int = 30, col_spacing: int = 2) -> None:
        start = len(self.buffer)
        super().write_dl([(term, _protect(text)) for term, text in rows], col_max, col_spacing)
        self.buffer[start:] = [_restore(piece) for piece in self.buffer[start:]]


class _Context(TyperCommand.context_class):  # type: ignore[misc, valid-type]
    formatter_class = FlagSafeFormatter


class FlagSafeCommand(TyperCommand):
    context_class = _Context


class FlagSafeGroup(TyperGroup):
    context_class = _Context


def plain_help(app: typer.Typer) -> None:
    """Every command registered on `app` so far formats its help with FlagSafeFormatter; the app itself
    is built with `cls=FlagSafeGroup, rich_markup_mode=None`."""
    for info in app.registered_commands:
        if info.cls in (None, TyperCommand):  # not a class of its own
            info.cls = FlagSafeCommand
