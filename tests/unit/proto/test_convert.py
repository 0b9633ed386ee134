"""Every contract message survives dataclass -> protobuf bytes -> dataclass unchanged, and malformed
protobuf input is rejected with InvalidRequestError."""

from __future__ import annotations

import math
import os
import re
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tgictl.errors import InvalidRequestError
from tgictl.proto import convert
from tgictl.proto import generate_pb2 as pb
from tgictl.proto.messages import (
    Batch,
    BlockGrant,
    CachedBatch,
    ClearCacheRequest,
    DecodeRequest,
    FilterBatchRequest,
    FinishReason,
    GeneratedText,
    Generation,
    Grammar,
    GrammarType,
    Info,
    LoadAdapterRequest,
    PrefillRequest,
    Request,
    SamplingParams,
    StepResult,
    StoppingParams,
    Timings,
    Tokens,
    WarmupRequest,
    WarmupResult,
)

U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1
NAN = float("nan")


def wire_round_trip(value: Any, to_pb: Callable[[Any], Any], from_pb: Callable[[Any], Any]) -> Any:
    """Converts, serializes to bytes, parses and converts back: exactly what crosses the socket."""
    message = to_pb(value)
    parsed = type(message).FromString(message.SerializeToString())
    return from_pb(parsed)


def same(a: Any, b: Any) -> bool:
    """Equality that treats NaN as equal to NaN. repr is exact for floats, shows NaN as `nan`, and
    distinguishes True from 1 and None from 0, so equal reprs mean equal values of equal types."""
    return repr(a) == repr(b)


SAMPLED = SamplingParams(
    temperature=0.5,  # float32-exact values: the wire carries float32
    top_k=40,
    top_p=0.875,
    typical_p=0.75,
    min_p=0.0625,
    do_sample=True,
    seed=U64_MAX,
    repetition_penalty=1.25,
    frequency_penalty=-2.0,
    presence_penalty=1.5,
    grammar=Grammar(type=GrammarType.LLGUIDANCE, value='{"grammars": []}', replay_tokens=U32_MAX),
    step_offset=U32_MAX,
)
FULL_REQUEST = Request(
    id=U64_MAX,
    input_ids=(1, 0, U32_MAX, 7),
    sampling=SAMPLED,
    stopping=StoppingParams(max_new_tokens=U32_MAX, ignore_eos=True),
    blocks=(0, 3),
    cache_len=16,
    chunk_len=8,
    prefill_logprobs=True,
    top_n_tokens=5,
)
BARE_REQUEST = Request(id=0, input_ids=(), sampling=SamplingParams(), stopping=StoppingParams(1))
CACHED = CachedBatch(id=U64_MAX, request_ids=(U64_MAX, 0, 5), max_tokens=4096, current_tokens=3)
EMPTY_CACHED = CachedBatch(id=0, request_ids=(), max_tokens=0, current_tokens=0)
FULL_GENERATION = Generation(
    request_id=U64_MAX,
    tokens=Tokens(ids=(42, 7), logprobs=(-0.25, 0.0)),
    prefill_tokens=Tokens(ids=(1, 2, 3), logprobs=(NAN, -1.5, -math.inf)),
    top_tokens=(Tokens(ids=(42, 9), logprobs=(-0.25, -3.0)), Tokens()),
    generated_text=GeneratedText(generated_tokens=2, finish_reason=FinishReason.EOS_TOKEN, seed=U64_MAX),
    draft_tokens=4,
    accepted_tokens=1,
)
BARE_GENERATION = Generation(request_id=0, tokens=Tokens(ids=(5,), logprobs=(-0.5,)))
STEP = StepResult(
    generations=(FULL_GENERATION, BARE_GENERATION),
    batch=CACHED,
    timings=Timings(forward_ns=U64_MAX, decode_ns=1, total_ns=2, concat_ns=0),
)
INFO = Info(
    dtype="bfloat16",
    device_type="cuda",
    block_size=16,
    support_chunking=True,
    use_prefix_caching=True,
    attention_impl="paged",
    model_type="llama",
    vocab_size=128256,
    num_layers=32,
    max_position_embeddings=131072,
    eos_token_ids=(128001, 128008, 128009),
    world_size=2,
    requires_padding=True,
    speculate=2,
    layer_windows=(4096, 0) * 16,  # Gemma 2's alternation: a window, then the whole context
)

