from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GrammarType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GRAMMAR_TYPE_NONE: _ClassVar[GrammarType]
    GRAMMAR_TYPE_JSON: _ClassVar[GrammarType]
    GRAMMAR_TYPE_REGEX: _ClassVar[GrammarType]
    GRAMMAR_TYPE_LLGUIDANCE: _ClassVar[GrammarType]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_EOS_TOKEN: _ClassVar[FinishReason]
    FINISH_REASON_STOP_SEQUENCE: _ClassVar[FinishReason]
GRAMMAR_TYPE_NONE: GrammarType
GRAMMAR_TYPE_JSON: GrammarType
GRAMMAR_TYPE_REGEX: GrammarType
GRAMMAR_TYPE_LLGUIDANCE: GrammarType
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_EOS_TOKEN: FinishReason
FINISH_REASON_STOP_SEQUENCE: FinishReason

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("requires_padding", "dtype", "device_type", "speculate", "support_chunking", "use_prefix_caching", "attention_impl", "block_size", "model_type", "vocab_size", "num_layers", "max_position_embeddings", "eos_token_ids", "world_size", "adapters", "layer_windows")
    REQUIRES_PADDING_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_TYPE_FIELD_NUMBER: _ClassVar[int]
    SPECULATE_FIELD_NUMBER: _ClassVar[int]
    SUPPORT_CHUNKING_FIELD_NUMBER: _ClassVar[int]
    USE_PREFIX_CACHING_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_IMPL_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    MODEL_TYPE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    MAX_POSITION_EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    LAYER_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    requires_padding: bool
    dtype: str
    device_type: str
    speculate: int
    support_chunking: bool
    use_prefix_caching: bool
    attention_impl: str
    block_size: int
    model_type: str
    vocab_size: int
    num_layers: int
    max_position_embeddings: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    world_size: int
    adapters: _containers.RepeatedScalarFieldContainer[str]
    layer_windows: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, requires_padding: _Optional[bool] = ..., dtype: _Optional[str] = ..., device_type: _Optional[str] = ..., speculate: _Optional[int] = ..., support_chunking: _Optional[bool] = ..., use_prefix_caching: _Optional[bool] = ..., attention_impl: _Optional[str] = ..., block_size: _Optional[int] = ..., model_type: _Optional[str] = ..., vocab_size: _Optional[int] = ..., num_layers: _Optional[int] = ..., max_position_embeddings: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., world_size: _Optional[int] = ..., adapters: _Optional[_Iterable[str]] = ..., layer_windows: _Optional[_Iterable[int]] = ...) -> None: ...

class LoadAdapterRequest(_message.Message):
    __slots__ = ("name", "path", "adapter_index")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_INDEX_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    adapter_index: int
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., adapter_index: _Optional[int] = ...) -> None: ...

class LoadAdapterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UnloadAdapterRequest(_message.Message):
    __slots__ = ("adapter_index",)
    ADAPTER_INDEX_FIELD_NUMBER: _ClassVar[int]
    adapter_index: int
    def __init__(self, adapter_index: _Optional[int] = ...) -> None: ...

class UnloadAdapterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServiceDiscoveryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServiceDiscoveryResponse(_message.Message):
    __slots__ = ("urls",)
    URLS_FIELD_NUMBER: _ClassVar[int]
    urls: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, urls: _Optional[_Iterable[str]] = ...) -> None: ...

class ClearCacheRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class ClearCacheResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NextTokenChooserParameters(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "typical_p", "do_sample", "seed", "repetition_penalty", "frequency_penalty", "grammar", "grammar_type", "min_p", "presence_penalty", "grammar_replay_tokens", "step_offset")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TYPICAL_P_FIELD_NUMBER: _ClassVar[int]
    DO_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_TYPE_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_REPLAY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STEP_OFFSET_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    typical_p: float
    do_sample: bool
    seed: int
    repetition_penalty: float
    frequency_penalty: float
    grammar: str
    grammar_type: GrammarType
    min_p: float
    presence_penalty: float
    grammar_replay_tokens: int
    step_offset: int
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., typical_p: _Optional[float] = ..., do_sample: _Optional[bool] = ..., seed: _Optional[int] = ..., repetition_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., grammar: _Optional[str] = ..., grammar_type: _Optional[_Union[GrammarType, str]] = ..., min_p: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., grammar_replay_tokens: _Optional[int] = ..., step_offset: _Optional[int] = ...) -> None: ...

