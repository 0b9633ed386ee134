"""Sizes on the command line: binary and decimal units, plain bytes, and one-line refusals."""

from __future__ import annotations

import pytest

from tgictl.errors import UsageError
from tgictl.units import parse_size

GIB = 1 << 30


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4GiB", 4 * GIB), ("512MiB", 512 << 20), ("2G", 2 * GIB), ("1GB", 10**9), ("1.5KiB", 1536),
     ("123", 123), (" 64 kb ", 64000), ("7B", 7), ("1t", 1 << 40)],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-1GiB", "4 PiB", "GiB"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(UsageError, match=r"^--kv-cache-memory must be a size such as 4GiB"):
        parse_size(text)


def test_parse_size_names_the_option() -> None:
    with pytest.raises(UsageError, match=r"^--swap must be a size .*got 'x'$"):
        parse_size("x", "--swap")
