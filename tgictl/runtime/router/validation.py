"""Request validation in TGI's order and words (TGI's router/src/validation.rs), tokenizing once.

Deliberate differences from TGI (docs/architecture.md, "What TGI does differently"): top_p = 1.0 is accepted and means off; presence_penalty is
a real presence penalty; non-finite numbers are rejected with the field's message instead of slipping
through comparisons.
"""

from __future__ import annotations

import dataclasses
import math
import random
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from tgictl.config import BASE_MODEL_ALIASES
from tgictl.errors import ValidationError
from tgictl.proto.messages import SamplingParams
from tgictl.runtime.router.guided.grammars import GrammarRequest, GrammarValidator
from tgictl.runtime.router.request import ValidatedRequest
from tgictl.runtime.router.text.tokenizer import RouterTokenizer

U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1
I32_MIN, I32_MAX = -(2**31), 2**31 - 1  # `priority`: a 32-bit integer, as metric labels and logs show it
_FLOAT_FIELDS = (
    "temperature", "repetition_penalty", "frequency_penalty", "presence_penalty", "top_p", "typical_p", "min_p"
)


@dataclass(frozen=True)
class ValidationLimits:
    max_input_tokens: int
    max_total_tokens: int
    max_best_of: int = 2
    max_stop_sequences: int = 4
    max_top_n_tokens: int = 5
    max_new_tokens_per_round: int = 1024  # TGI's DEFAULT_GENERATION_LENGTH; longer requests continue
    vocab_size: int | None = None  # the model's: token-id prompts must stay below it
    adapters: tuple[str, ...] = ()  # the shard's LoRA adapter slots, in adapter_index order (from 1; "" free)
    base_model_names: tuple[str, ...] = BASE_MODEL_ALIASES  # names that mean "no adapter"
    priority_scheduling: bool = False  # --scheduling-policy priority: `priority` orders the queue


@dataclass(frozen=True)
class GenerationInput:
    """Everything a route asks for, before validation. None = not given."""

    inputs: str
    add_special_tokens: bool = True
    stream: bool = False
    best_of: int | None = None
    temperature: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    typical_p: float | None = None
    min_p: float | None = None
    do_sample: bool = False
    max_new_tokens: int | None = None
    stop: tuple[str, ...] = ()
    truncate: int | None = None
    seed: int | None = None
    top_n_tokens: int | None = None
    decoder_input_details: bool = False
    ignore_eos: bool = False
    # A prompt given as token ids (OpenAI completions): used as is, never re-tokenized; `inputs` then
    # holds its decoded text.
    input_ids: tuple[int, ...] | None = None
    grammar: GrammarRequest | None = None  # the output must follow it (docs/architecture.md, "Guided generation")
    adapter_id: str | None = None  # TGI's parameters.adapter_id: a LoRA adapter's name (docs/architecture.md, "Multi-LoRA")
    # OpenAI's `model`: names an adapter when adapters are loaded; ignored otherwise (as TGI does).
    model: str | None = None
    priority: int | None = None  # vLLM's: lower runs first, with --scheduling-policy priority (docs/scheduling.md)


# The shards compute in float32: a larger double (1e308) becomes inf there and fails the batch.
FLOAT32_MAX = 3.4028234663852886e38
# Temperatures below this sample greedily (vLLM's threshold too): logits / 1e-45 overflow float32.
GREEDY_BELOW_TEMPERATURE = 1e-5


def _finite(name: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and abs(value) <= FLOAT32_MAX):
        raise ValidationError(f"`{name}` must be a finite number")


def _f32(value: float | None) -> float | None:
    """The value the shard will see (float32 on the wire): 1e-46 is 0.0 there, so check that."""
    return None if value is None else float(struct.unpack("f", struct.pack("f", value))[0])


