"""Workloads: exact token lengths through the real (tiny) tokenizer, shared prefixes, dataset files."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tgictl.errors import ConfigError
from tgictl.runtime.bench.workloads import (
    PromptMaker,
    cycle,
    file_workload,
    parse_range,
    random_workload,
    shared_prefix_workload,
)
from tgictl.runtime.router.text.tokenizer import RouterTokenizer


@pytest.fixture(scope="module")
def maker(tiny_tokenizer_dir: Path) -> PromptMaker:
    return PromptMaker(RouterTokenizer(tiny_tokenizer_dir))


def test_parse_range() -> None:
    assert parse_range("128", "--input-len") == (128, 128)
    assert parse_range("16:64", "--input-len") == (16, 64)
    for bad in ("0", "8:4", "a:b", "1:2:3", ""):
        with pytest.raises(ConfigError, match="--input-len"):
            parse_range(bad, "--input-len")


@pytest.mark.parametrize("target", [1, 2, 7, 64, 300])
def test_prompts_have_exactly_the_asked_token_count(maker: PromptMaker, target: int) -> None:
    rng = random.Random(target)
    for _ in range(5):
        text = maker.text(rng, target)
        assert len(maker.tokenizer.encode(text)) == target


def test_prompt_with_a_fixed_prefix(maker: PromptMaker) -> None:
    rng = random.Random(1)
    prefix = maker.text(rng, 20)
    text = maker.text(rng, 33, prefix=prefix)
    assert text.startswith(prefix) and maker.count(text) == 33
    with pytest.raises(ConfigError, match="fixed part alone has 20 tokens"):
        maker.text(rng, 19, prefix=prefix)


def test_random_workload_is_seeded_and_within_its_ranges(maker: PromptMaker) -> None:
    prompts = random_workload(maker, 20, (5, 40), (3, 9), seed=7)
    assert len(prompts) == 20
    for p in prompts:
        assert 5 <= p.prompt_tokens <= 40 and maker.count(p.text) == p.prompt_tokens  # type: ignore[operator]
        assert 3 <= p.max_new_tokens <= 9
        assert p.message_dicts() == [{"role": "user", "content": p.text}] and p.group is None
    assert len({p.prompt_tokens for p in prompts}) > 1  # lengths are drawn, not fixed
    assert random_workload(maker, 20, (5, 40), (3, 9), seed=7) == prompts
    assert random_workload(maker, 20, (5, 40), (3, 9), seed=8) != prompts
    assert cycle(prompts, 21) == prompts[1]


def test_shared_prefix_groups_share_their_system_prompt(maker: PromptMaker) -> None:
    prompts = shared_prefix_workload(maker, groups=3, prompts_per_group=4, prefix_len=48, input_len=(4, 10),
                                     output_len=(2, 2), seed=0)
    assert [p.group for p in prompts] == [0] * 4 + [1] * 4 + [2] * 4  # group-major
    systems = []
    for group in range(3):
        members = prompts[group * 4:(group + 1) * 4]
        system = members[0].messages[0]
        assert system[0] == "system" and maker.count(system[1]) == 48
        for p in members:
            assert p.messages[0] == system and p.text.startswith(system[1])
            assert 52 <= p.prompt_tokens <= 58 and maker.count(p.text) == p.prompt_tokens  # type: ignore[operator]
            assert p.messages[1][0] == "user" and p.messages[1][1] and p.max_new_tokens == 2
        systems.append(system[1])
    assert len(set(systems)) == 3
    with pytest.raises(ConfigError, match="--groups"):
        shared_prefix_workload(maker, 0, 1, 8, (1, 1), (1, 1), 0)


def test_file_workload_reads_sharegpt_messages_and_prompts(tmp_path: Path, maker: PromptMaker) -> None:
    lines = [
        {"id": "a", "conversations": [{"from": "human", "value": "hello world"},
                                      {"from": "gpt", "value": "the quick brown fox"},
                                      {"from": "human", "value": "again"}]},
        {"messages": [{"role": "system", "content": "be short"}, {"role": "user", "content": "the fox"}]},
        {"prompt": "hello the"},
    ]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n", encoding="utf-8")
    prompts = file_workload(path, maker, None, None, (5, 5), seed=0)
    assert [p.text for p in prompts] == ["hello world", "the fox", "hello the"]
    assert prompts[0].messages == (("user", "hello world"),)
    # The reference reply sizes the output when no --output-len is given.
    assert prompts[0].max_new_tokens == len(maker.tokenizer.encode("the quick brown fox", add_special_tokens=False))
    assert prompts[1].messages == (("system", "be short"), ("user", "the fox")) and prompts[1].max_new_tokens == 5
    assert [p.prompt_tokens for p in prompts] == [maker.count(p.text) for p in prompts]
    # --output-len wins, --num-requests cuts, a JSON array (ShareGPT's own dump) reads the same.
    assert [p.max_new_tokens for p in file_workload(path, None, 2, (3, 3), (5, 5), 0)] == [3, 3]
    array = tmp_path / "data.json"
    array.write_text(json.dumps(lines), encoding="utf-8")
    assert [p.text for p in file_workload(array, None, None, None, (5, 5), 0)] == [p.text for p in prompts]
    assert file_workload(array, None, None, None, (5, 5), 0)[0].prompt_tokens is None


def test_file_workload_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n{"conversations": [{"from": "alien", "value": "x"}]}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: turn 0 needs a known role"):
        file_workload(path, None, None, None, (1, 1), 0)
    path.write_text("not json\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="is not JSON lines"):
        file_workload(path, None, None, None, (1, 1), 0)
    with pytest.raises(ConfigError, match="cannot read --dataset"):
        file_workload(tmp_path / "missing.jsonl", None, None, None, (1, 1), 0)
