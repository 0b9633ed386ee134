"""The shell examples of README.md and docs/*.md, as the docs tests read them: every fenced `bash` / `sh` /
`shell` / `console` block, its lines joined where they end in a backslash, heredoc bodies left out, each
line split (quotes respected) into simple commands at `;`, `&&`, `||`, `|`, `&` and parentheses."""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PAGES = (REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")))
_FENCE = re.compile(r"^```(bash|sh|shell|console)\s*\n(.*?)^```", re.DOTALL | re.MULTILINE)
_HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")
_SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", ";;", "$("}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # the fence's line, 1-based
    language: str
    text: str  # the block's body as written

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO_ROOT)}:{self.line}"


def blocks(pages: tuple[Path, ...] = PAGES) -> list[Block]:
    found = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            found.append(Block(page, text.count("\n", 0, match.start()) + 1, match[1], match[2]))
    return found


def shell_lines(block: Block) -> list[str]:
    """The block's command lines: continuations joined, heredoc bodies and `$ ` prompts dropped."""
    out: list[str] = []
    pending = ""
    terminator: str | None = None
    for raw in block.text.splitlines():
        if terminator is not None:
            if raw.strip() == terminator:
                terminator = None
            continue
        line = raw.removeprefix("$ ")
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line = pending + line
        pending = ""
        if not _balanced(line):  # a quoted argument (a JSON body) goes on over the next lines
            pending = line + "\n"
            continue
        heredoc = _HEREDOC.search(line)
        if heredoc:
            terminator = heredoc[1]
        if line.strip():
            out.append(line)
    if pending.strip():
        raise ValueError(f"{block.where}: unfinished shell line: {pending}")
    return out


def _balanced(line: str) -> bool:
    try:
        shlex.split(line, comments=True)
    except ValueError:
        return False
    return True


def simple_commands(line: str) -> list[list[str]]:
    """`line` split into its simple commands' words (comments dropped)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands: list[list[str]] = [[]]
    try:
        for token in lexer:
            if token in _SEPARATORS or set(token) <= set(";&|()"):
                commands.append([])
            else:
                commands[-1].append(token)
    except ValueError as err:  # an unbalanced quote: the line is not shell
        raise ValueError(f"not a shell line ({err}): {line}") from None
    return [c for c in commands if c]


def tgictl_commands(block: Block) -> list[list[str]]:
    """Every `tgictl ...` invocation in the block (after `VAR=value` prefixes), as its words."""
    found = []
    for line in shell_lines(block):
        for words in simple_commands(line):
            while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
                words = words[1:]
            if words and words[0] == "tgictl":
                found.append(words)
    return found


def activated_env() -> dict[str, str]:
    """The environment of a shell with this interpreter's venv activated, as the docs assume (`python`,
    `tgictl` on PATH) even when pytest was started as `.venv/bin/python -m pytest`."""
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
