"""The shard's grammar pieces: bit masks, the matcher cache and replay, masks from the worker thread,
and forced tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tgictl.proto.messages import Grammar, GrammarType
from tgictl.runtime.guidance import json_schema_grammar
from tgictl.runtime.shard.sampling.grammar import GrammarCompiler, GrammarFailure, MaskJob, advance, unpack_bitmask
from tgictl.testing.grammar_cases import SCHEMAS

LONG_KEYS = Grammar(GrammarType.LLGUIDANCE, json_schema_grammar(SCHEMAS["long_keys"][0], strict=True))


@pytest.fixture(scope="module")
def compiler(tiny_model_dir: Path) -> GrammarCompiler:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    return GrammarCompiler(tiny_model_dir, config["vocab_size"], (config["eos_token_id"],))


def test_unpack_bitmask_reads_bit_j_of_word_w_as_token_32w_plus_j() -> None:
    words = torch.tensor([[0b101, -(2**31)], [-1, 1]], dtype=torch.int32)
    allowed = unpack_bitmask(words, 40)
    assert allowed.shape == (2, 40) and allowed.dtype == torch.bool
    assert allowed[0].nonzero().flatten().tolist() == [0, 2]  # bit 31 of word 1 is token 63: cut off
    assert allowed[1].nonzero().flatten().tolist() == list(range(33))


def test_worker_masks_equal_the_matchers_own(compiler: GrammarCompiler) -> None:
    matchers = [compiler.matcher(LONG_KEYS, ()), compiler.matcher(Grammar(GrammarType.REGEX, "[0-9]{2}"), ())]
    job = MaskJob(compiler, [(matchers[0], 0), (matchers[1], 2)], 3)
    allowed = job.allowed(compiler.vocab_size, torch.device("cpu"))
    for row, matcher in ((0, matchers[0]), (2, matchers[1])):
        own = torch.frombuffer(bytearray(matcher.compute_bitmask()), dtype=torch.int32).unsqueeze(0)
        assert torch.equal(allowed[row], unpack_bitmask(own, compiler.vocab_size)[0])
    assert allowed[1].all()  # a row without a grammar allows everything
    assert job.compute_s > 0 and job.wait_s >= 0


def test_matchers_are_cached_copies_and_replay_earlier_tokens(compiler: GrammarCompiler) -> None:
    grammar = Grammar(GrammarType.REGEX, "(ab)+")
    tokenizer = compiler.tokenizer
    ids = tokenizer.tokenize_str("abab")
    first = compiler.matcher(grammar, ())
    assert first.consume_tokens(ids) and first.is_accepting()
    fresh = compiler.matcher(grammar, ())  # the cached template was not advanced
    assert not fresh.is_accepting()
    replayed = compiler.matcher(grammar, ids)
    assert replayed.is_accepting()
    with pytest.raises(GrammarFailure, match="replayed tokens do not follow it"):
        compiler.matcher(grammar, tokenizer.tokenize_str("ba"))
    with pytest.raises(GrammarFailure, match="grammar is not valid"):
        compiler.matcher(Grammar(GrammarType.REGEX, "(a"), ())


def test_advance_forces_the_only_continuation_within_the_limit(compiler: GrammarCompiler) -> None:
    eos = frozenset({compiler.eos_token_ids[0]})
    tokenizer = compiler.tokenizer
    matcher = compiler.matcher(LONG_KEYS, ())
    brace = tokenizer.tokenize_str("{")
    forced = advance(matcher, brace[0], 100, eos)
    assert tokenizer.decode_str(forced) == '"customer_account_identifier": '  # the key is the only way on
    limited = compiler.matcher(LONG_KEYS, ())
    assert len(advance(limited, brace[0], 2, eos)) == 2
    assert advance(compiler.matcher(LONG_KEYS, ()), brace[0], 0, eos) == []


def test_advance_forces_eos_at_the_grammars_end_and_nothing_after_a_sampled_eos(compiler: GrammarCompiler) -> None:
    eos_id = compiler.eos_token_ids[0]
    eos = frozenset({eos_id})
    tokenizer = compiler.tokenizer
    first = tokenizer.tokenize_str("y")[0]
    complete = advance(compiler.matcher(Grammar(GrammarType.REGEX, "yes"), ()), first, 10, eos)
    assert complete[-1] == eos_id and tokenizer.decode_str(complete[:-1]) == "es"  # then only EOS is possible
    open_ended = compiler.matcher(Grammar(GrammarType.REGEX, "yes(sir)?"), ())
    forced = advance(open_ended, first, 10, eos)
    assert eos_id not in forced  # "yes" may go on: the model decides between EOS and "sir"
    assert open_ended.consume_tokens(tokenizer.tokenize_str("yes"[1 + len(tokenizer.decode_str(forced)):]))
    assert advance(open_ended, eos_id, 10, eos) == []


def test_a_model_without_tokenizer_refuses_grammars(tmp_path: Path) -> None:
    compiler = GrammarCompiler(tmp_path, 512, (0,))
    with pytest.raises(GrammarFailure, match="cannot follow grammars: .*no tokenizer.json"):
        compiler.matcher(LONG_KEYS, ())


def test_the_vocabulary_is_built_on_the_first_grammar_not_at_load(tiny_model_dir: Path) -> None:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    compiler = GrammarCompiler(tiny_model_dir, config["vocab_size"], (config["eos_token_id"],))
    assert not compiler.vocabulary_built  # a shard that never sees a grammar never pays for it
    matcher = compiler.matcher(Grammar(GrammarType.REGEX, "[0-9]+"), ())
    assert compiler.vocabulary_built and not matcher.is_error()
    assert compiler.tokenizer is compiler.tokenizer  # built once


def test_a_vocabulary_that_cannot_be_built_refuses_grammar_requests(tmp_path: Path) -> None:
    compiler = GrammarCompiler(tmp_path, 100, (0,))  # no tokenizer.json here
    with pytest.raises(GrammarFailure, match="cannot follow grammars"):
        compiler.matcher(Grammar(GrammarType.REGEX, "[0-9]+"), ())
    assert compiler.vocabulary_built
