"""A compiled grammar walked through its first steps at validation, so a grammar the engine cannot follow is
a 422 there instead of a failure while generating (docs/architecture.md, "Guided generation": limits).

llguidance validates a grammar's text, but some grammars that compile trip its parser limits only once
tokens arrive: an object of 3,000 optional properties (a row of 12,007 Earley items at its first key; the
limit is 2,000), an `anyOf` of 3,000 objects, a recursive `$ref` whose property is required (over 50,000
items: no finite instance exists), or a root that only refers to itself (no token is ever allowed). The
probe builds a matcher, takes the forced prefix, computes the first free mask and feeds each of its first
PROBED_TOKENS allowed tokens to a copy: every case above fails there. A grammar that fails only deeper
(after free text the model chooses) still ends just its own request on the shard (Generation.error).
"""

from __future__ import annotations

import llguidance
import numpy as np

# Grammar text (llguidance's JSON form) a request may carry: compiling one costs the router and every shard
# about 8 ms per 1,000 characters; docs/operations.md ("Grammars") lists the limits.
MAX_GRAMMAR_CHARS = 256 * 1024
# Allowed first tokens fed to the probe: the lowest ids are the single bytes (`{`, `"`, `[`, digits), with
# which every JSON value, and most grammars' alternatives, begin.
PROBED_TOKENS = 16


def _first_line(message: str) -> str:
    """llguidance's first line (the rest is its parser state)."""
    lines = message.strip().splitlines()
    return lines[0] if lines else "no detail"


def probe_error(text: str, tokenizer: llguidance.LLTokenizer) -> str | None:
    """Why the engine cannot follow `text` through its first steps, or None."""
    if len(text) > MAX_GRAMMAR_CHARS:
        return (f"the grammar is {len(text)} characters once compiled; at most {MAX_GRAMMAR_CHARS} are accepted "
                "(a smaller schema, fewer tools or fewer alternatives)")
    matcher = llguidance.LLMatcher(tokenizer, text, log_level=0)
    forced = matcher.compute_ff_tokens()
    if forced and not matcher.consume_tokens(forced) or matcher.is_error():
        return _limit(matcher)
    if matcher.is_stopped():
        return None
    mask = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
    allowed = np.flatnonzero(mask[: tokenizer.vocab_size])
    if matcher.is_error() or (allowed.size == 0 and not matcher.is_accepting()):
        return ("no output can follow this grammar: it allows no first token (a schema without a finite "
                f"instance, such as a root that only refers to itself?): {_first_line(matcher.get_error())}")
    for token in allowed[:PROBED_TOKENS].tolist():
        attempt = matcher.deep_copy()
        if not attempt.consume_token(token) or attempt.is_error():
            return _limit(attempt)
    return None


def _limit(matcher: llguidance.LLMatcher) -> str:
    return f"the grammar engine cannot follow it: {_first_line(matcher.get_error())}"
