"""finish_reason: TGI's order (LENGTH before EOS), ignore_eos, several EOS ids."""

from __future__ import annotations

from tgictl.proto.messages import FinishReason
from tgictl.runtime.shard.sampling.stopping import finish_reason

EOS = frozenset({0, 2})


def test_max_new_tokens_five_stops_on_the_fifth_token() -> None:
    reasons = [finish_reason(n, 7, 5, False, EOS) for n in range(1, 6)]
    assert reasons == [None, None, None, None, FinishReason.LENGTH]


def test_every_eos_id_stops_unless_ignored() -> None:
    assert finish_reason(1, 0, 5, False, EOS) == FinishReason.EOS_TOKEN
    assert finish_reason(1, 2, 5, False, EOS) == FinishReason.EOS_TOKEN
    assert finish_reason(1, 2, 5, True, EOS) is None
    assert finish_reason(1, 2, 5, False, frozenset()) is None


def test_length_wins_over_eos_on_the_same_token() -> None:
    assert finish_reason(5, 2, 5, False, EOS) == FinishReason.LENGTH