def _sampling(given: GenerationInput, seed: int) -> SamplingParams:
    # Checked as float32, the precision the shards compute in (after _finite bounded the magnitudes).
    request = dataclasses.replace(given, **{name: _f32(getattr(given, name)) for name in _FLOAT_FIELDS})
    temperature = 1.0 if request.temperature is None else request.temperature
    if not temperature > 0:
        raise ValidationError("`temperature` must be strictly positive")
    repetition = 1.0 if request.repetition_penalty is None else request.repetition_penalty
    if not repetition > 0:
        raise ValidationError("`repetition_penalty` must be strictly positive")
    frequency = 0.0 if request.frequency_penalty is None else request.frequency_penalty
    if not -2.0 <= frequency <= 2.0:
        raise ValidationError("`frequency_penalty` must be >= -2.0 and <= 2.0")
    presence = 0.0 if request.presence_penalty is None else request.presence_penalty
    if not -2.0 <= presence <= 2.0:
        raise ValidationError("`presence_penalty` must be >= -2.0 and <= 2.0")
    top_p = 1.0 if request.top_p is None else request.top_p
    if not 0.0 < top_p <= 1.0:
        raise ValidationError("`top_p` must be > 0.0 and <= 1.0")
    typical_p = 1.0 if request.typical_p is None else request.typical_p
    if not 0.0 < typical_p <= 1.0:
        raise ValidationError("`typical_p` must be > 0.0 and <= 1.0")
    top_k = 0 if request.top_k is None else request.top_k
    if request.top_k is not None and top_k <= 0:
        raise ValidationError("`top_k` must be strictly positive")
    if top_k > U32_MAX:  # a uint32 on the wire: larger would fail the whole batch's conversion
        raise ValidationError(f"`top_k` must be <= {U32_MAX}")
    min_p = 0.0 if request.min_p is None else request.min_p
    if not 0.0 <= min_p < 1.0:
        raise ValidationError("`min_p` must be >= 0.0 and < 1.0")
    if temperature < GREEDY_BELOW_TEMPERATURE:
        # Sampling's limit as the temperature goes to 0 is the greedy choice (warpers then change nothing);
        # dividing by a denormal would make every logit infinite and the distribution NaN.
        return SamplingParams(do_sample=False, seed=seed, repetition_penalty=repetition,
                              frequency_penalty=frequency, presence_penalty=presence)
    return SamplingParams(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        typical_p=typical_p,
        min_p=min_p,
        do_sample=request.do_sample,
        seed=seed,
        repetition_penalty=repetition,
        frequency_penalty=frequency,
        presence_penalty=presence,
    )


