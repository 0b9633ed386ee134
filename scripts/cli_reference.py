"""The CLI reference page (docs/cli-reference.md) generated from the click app itself, so it cannot drift
from the flags: every command's `--help` as `tgictl COMMAND --help` prints it at 100 columns.

An MkDocs hook (mkdocs.yml `hooks:`): the page's `<!-- cli-reference -->` marker is replaced while the
site builds. `python scripts/cli_reference.py` prints the generated text.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import typer  # noqa: E402

from tgictl.cli import build_app  # noqa: E402

MARKER = "<!-- cli-reference -->"
WIDTH = 100


def _help(command: Any, info_name: str) -> str:
    ctx = command.context_class(command, info_name=info_name, terminal_width=WIDTH, max_content_width=WIDTH)
    return str(command.get_help(ctx)).rstrip()


def cli_reference_markdown() -> str:
    group = typer.main.get_command(build_app())
    parts = ["## `tgictl`", "", "```text", _help(group, "tgictl"), "```", ""]
    for name in group.commands:  # type: ignore[attr-defined]  (the order `tgictl --help` lists them in)
        command = group.commands[name]  # type: ignore[attr-defined]
        parts += [f"## `tgictl {name}`", "", "```text", _help(command, f"tgictl {name}"), "```", ""]
    return "\n".join(parts)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs hook: fill the marker (only the CLI reference page has it)."""
    return markdown.replace(MARKER, cli_reference_markdown()) if MARKER in markdown else markdown


if __name__ == "__main__":
    print(cli_reference_markdown())