C = convert
CASES: list[tuple[str, Any, Callable[[Any], Any], Callable[[Any], Any]]] = [
    ("sampling defaults", SamplingParams(), C.sampling_to_pb, C.sampling_from_pb),
    ("sampling all set", SAMPLED, C.sampling_to_pb, C.sampling_from_pb),
    ("sampling regex", SamplingParams(grammar=Grammar(GrammarType.REGEX, "a+")), C.sampling_to_pb, C.sampling_from_pb),
    ("stopping", StoppingParams(max_new_tokens=3), C.stopping_to_pb, C.stopping_from_pb),
    ("request full", FULL_REQUEST, C.request_to_pb, C.request_from_pb),
    ("request bare", BARE_REQUEST, C.request_to_pb, C.request_from_pb),
    (
        "request chunk_len 0",
        Request(0, (1,), SamplingParams(), StoppingParams(1), chunk_len=0),
        C.request_to_pb,
        C.request_from_pb,
    ),
    (
        "batch",
        Batch(id=U64_MAX, requests=(FULL_REQUEST, BARE_REQUEST), max_tokens=99, max_blocks=4),
        C.batch_to_pb,
        C.batch_from_pb,
    ),
    ("batch empty", Batch(id=0, requests=()), C.batch_to_pb, C.batch_from_pb),
    ("cached batch", CACHED, C.cached_batch_to_pb, C.cached_batch_from_pb),
    ("cached batch empty", EMPTY_CACHED, C.cached_batch_to_pb, C.cached_batch_from_pb),
    ("tokens empty", Tokens(), C.tokens_to_pb, C.tokens_from_pb),
    ("tokens nan", Tokens(ids=(0, U32_MAX), logprobs=(NAN, -0.125)), C.tokens_to_pb, C.tokens_from_pb),
    *[
        (
            f"generated text {reason.name} seed {seed}",
            GeneratedText(3, reason, seed),
            C.generated_text_to_pb,
            C.generated_text_from_pb,
        )
        for reason in FinishReason
        for seed in (None, 0, U64_MAX)
    ],
    ("generation full", FULL_GENERATION, C.generation_to_pb, C.generation_from_pb),
    ("generation bare", BARE_GENERATION, C.generation_to_pb, C.generation_from_pb),
    (
        # Present-but-default sub-messages must not collapse into absent ones (None).
        "generation with default-valued parts",
        Generation(0, Tokens(), Tokens(), (Tokens(),), GeneratedText(0, FinishReason.LENGTH, None)),
        C.generation_to_pb,
        C.generation_from_pb,
    ),
    (
        "request with default sampling and stopping",
        Request(
            0,
            (),
            SamplingParams(temperature=0.0, top_p=0.0, typical_p=0.0, repetition_penalty=0.0),
            StoppingParams(0),
        ),
        C.request_to_pb,
        C.request_from_pb,
    ),
    ("prefill response", STEP, C.prefill_response_to_pb, C.prefill_response_from_pb),
    ("decode response", STEP, C.decode_response_to_pb, C.decode_response_from_pb),
    (
        "decode response finished",
        StepResult(generations=(), batch=None),
        C.decode_response_to_pb,
        C.decode_response_from_pb,
    ),
    (
        "prefill request",
        PrefillRequest(Batch(1, (FULL_REQUEST,)), CACHED, 512, (BlockGrant(U64_MAX, (4, U32_MAX)), BlockGrant(5, ()))),
        C.prefill_request_to_pb,
        C.prefill_request_from_pb,
    ),
    (
        "prefill request no cached",
        PrefillRequest(Batch(1, ())),
        C.prefill_request_to_pb,
        C.prefill_request_from_pb,
    ),
    (
        "decode request",
        DecodeRequest((CACHED, EMPTY_CACHED)),
        C.decode_request_to_pb,
        C.decode_request_from_pb,
    ),
    ("decode request empty", DecodeRequest(()), C.decode_request_to_pb, C.decode_request_from_pb),
    ("decode request of 4 steps", DecodeRequest((CACHED,), 4), C.decode_request_to_pb, C.decode_request_from_pb),
    ("block grant", BlockGrant(U64_MAX, (0, U32_MAX)), C.block_grant_to_pb, C.block_grant_from_pb),
    ("block grant empty", BlockGrant(0, ()), C.block_grant_to_pb, C.block_grant_from_pb),
    (
        "decode request with grants",
        DecodeRequest((CACHED,), 2, (BlockGrant(0, (7,)), BlockGrant(U64_MAX, (1, 2, 3)))),
        C.decode_request_to_pb,
        C.decode_request_from_pb,
    ),
    (
        "filter request",
        FilterBatchRequest(U64_MAX, (U64_MAX, 1)),
        C.filter_batch_request_to_pb,
        C.filter_batch_request_from_pb,
    ),
    (
        "filter request empty",
        FilterBatchRequest(3, ()),
        C.filter_batch_request_to_pb,
        C.filter_batch_request_from_pb,
    ),
    ("filter response", CACHED, C.filter_batch_response_to_pb, C.filter_batch_response_from_pb),
    *[
        (
            f"clear cache {batch_id}",
            ClearCacheRequest(batch_id),
            C.clear_cache_request_to_pb,
            C.clear_cache_request_from_pb,
        )
        for batch_id in (None, 0, U64_MAX)
    ],
    (
        "warmup request",
        WarmupRequest(Batch(0, (BARE_REQUEST,)), 4096, max_input_tokens=0, max_total_tokens=U32_MAX),
        C.warmup_request_to_pb,
        C.warmup_request_from_pb,
    ),
    (
        "warmup request unset",
        WarmupRequest(Batch(0, ()), 1),
        C.warmup_request_to_pb,
        C.warmup_request_from_pb,
    ),
    (
        "warmup response",
        WarmupResult(U32_MAX, 1024, 2048),
        C.warmup_response_to_pb,
        C.warmup_response_from_pb,
    ),
    ("info", INFO, C.info_to_pb, C.info_from_pb),
    (
        "service discovery",
        ("unix:///tmp/t-0", "unix:///tmp/t-1"),
        C.service_discovery_response_to_pb,
        C.service_discovery_response_from_pb,
    ),
    ("service discovery empty", (), C.service_discovery_response_to_pb, C.service_discovery_response_from_pb),
    ("load adapter", LoadAdapterRequest("sql", "/adapters/sql", 3), C.load_adapter_request_to_pb,
     C.load_adapter_request_from_pb),
    ("unload adapter", 2, C.unload_adapter_request_to_pb, C.unload_adapter_request_from_pb),
]


