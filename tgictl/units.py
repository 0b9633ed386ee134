"""Human-readable quantities on the command line: memory sizes such as "4GiB" → bytes."""

from __future__ import annotations

import re

from tgictl.errors import UsageError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
# Binary units for K/M/G/T with or without "i"/"iB" (memory is sized in powers of two); "KB"/"MB"/...
# are the decimal units their names promise.
_SIZE_UNITS: dict[str, int] = {"": 1, "b": 1} | {
    spelling: base**power
    for power, letter in enumerate("kmgt", start=1)
    for spelling, base in ((letter, 1024), (f"{letter}i", 1024), (f"{letter}ib", 1024), (f"{letter}b", 1000))
}


def parse_size(text: str, option: str = "--kv-cache-memory") -> int:
    """"4GiB", "512MiB", "2G" (binary), "1GB" (decimal) or plain bytes → bytes. `option` names the flag
    in the error (every caller so far parses --kv-cache-memory)."""
    match = _SIZE.match(text)
    if match is None:
        raise UsageError(f"{option} must be a size such as 4GiB, 512MiB or 1000000, got {text!r}")
    number, unit = match.groups()
    return int(float(number) * _SIZE_UNITS[(unit or "").lower()])
