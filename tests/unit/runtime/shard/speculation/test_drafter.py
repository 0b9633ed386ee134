"""RowDrafter pauses a row whose drafts keep failing; batch_drafts stops drafting in large batches."""

from __future__ import annotations

import pytest

from tgictl.config import SpeculationConfig
from tgictl.errors import ConfigError
from tgictl.runtime.shard.speculation.drafter import RowDrafter, batch_drafts

CONFIG = SpeculationConfig(tokens=4, min_acceptance=0.5, pause_steps=3)
REPEATING = [1, 2, 3, 4] * 4


def test_low_acceptance_pauses_drafting_then_it_resumes() -> None:
    drafter = RowDrafter.create(CONFIG)
    assert drafter.propose(REPEATING, 4) == [1, 2, 3, 4]
    for _ in range(4):  # 16 drafted, 4 accepted: below half
        drafter.record(4, 1, CONFIG)
    assert [drafter.propose(REPEATING, 4) for _ in range(3)] == [[], [], []]
    assert drafter.propose(REPEATING, 4) == [1, 2, 3, 4]


def test_good_acceptance_keeps_drafting() -> None:
    drafter = RowDrafter.create(CONFIG)
    for _ in range(8):
        drafter.record(4, 3, CONFIG)
        assert drafter.propose(REPEATING, 4) == [1, 2, 3, 4]


def test_large_batches_do_not_draft() -> None:
    config = SpeculationConfig(tokens=4, max_batch=4)
    assert batch_drafts(config, 4) and not batch_drafts(config, 5)
    assert not batch_drafts(SpeculationConfig(), 1)  # speculation off


@pytest.mark.parametrize(
    "kwargs, message",
    [({"tokens": 17}, "--speculate must be"), ({"ngram_min": 3, "ngram_max": 2}, "--speculate-ngram-min and --speculate-ngram-max"),
     ({"max_batch": 0}, "--speculate-max-batch"), ({"min_acceptance": 1.5}, "min acceptance")],
)
def test_bad_settings_are_one_clear_error(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SpeculationConfig(**kwargs)  # type: ignore[arg-type]