@pytest.mark.parametrize(("value", "to_pb", "from_pb"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_round_trip_is_exact(value: Any, to_pb: Callable[[Any], Any], from_pb: Callable[[Any], Any]) -> None:
    assert same(wire_round_trip(value, to_pb, from_pb), value)


def test_every_proto_message_has_a_tested_converter() -> None:
    empty = {
        "HealthRequest",
        "HealthResponse",
        "InfoRequest",
        "ServiceDiscoveryRequest",
        "ClearCacheResponse",
        "LoadAdapterResponse",
        "UnloadAdapterResponse",
    }
    tested = {type(to_pb(value)).__name__ for _, value, to_pb, _ in CASES}
    assert tested | empty == set(pb.DESCRIPTOR.message_types_by_name)
    for name in empty:
        assert getattr(pb, name).DESCRIPTOR.fields == []


def test_optional_fields_stay_absent_on_the_wire() -> None:
    assert not C.request_to_pb(BARE_REQUEST).HasField("chunk_len")
    assert C.request_to_pb(FULL_REQUEST).HasField("chunk_len")
    assert not C.generation_to_pb(BARE_GENERATION).HasField("prefill_tokens")
    assert not C.generation_to_pb(BARE_GENERATION).HasField("generated_text")
    finished = C.decode_response_to_pb(StepResult(generations=(), batch=None))
    assert not finished.HasField("batch") and not finished.HasField("concat_ns")
    assert not C.clear_cache_request_to_pb(ClearCacheRequest()).HasField("id")


def test_converting_imports_no_torch() -> None:
    # The router converts too, and must never import torch (docs/architecture.md, "Processes": the router has no torch).
    code = "import sys, tgictl.proto.convert, tgictl.proto.generate_pb2_grpc; print('torch' in sys.modules)"
    repo = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=env,
        cwd=repo,
    )
    assert done.stdout.strip() == "False"


def test_sizes_are_sent() -> None:
    assert C.batch_to_pb(Batch(1, (BARE_REQUEST, FULL_REQUEST))).size == 2
    assert C.cached_batch_to_pb(CACHED).size == 3


def test_floats_arrive_as_float32() -> None:
    got = wire_round_trip(SamplingParams(temperature=0.7), C.sampling_to_pb, C.sampling_from_pb)
    assert got.temperature == struct.unpack("f", struct.pack("f", 0.7))[0]
    assert got.temperature != 0.7


def test_finish_reasons_match_the_proto_enum() -> None:
    assert {r.name: r.value for r in FinishReason} == {
        name.removeprefix("FINISH_REASON_"): value for name, value in pb.FinishReason.items()
    }


def test_kept_tgi_field_numbers_and_additions() -> None:
    def number(message: Any, field: str) -> int:
        return int(message.DESCRIPTOR.fields_by_name[field].number)

    assert [
        number(pb.Request, f) for f in ("id", "blocks", "cache_len", "chunk_len", "input_ids")
    ] == [1, 9, 12, 14, 15]
    assert "slots" not in pb.Request.DESCRIPTOR.fields_by_name  # derived from the blocks on the shard
    assert [
        number(pb.NextTokenChooserParameters, f) for f in ("frequency_penalty", "min_p", "presence_penalty")
    ] == [9, 13, 14]
    assert [
        number(pb.Generation, f)
        for f in ("request_id", "prefill_tokens", "tokens", "generated_text", "top_tokens")
    ] == [1, 2, 3, 4, 5]
    assert "texts" not in pb.Tokens.DESCRIPTOR.fields_by_name
    assert "text" not in pb.GeneratedText.DESCRIPTOR.fields_by_name


def _request_pb_without(field: str) -> pb.Request:
    message = C.request_to_pb(FULL_REQUEST)
    message.ClearField(field)
    return message


@pytest.mark.parametrize(
    ("convert_fn", "message", "error"),
    [
        (
            C.request_from_pb,
            _request_pb_without("parameters"),
            "request 18446744073709551615: field `parameters`",
        ),
        (
            C.request_from_pb,
            _request_pb_without("stopping_parameters"),
            "field `stopping_parameters` is required",
        ),
        (C.batch_from_pb, pb.Batch(id=4, size=1), "batch 4: size is 1 but it lists 0 requests"),
        (
            C.cached_batch_from_pb,
            pb.CachedBatch(id=2, request_ids=[1, 2], size=3),
            "cached batch 2: size is 3 but it lists 2 requests",
        ),
        (C.tokens_from_pb, pb.Tokens(ids=[1, 2], logprobs=[-1.0]), "tokens: 2 ids but 1 logprobs"),
        (C.generation_from_pb, pb.Generation(tokens=pb.Tokens(ids=[1])), "tokens: 1 ids but 0 logprobs"),
        (C.generated_text_from_pb, pb.GeneratedText(finish_reason=7), "unknown finish_reason 7"),  # type: ignore[arg-type]
        (C.prefill_request_from_pb, pb.PrefillRequest(), "prefill request: field `batch` is required"),
        (C.warmup_request_from_pb, pb.WarmupRequest(), "warmup request: field `batch` is required"),
        (C.filter_batch_response_from_pb, pb.FilterBatchResponse(), "field `batch` is required"),
        (
            C.decode_request_from_pb,
            pb.DecodeRequest(batches=[pb.CachedBatch(request_ids=[1])]),
            "size is 0 but it lists 1 requests",
        ),
    ],
)
def test_malformed_messages_are_rejected(convert_fn: Callable[[Any], Any], message: Any, error: str) -> None:
    with pytest.raises(InvalidRequestError, match=re.escape(error)):
        convert_fn(message)


float32s = st.floats(width=32, allow_nan=True, allow_infinity=True)
u32s = st.integers(0, U32_MAX)
u64s = st.integers(0, U64_MAX)


@st.composite
def tokens_strategy(draw: st.DrawFn) -> Tokens:
    ids = draw(st.lists(u32s, max_size=5))
    logprobs = draw(st.lists(float32s, min_size=len(ids), max_size=len(ids)))
    return Tokens(ids=tuple(ids), logprobs=tuple(logprobs))


generations = st.builds(
    Generation,
    request_id=u64s,
    tokens=tokens_strategy(),
    prefill_tokens=st.none() | tokens_strategy(),
    top_tokens=st.lists(tokens_strategy(), max_size=3).map(tuple),
    generated_text=st.none()
    | st.builds(
        GeneratedText,
        generated_tokens=u32s,
        finish_reason=st.sampled_from(FinishReason),
        seed=st.none() | u64s,
    ),
)


@given(
    st.lists(generations, max_size=4),
    st.none()
    | st.builds(
        CachedBatch,
        id=u64s,
        request_ids=st.lists(u64s, max_size=4).map(tuple),
        max_tokens=u32s,
        current_tokens=u32s,
    ),
    st.none() | u64s,
)
def test_decode_response_round_trip_property(
    gens: list[Generation], batch: CachedBatch | None, concat_ns: int | None
) -> None:
    step = StepResult(generations=tuple(gens), batch=batch, timings=Timings(3, 2, 1, concat_ns))
    assert same(wire_round_trip(step, C.decode_response_to_pb, C.decode_response_from_pb), step)


@pytest.mark.parametrize(("fields", "message"), [
    ({"grammar": "a+"}, "needs a grammar_type"),
    ({"grammar_type": 2}, "grammar is empty"),
    ({"grammar": "a+", "grammar_type": 9}, "unknown grammar_type 9"),
])
def test_inconsistent_grammars_are_invalid(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        C.sampling_from_pb(pb.NextTokenChooserParameters(**fields))


def test_grammar_types_match_the_proto_enum() -> None:
    assert {name.removeprefix("GRAMMAR_TYPE_"): value for name, value in pb.GrammarType.items()} == {
        t.name: int(t) for t in GrammarType
    }
