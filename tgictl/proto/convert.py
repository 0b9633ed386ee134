"""The one place that turns `tgictl.proto.messages` dataclasses into protobuf messages and back.

Router and shard both convert here, so the wire format has a single definition on each side of every field
(docs/architecture.md, "Decisions": TGI's proto shape). The per-step messages are plain attribute access, no
reflection (a step converts up to a few hundred generations); start-up ones (Info, Warmup) copy by field name.

`*_from_pb` functions check only what the conversion itself needs (required sub-messages present,
redundant sizes consistent, enum values known, ids and logprobs of equal length) and raise
`InvalidRequestError` otherwise. Semantic checks (a token id inside the vocabulary, a block inside the
cache) belong to whoever owns that knowledge. `*_to_pb` functions trust their dataclasses: an integer
outside its protobuf range raises protobuf's ValueError, which is a bug in the caller.

Floats travel as float32 (TGI's types): a sampling parameter such as 0.7 arrives as the nearest
float32, and logprobs (computed in float32 on the shard) round-trip exactly, NaN included.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import TypeVar

from google.protobuf.message import Message

from tgictl.errors import InvalidRequestError
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

# FinishReason values are 0, 1, 2 in both enums (checked by the tests); indexing beats an enum call.
_FINISH_REASONS: tuple[FinishReason, ...] = tuple(sorted(FinishReason))

_GRAMMAR_TYPES: dict[int, GrammarType] = {int(t): t for t in GrammarType}

_StepPb = TypeVar("_StepPb", pb.PrefillResponse, pb.DecodeResponse)


def _require(message: Message, field: str, where: str) -> None:
    """Raises when a sub-message the contract requires is absent (protobuf would hand out defaults)."""
    if not message.HasField(field):
        raise InvalidRequestError(f"{where}: field `{field}` is required")


def _check_size(size: int, actual: int, where: str) -> None:
    if size != actual:
        raise InvalidRequestError(f"{where}: size is {size} but it lists {actual} requests")


# --- sampling and stopping ---------------------------------------------------------------------


def _fill_sampling(dst: pb.NextTokenChooserParameters, p: SamplingParams) -> None:
    dst.SetInParent()  # present even when every value is the proto default
    dst.temperature = p.temperature
    dst.top_k = p.top_k
    dst.top_p = p.top_p
    dst.typical_p = p.typical_p
    dst.do_sample = p.do_sample
    dst.seed = p.seed
    dst.repetition_penalty = p.repetition_penalty
    dst.frequency_penalty = p.frequency_penalty
    dst.min_p = p.min_p
    dst.presence_penalty = p.presence_penalty
    dst.step_offset = p.step_offset
    if p.grammar is not None:
        dst.grammar = p.grammar.value
        dst.grammar_type = int(p.grammar.type)
        dst.grammar_replay_tokens = p.grammar.replay_tokens


def _grammar_from_pb(m: pb.NextTokenChooserParameters) -> Grammar | None:
    if m.grammar_type == pb.GRAMMAR_TYPE_NONE:
        if m.grammar:
            raise InvalidRequestError("sampling: a grammar needs a grammar_type other than NONE")
        return None
    if m.grammar_type not in _GRAMMAR_TYPES:
        raise InvalidRequestError(f"sampling: unknown grammar_type {m.grammar_type}")
    if not m.grammar:
        raise InvalidRequestError("sampling: grammar_type is set but grammar is empty")
    return Grammar(type=_GRAMMAR_TYPES[m.grammar_type], value=m.grammar, replay_tokens=m.grammar_replay_tokens)


def sampling_to_pb(p: SamplingParams) -> pb.NextTokenChooserParameters:
    m = pb.NextTokenChooserParameters()
    _fill_sampling(m, p)
    return m


def sampling_from_pb(m: pb.NextTokenChooserParameters) -> SamplingParams:
    return SamplingParams(
        temperature=m.temperature,
        top_k=m.top_k,
        top_p=m.top_p,
        typical_p=m.typical_p,
        min_p=m.min_p,
        do_sample=m.do_sample,
        seed=m.seed,
        repetition_penalty=m.repetition_penalty,
        frequency_penalty=m.frequency_penalty,
        presence_penalty=m.presence_penalty,
        grammar=_grammar_from_pb(m),
        step_offset=m.step_offset,
    )


def _fill_stopping(dst: pb.StoppingCriteriaParameters, p: StoppingParams) -> None:
    dst.SetInParent()
    dst.max_new_tokens = p.max_new_tokens
    dst.ignore_eos_token = p.ignore_eos


def stopping_to_pb(p: StoppingParams) -> pb.StoppingCriteriaParameters:
    m = pb.StoppingCriteriaParameters()
    _fill_stopping(m, p)
    return m


def stopping_from_pb(m: pb.StoppingCriteriaParameters) -> StoppingParams:
    return StoppingParams(max_new_tokens=m.max_new_tokens, ignore_eos=m.ignore_eos_token)


# --- requests and batches ----------------------------------------------------------------------


def _fill_request(dst: pb.Request, r: Request) -> None:
    dst.id = r.id
    dst.input_ids.extend(r.input_ids)
    _fill_sampling(dst.parameters, r.sampling)
    _fill_stopping(dst.stopping_parameters, r.stopping)
    dst.prefill_logprobs = r.prefill_logprobs
    dst.top_n_tokens = r.top_n_tokens
    dst.blocks.extend(r.blocks)
    dst.cache_len = r.cache_len
    dst.adapter_index = r.adapter_index
    if r.chunk_len is not None:  # None leaves the optional field absent
        dst.chunk_len = r.chunk_len


def request_to_pb(r: Request) -> pb.Request:
    m = pb.Request()
    _fill_request(m, r)
    return m


def request_from_pb(m: pb.Request) -> Request:
    where = f"request {m.id}"
    _require(m, "parameters", where)
    _require(m, "stopping_parameters", where)
    return Request(
        id=m.id,
        input_ids=tuple(m.input_ids[:]),
        sampling=sampling_from_pb(m.parameters),
        stopping=stopping_from_pb(m.stopping_parameters),
        blocks=tuple(m.blocks[:]),
        cache_len=m.cache_len,
        chunk_len=m.chunk_len if m.HasField("chunk_len") else None,
        prefill_logprobs=m.prefill_logprobs,
        top_n_tokens=m.top_n_tokens,
        adapter_index=m.adapter_index,
    )


def batch_to_pb(b: Batch) -> pb.Batch:
    m = pb.Batch(id=b.id, size=len(b.requests), max_tokens=b.max_tokens, max_blocks=b.max_blocks)
    add = m.requests.add
    for r in b.requests:
        _fill_request(add(), r)
    return m


def batch_from_pb(m: pb.Batch) -> Batch:
    _check_size(m.size, len(m.requests), f"batch {m.id}")
    return Batch(
        id=m.id,
        requests=tuple(request_from_pb(r) for r in m.requests),
        max_tokens=m.max_tokens,
        max_blocks=m.max_blocks,
    )


def _fill_cached_batch(dst: pb.CachedBatch, b: CachedBatch) -> None:
    dst.SetInParent()
    dst.id = b.id
    dst.request_ids.extend(b.request_ids)
    dst.size = len(b.request_ids)
    dst.max_tokens = b.max_tokens
    dst.current_tokens = b.current_tokens


def cached_batch_to_pb(b: CachedBatch) -> pb.CachedBatch:
    m = pb.CachedBatch()
    _fill_cached_batch(m, b)
    return m


def cached_batch_from_pb(m: pb.CachedBatch) -> CachedBatch:
    request_ids = tuple(m.request_ids[:])
    _check_size(m.size, len(request_ids), f"cached batch {m.id}")
    return CachedBatch(
        id=m.id, request_ids=request_ids, max_tokens=m.max_tokens, current_tokens=m.current_tokens
    )


# --- generations (the hot path) ----------------------------------------------------------------
# Responses are built in place (`add()` and `_fill_*`): building sub-messages separately and handing
# them to a constructor copies every one again, which made DecodeResponse conversion three times slower.


def _fill_tokens(dst: pb.Tokens, t: Tokens) -> None:
    dst.ids.extend(t.ids)  # extending, even with nothing, marks the sub-message present
    dst.logprobs.extend(t.logprobs)


def tokens_to_pb(t: Tokens) -> pb.Tokens:
    m = pb.Tokens()
    _fill_tokens(m, t)
    return m


def tokens_from_pb(m: pb.Tokens) -> Tokens:
    # Slicing a repeated field into a list, then tuple(), is twice as fast as tuple() on the field.
    ids = tuple(m.ids[:])
    logprobs = tuple(m.logprobs[:])
    if len(ids) != len(logprobs):
        raise InvalidRequestError(f"tokens: {len(ids)} ids but {len(logprobs)} logprobs")
    return Tokens(ids, logprobs)  # positional (hot path); field order pinned by the round-trip tests


def _fill_generated_text(dst: pb.GeneratedText, g: GeneratedText) -> None:
    dst.SetInParent()  # present even when every value is the proto default
    dst.generated_tokens = g.generated_tokens
    dst.finish_reason = g.finish_reason  # type: ignore[assignment]  # same int values in both enums
    if g.seed is not None:
        dst.seed = g.seed


def generated_text_to_pb(g: GeneratedText) -> pb.GeneratedText:
    m = pb.GeneratedText()
    _fill_generated_text(m, g)
    return m


def generated_text_from_pb(m: pb.GeneratedText) -> GeneratedText:
    reason = m.finish_reason
    if not 0 <= reason < len(_FINISH_REASONS):
        raise InvalidRequestError(f"generated text: unknown finish_reason {reason}")
    return GeneratedText(
        generated_tokens=m.generated_tokens,
        finish_reason=_FINISH_REASONS[reason],
        seed=m.seed if m.HasField("seed") else None,
    )


def _fill_generation(dst: pb.Generation, g: Generation) -> None:
    dst.request_id = g.request_id
    _fill_tokens(dst.tokens, g.tokens)
    if g.prefill_tokens is not None:
        _fill_tokens(dst.prefill_tokens, g.prefill_tokens)
    if g.top_tokens:
        add = dst.top_tokens.add
        for t in g.top_tokens:
            _fill_tokens(add(), t)
    if g.generated_text is not None:
        _fill_generated_text(dst.generated_text, g.generated_text)
    if g.prefill_top_tokens:
        add = dst.prefill_top_tokens.add
        for t in g.prefill_top_tokens:
            _fill_tokens(add(), t)
    if g.draft_tokens:
        dst.draft_tokens = g.draft_tokens
        dst.accepted_tokens = g.accepted_tokens
    if g.error:
        dst.error = g.error


def generation_to_pb(g: Generation) -> pb.Generation:
    m = pb.Generation()
    _fill_generation(m, g)
    return m


def generation_from_pb(m: pb.Generation) -> Generation:
    top_tokens = m.top_tokens
    # Positional arguments (hot path: one call per request per step); order pinned by the tests.
    return Generation(
        m.request_id,
        tokens_from_pb(m.tokens),
        tokens_from_pb(m.prefill_tokens) if m.HasField("prefill_tokens") else None,
        tuple([tokens_from_pb(t) for t in top_tokens]) if top_tokens else (),
        generated_text_from_pb(m.generated_text) if m.HasField("generated_text") else None,
        tuple([tokens_from_pb(t) for t in m.prefill_top_tokens]) if m.prefill_top_tokens else (),
        m.draft_tokens,
        m.accepted_tokens,
        m.error,
    )


def _step_to_pb(r: StepResult, cls: type[_StepPb]) -> _StepPb:
    timings = r.timings
    m = cls(
        forward_ns=timings.forward_ns,
        decode_ns=timings.decode_ns,
        total_ns=timings.total_ns,
        concat_ns=timings.concat_ns,  # None leaves the optional field absent
    )
    add = m.generations.add
    for g in r.generations:
        _fill_generation(add(), g)
    if r.batch is not None:
        _fill_cached_batch(m.batch, r.batch)
    return m


def _step_from_pb(m: pb.PrefillResponse | pb.DecodeResponse) -> StepResult:
    return StepResult(
        generations=tuple([generation_from_pb(g) for g in m.generations]),
        batch=cached_batch_from_pb(m.batch) if m.HasField("batch") else None,
        timings=Timings(
            forward_ns=m.forward_ns,
            decode_ns=m.decode_ns,
            total_ns=m.total_ns,
            concat_ns=m.concat_ns if m.HasField("concat_ns") else None,
        ),
    )


def prefill_response_to_pb(r: StepResult) -> pb.PrefillResponse:
    return _step_to_pb(r, pb.PrefillResponse)


def prefill_response_from_pb(m: pb.PrefillResponse) -> StepResult:
    return _step_from_pb(m)


def decode_response_to_pb(r: StepResult) -> pb.DecodeResponse:
    return _step_to_pb(r, pb.DecodeResponse)


def decode_response_from_pb(m: pb.DecodeResponse) -> StepResult:
    return _step_from_pb(m)


# --- RPC requests and the other responses ------------------------------------------------------


def block_grant_to_pb(g: BlockGrant) -> pb.BlockGrant:
    return pb.BlockGrant(request_id=g.request_id, blocks=g.blocks)


def block_grant_from_pb(m: pb.BlockGrant) -> BlockGrant:
    return BlockGrant(request_id=m.request_id, blocks=tuple(m.blocks))


def prefill_request_to_pb(r: PrefillRequest) -> pb.PrefillRequest:
    m = pb.PrefillRequest(batch=batch_to_pb(r.batch))
    if r.cached_batch is not None:
        _fill_cached_batch(m.cached_batch, r.cached_batch)
    if r.max_prefill_tokens is not None:
        m.max_prefill_tokens = r.max_prefill_tokens
    m.grants.extend(map(block_grant_to_pb, r.grants))
    return m


def prefill_request_from_pb(m: pb.PrefillRequest) -> PrefillRequest:
    _require(m, "batch", "prefill request")
    return PrefillRequest(
        batch=batch_from_pb(m.batch),
        cached_batch=cached_batch_from_pb(m.cached_batch) if m.HasField("cached_batch") else None,
        max_prefill_tokens=m.max_prefill_tokens if m.HasField("max_prefill_tokens") else None,
        grants=tuple(map(block_grant_from_pb, m.grants)),
    )


def decode_request_to_pb(r: DecodeRequest) -> pb.DecodeRequest:
    m = pb.DecodeRequest()
    add = m.batches.add
    for b in r.batches:
        _fill_cached_batch(add(), b)
    m.steps = r.steps
    m.grants.extend(map(block_grant_to_pb, r.grants))
    return m


def decode_request_from_pb(m: pb.DecodeRequest) -> DecodeRequest:
    grants = tuple(map(block_grant_from_pb, m.grants))
    return DecodeRequest(batches=tuple(cached_batch_from_pb(b) for b in m.batches), steps=m.steps or 1, grants=grants)


def filter_batch_request_to_pb(r: FilterBatchRequest) -> pb.FilterBatchRequest:
    return pb.FilterBatchRequest(batch_id=r.batch_id, request_ids=r.request_ids)


def filter_batch_request_from_pb(m: pb.FilterBatchRequest) -> FilterBatchRequest:
    return FilterBatchRequest(batch_id=m.batch_id, request_ids=tuple(m.request_ids))


def filter_batch_response_to_pb(b: CachedBatch) -> pb.FilterBatchResponse:
    m = pb.FilterBatchResponse()
    _fill_cached_batch(m.batch, b)
    return m


def filter_batch_response_from_pb(m: pb.FilterBatchResponse) -> CachedBatch:
    _require(m, "batch", "filter batch response")
    return cached_batch_from_pb(m.batch)


def clear_cache_request_to_pb(r: ClearCacheRequest) -> pb.ClearCacheRequest:
    return pb.ClearCacheRequest(id=r.batch_id)


def clear_cache_request_from_pb(m: pb.ClearCacheRequest) -> ClearCacheRequest:
    return ClearCacheRequest(batch_id=m.id if m.HasField("id") else None)


def warmup_request_to_pb(r: WarmupRequest) -> pb.WarmupRequest:
    return pb.WarmupRequest(
        batch=batch_to_pb(r.batch),
        max_input_tokens=r.max_input_tokens,
        max_prefill_tokens=r.max_prefill_tokens,
        max_total_tokens=r.max_total_tokens,
    )


def warmup_request_from_pb(m: pb.WarmupRequest) -> WarmupRequest:
    _require(m, "batch", "warmup request")
    return WarmupRequest(
        batch=batch_from_pb(m.batch),
        max_prefill_tokens=m.max_prefill_tokens,
        max_input_tokens=m.max_input_tokens if m.HasField("max_input_tokens") else None,
        max_total_tokens=m.max_total_tokens if m.HasField("max_total_tokens") else None,
    )


def warmup_response_to_pb(r: WarmupResult) -> pb.WarmupResponse:
    return pb.WarmupResponse(**{f.name: getattr(r, f.name) for f in fields(WarmupResult)})


def warmup_response_from_pb(m: pb.WarmupResponse) -> WarmupResult:
    return WarmupResult(**{f.name: getattr(m, f.name) for f in fields(WarmupResult)})


def info_to_pb(i: Info) -> pb.InfoResponse:
    return pb.InfoResponse(**{f.name: getattr(i, f.name) for f in fields(Info)})


def info_from_pb(m: pb.InfoResponse) -> Info:
    values = {f.name: getattr(m, f.name) for f in fields(Info)}
    return Info(**{**values, "eos_token_ids": tuple(m.eos_token_ids), "adapters": tuple(m.adapters),
                   "layer_windows": tuple(m.layer_windows)})


def load_adapter_request_to_pb(r: LoadAdapterRequest) -> pb.LoadAdapterRequest:
    return pb.LoadAdapterRequest(name=r.name, path=r.path, adapter_index=r.adapter_index)


def load_adapter_request_from_pb(m: pb.LoadAdapterRequest) -> LoadAdapterRequest:
    if m.adapter_index < 1 or not m.name or not m.path:
        raise InvalidRequestError("LoadAdapterRequest needs a name, a path and an adapter_index >= 1")
    return LoadAdapterRequest(m.name, m.path, m.adapter_index)


def unload_adapter_request_to_pb(adapter_index: int) -> pb.UnloadAdapterRequest:
    return pb.UnloadAdapterRequest(adapter_index=adapter_index)


def unload_adapter_request_from_pb(m: pb.UnloadAdapterRequest) -> int:
    if m.adapter_index < 1:
        raise InvalidRequestError("UnloadAdapterRequest needs an adapter_index >= 1")
    return m.adapter_index


def service_discovery_response_to_pb(urls: Sequence[str]) -> pb.ServiceDiscoveryResponse:
    return pb.ServiceDiscoveryResponse(urls=urls)


def service_discovery_response_from_pb(m: pb.ServiceDiscoveryResponse) -> tuple[str, ...]:
    return tuple(m.urls)