class StoppingCriteriaParameters(_message.Message):
    __slots__ = ("max_new_tokens", "ignore_eos_token")
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    max_new_tokens: int
    ignore_eos_token: bool
    def __init__(self, max_new_tokens: _Optional[int] = ..., ignore_eos_token: _Optional[bool] = ...) -> None: ...

class Request(_message.Message):
    __slots__ = ("id", "parameters", "stopping_parameters", "prefill_logprobs", "top_n_tokens", "blocks", "cache_len", "chunk_len", "input_ids", "adapter_index")
    ID_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    STOPPING_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_N_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CACHE_LEN_FIELD_NUMBER: _ClassVar[int]
    CHUNK_LEN_FIELD_NUMBER: _ClassVar[int]
    INPUT_IDS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_INDEX_FIELD_NUMBER: _ClassVar[int]
    id: int
    parameters: NextTokenChooserParameters
    stopping_parameters: StoppingCriteriaParameters
    prefill_logprobs: bool
    top_n_tokens: int
    blocks: _containers.RepeatedScalarFieldContainer[int]
    cache_len: int
    chunk_len: int
    input_ids: _containers.RepeatedScalarFieldContainer[int]
    adapter_index: int
    def __init__(self, id: _Optional[int] = ..., parameters: _Optional[_Union[NextTokenChooserParameters, _Mapping]] = ..., stopping_parameters: _Optional[_Union[StoppingCriteriaParameters, _Mapping]] = ..., prefill_logprobs: _Optional[bool] = ..., top_n_tokens: _Optional[int] = ..., blocks: _Optional[_Iterable[int]] = ..., cache_len: _Optional[int] = ..., chunk_len: _Optional[int] = ..., input_ids: _Optional[_Iterable[int]] = ..., adapter_index: _Optional[int] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("id", "requests", "size", "max_tokens", "max_blocks")
    ID_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    id: int
    requests: _containers.RepeatedCompositeFieldContainer[Request]
    size: int
    max_tokens: int
    max_blocks: int
    def __init__(self, id: _Optional[int] = ..., requests: _Optional[_Iterable[_Union[Request, _Mapping]]] = ..., size: _Optional[int] = ..., max_tokens: _Optional[int] = ..., max_blocks: _Optional[int] = ...) -> None: ...

class CachedBatch(_message.Message):
    __slots__ = ("id", "request_ids", "size", "max_tokens", "current_tokens")
    ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    id: int
    request_ids: _containers.RepeatedScalarFieldContainer[int]
    size: int
    max_tokens: int
    current_tokens: int
    def __init__(self, id: _Optional[int] = ..., request_ids: _Optional[_Iterable[int]] = ..., size: _Optional[int] = ..., max_tokens: _Optional[int] = ..., current_tokens: _Optional[int] = ...) -> None: ...

class GeneratedText(_message.Message):
    __slots__ = ("generated_tokens", "finish_reason", "seed")
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    generated_tokens: int
    finish_reason: FinishReason
    seed: int
    def __init__(self, generated_tokens: _Optional[int] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., seed: _Optional[int] = ...) -> None: ...

class Tokens(_message.Message):
    __slots__ = ("ids", "logprobs")
    IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class Generation(_message.Message):
    __slots__ = ("request_id", "prefill_tokens", "tokens", "generated_text", "top_tokens", "prefill_top_tokens", "draft_tokens", "accepted_tokens", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TEXT_FIELD_NUMBER: _ClassVar[int]
    TOP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    prefill_tokens: Tokens
    tokens: Tokens
    generated_text: GeneratedText
    top_tokens: _containers.RepeatedCompositeFieldContainer[Tokens]
    prefill_top_tokens: _containers.RepeatedCompositeFieldContainer[Tokens]
    draft_tokens: int
    accepted_tokens: int
    error: str
    def __init__(self, request_id: _Optional[int] = ..., prefill_tokens: _Optional[_Union[Tokens, _Mapping]] = ..., tokens: _Optional[_Union[Tokens, _Mapping]] = ..., generated_text: _Optional[_Union[GeneratedText, _Mapping]] = ..., top_tokens: _Optional[_Iterable[_Union[Tokens, _Mapping]]] = ..., prefill_top_tokens: _Optional[_Iterable[_Union[Tokens, _Mapping]]] = ..., draft_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class BlockGrant(_message.Message):
    __slots__ = ("request_id", "blocks")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    blocks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[int] = ..., blocks: _Optional[_Iterable[int]] = ...) -> None: ...

class FilterBatchRequest(_message.Message):
    __slots__ = ("batch_id", "request_ids")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    request_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, batch_id: _Optional[int] = ..., request_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class FilterBatchResponse(_message.Message):
    __slots__ = ("batch",)
    BATCH_FIELD_NUMBER: _ClassVar[int]
    batch: CachedBatch
    def __init__(self, batch: _Optional[_Union[CachedBatch, _Mapping]] = ...) -> None: ...

class PrefillRequest(_message.Message):
    __slots__ = ("batch", "cached_batch", "max_prefill_tokens", "grants")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    CACHED_BATCH_FIELD_NUMBER: _ClassVar[int]
    MAX_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    batch: Batch
    cached_batch: CachedBatch
    max_prefill_tokens: int
    grants: _containers.RepeatedCompositeFieldContainer[BlockGrant]
    def __init__(self, batch: _Optional[_Union[Batch, _Mapping]] = ..., cached_batch: _Optional[_Union[CachedBatch, _Mapping]] = ..., max_prefill_tokens: _Optional[int] = ..., grants: _Optional[_Iterable[_Union[BlockGrant, _Mapping]]] = ...) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = ("generations", "batch", "forward_ns", "decode_ns", "total_ns", "concat_ns")
    GENERATIONS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    FORWARD_NS_FIELD_NUMBER: _ClassVar[int]
    DECODE_NS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NS_FIELD_NUMBER: _ClassVar[int]
    CONCAT_NS_FIELD_NUMBER: _ClassVar[int]
    generations: _containers.RepeatedCompositeFieldContainer[Generation]
    batch: CachedBatch
    forward_ns: int
    decode_ns: int
    total_ns: int
    concat_ns: int
    def __init__(self, generations: _Optional[_Iterable[_Union[Generation, _Mapping]]] = ..., batch: _Optional[_Union[CachedBatch, _Mapping]] = ..., forward_ns: _Optional[int] = ..., decode_ns: _Optional[int] = ..., total_ns: _Optional[int] = ..., concat_ns: _Optional[int] = ...) -> None: ...

class DecodeRequest(_message.Message):
    __slots__ = ("batches", "steps", "grants")
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedCompositeFieldContainer[CachedBatch]
    steps: int
    grants: _containers.RepeatedCompositeFieldContainer[BlockGrant]
    def __init__(self, batches: _Optional[_Iterable[_Union[CachedBatch, _Mapping]]] = ..., steps: _Optional[int] = ..., grants: _Optional[_Iterable[_Union[BlockGrant, _Mapping]]] = ...) -> None: ...

class DecodeResponse(_message.Message):
    __slots__ = ("generations", "batch", "forward_ns", "decode_ns", "total_ns", "concat_ns")
    GENERATIONS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    FORWARD_NS_FIELD_NUMBER: _ClassVar[int]
    DECODE_NS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NS_FIELD_NUMBER: _ClassVar[int]
    CONCAT_NS_FIELD_NUMBER: _ClassVar[int]
    generations: _containers.RepeatedCompositeFieldContainer[Generation]
    batch: CachedBatch
    forward_ns: int
    decode_ns: int
    total_ns: int
    concat_ns: int
    def __init__(self, generations: _Optional[_Iterable[_Union[Generation, _Mapping]]] = ..., batch: _Optional[_Union[CachedBatch, _Mapping]] = ..., forward_ns: _Optional[int] = ..., decode_ns: _Optional[int] = ..., total_ns: _Optional[int] = ..., concat_ns: _Optional[int] = ...) -> None: ...

class WarmupRequest(_message.Message):
    __slots__ = ("batch", "max_input_tokens", "max_prefill_tokens", "max_total_tokens")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    batch: Batch
    max_input_tokens: int
    max_prefill_tokens: int
    max_total_tokens: int
    def __init__(self, batch: _Optional[_Union[Batch, _Mapping]] = ..., max_input_tokens: _Optional[int] = ..., max_prefill_tokens: _Optional[int] = ..., max_total_tokens: _Optional[int] = ...) -> None: ...

class WarmupResponse(_message.Message):
    __slots__ = ("max_supported_total_tokens", "max_input_tokens", "max_total_tokens", "local_blocks")
    MAX_SUPPORTED_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    max_supported_total_tokens: int
    max_input_tokens: int
    max_total_tokens: int
    local_blocks: int
    def __init__(self, max_supported_total_tokens: _Optional[int] = ..., max_input_tokens: _Optional[int] = ..., max_total_tokens: _Optional[int] = ..., local_blocks: _Optional[int] = ...) -> None: ...