class Validator:
    def __init__(
        self, tokenizer: RouterTokenizer, limits: ValidationLimits, grammars: GrammarValidator | None = None
    ) -> None:
        self._tokenizer = tokenizer
        self.limits = limits
        self._grammars = grammars  # None: grammars are refused

    def validate(self, request: GenerationInput) -> ValidatedRequest:
        """Check every limit in TGI's order; tokenize; raise ValidationError naming field and limit."""
        limits = self.limits
        for name in _FLOAT_FIELDS:
            _finite(name, getattr(request, name))
        best_of = request.best_of if request.best_of is not None else 1
        sampling_asked = request.do_sample or any(
            v is not None for v in (request.temperature, request.top_k, request.top_p, request.typical_p)
        )
        if best_of > 1 and not sampling_asked:
            raise ValidationError("you must use sampling when `best_of` is > 1")
        if request.seed is not None and not 0 <= request.seed <= U64_MAX:
            raise ValidationError(f"`seed` must be >= 0 and <= {U64_MAX}")
        seed = request.seed if request.seed is not None else random.getrandbits(64)
        sampling = _sampling(request, seed)
        if request.max_new_tokens is not None and request.max_new_tokens <= 0:
            raise ValidationError("`max_new_tokens` must be strictly positive")
        if len(request.stop) > limits.max_stop_sequences:
            raise ValidationError(
                f"`stop` supports up to {limits.max_stop_sequences} stop sequences. Given: {len(request.stop)}"
            )
        if request.seed is not None and best_of > 1:
            raise ValidationError("`seed` must not be set when `best_of` > 1")
        top_n = request.top_n_tokens or 0
        if not 0 <= top_n <= limits.max_top_n_tokens:
            raise ValidationError(
                f"`top_n_tokens` must be >= 0 and <= {limits.max_top_n_tokens}. Given: {top_n}"
            )
        if request.inputs == "" and request.input_ids is None:
            raise ValidationError("`inputs` cannot be empty")
        if request.truncate is not None and not 0 < request.truncate <= limits.max_input_tokens:
            raise ValidationError(
                f"`truncate` must be strictly positive and less than {limits.max_input_tokens}. "
                f"Given: {request.truncate}"
            )
        if request.stream and best_of > 1:
            raise ValidationError("`best_of` != 1 is not supported when streaming tokens")
        if request.stream and request.decoder_input_details:
            raise ValidationError("`decoder_input_details` == true is not supported when streaming tokens")

        ids = self._prompt_ids(request)
        if request.truncate is not None:
            ids = ids[-request.truncate :]
        input_length = len(ids)
        if input_length == 0:
            raise ValidationError("`inputs` must contain at least one token")
        if request.max_new_tokens is not None:
            total = request.max_new_tokens
        else:
            total = max(limits.max_total_tokens - input_length, 0)
        # TGI's limit on the whole request: continuation rounds split what fits, never more.
        if input_length + total > limits.max_total_tokens or total == 0:
            raise ValidationError(
                f"`inputs` tokens + `max_new_tokens` must be <= {limits.max_total_tokens}. "
                f"Given: {input_length} `inputs` tokens and {total} `max_new_tokens`"
            )
        this_round = min(total, limits.max_new_tokens_per_round)
        if input_length > limits.max_input_tokens:
            raise ValidationError(
                f"`inputs` must have less than {limits.max_input_tokens} tokens. Given: {input_length}"
            )
        adapter_index, adapter = self._adapter(request)
        priority = self._priority(request.priority)
        if request.grammar is not None:  # TGI checks the grammar last, too
            if self._grammars is None:
                raise ValidationError("grammar is not supported")
            sampling = dataclasses.replace(sampling, grammar=self._grammars.compile(request.grammar))
        return ValidatedRequest(
            input_ids=tuple(ids),
            sampling=sampling,
            max_new_tokens=this_round,
            max_total_new_tokens=total,
            stop_sequences=tuple(request.stop),
            ignore_eos=request.ignore_eos,
            top_n_tokens=top_n,
            decoder_input_details=request.decoder_input_details,
            adapter_index=adapter_index,
            adapter=adapter,
            priority=priority,
        )

    def _priority(self, priority: int | None) -> int:
        """vLLM's rule: a priority other than 0 needs the priority policy (else it would silently mean nothing)."""
        if priority is None or priority == 0:
            return 0
        if not self.limits.priority_scheduling:
            raise ValidationError(
                "`priority` other than 0 needs the server to run with --scheduling-policy priority"
            )
        if not I32_MIN <= priority <= I32_MAX:
            raise ValidationError(f"`priority` must be >= {I32_MIN} and <= {I32_MAX}")
        return priority

    def _adapter(self, request: GenerationInput) -> tuple[int, str | None]:
        """(adapter_index, name) of the request's adapter; (0, None) for the base model."""
        limits = self.limits
        name = request.adapter_id if request.adapter_id is not None else request.model if any(limits.adapters) else None
        if name is None or name == "" or name in limits.base_model_names:
            return 0, None
        if name in limits.adapters:
            return limits.adapters.index(name) + 1, name
        known = ", ".join(f"`{n}`" for n in limits.adapters if n) or "none"
        base = ", ".join(f"`{n}`" for n in limits.base_model_names)
        field = "adapter_id" if request.adapter_id is not None else "model"
        raise ValidationError(
            f"`{field}` `{name}` is not a loaded LoRA adapter; adapters: {known} (the base model: {base})"
        )

    def _prompt_ids(self, request: GenerationInput) -> list[int]:
        if request.input_ids is None:
            return self._tokenizer.encode(request.inputs, add_special_tokens=request.add_special_tokens)
        return self.check_token_ids(request.input_ids)

    def check_token_ids(self, ids: Sequence[int]) -> list[int]:
        """A prompt given as token ids, each a token of the model's vocabulary (checked before anything
        decodes them: the tokenizer overflows on ids past 2**64 and errs on negative ones)."""
        vocab = self.limits.vocab_size
        bad = [i for i in ids if i < 0 or (vocab is not None and i >= vocab)]
        if bad:
            raise ValidationError(f"token ids must be >= 0 and < {vocab}. Given: {bad[0]}")
        return list(ids)

    def validate_best_of(self, best_of: int) -> int:
        limits = self.limits
        if best_of > 1 and limits.max_best_of == 1:
            raise ValidationError("`best_of` != 1 is not allowed for this endpoint")
        if not 0 < best_of <= limits.max_best_of:
            raise ValidationError(f"`best_of` must be > 0 and <= {limits.max_best_of}. Given: {best_of}")
        return best_of
