"""Several decode steps answered as one Decode (docs/architecture.md, "Decode steps per call").

Why: every Decode costs a gRPC round trip and the router's per-step work. At one client on 2 CPU cores
that was ~3 ms of CPU per token beside a ~6.6 ms step (the GGUF SmolLM2), and on 2 cores that CPU is
taken from the step's own threads. When no request waits to join, the router asks for up to N steps per
Decode (DecodeRequest.steps); the servicer runs them back to back on its device thread and answers once,
merged as proto/step_merge.py describes. The router streams each token as its own event, so clients get
the same tokens and events, in bursts of up to N.
"""

from __future__ import annotations

from tgictl.config import MAX_DECODE_STEPS
from tgictl.errors import InvalidRequestError
from tgictl.proto.messages import Timings
from tgictl.proto.step_merge import merge_generations
from tgictl.runtime.shard.runtime import StepOutput


def check_steps(steps: int) -> int:
    if not 1 <= steps <= MAX_DECODE_STEPS:
        raise InvalidRequestError(f"decode steps must be within 1..{MAX_DECODE_STEPS}, got {steps}")
    return steps


def merge_steps(earlier: StepOutput, later: StepOutput) -> StepOutput:
    """Two consecutive steps of one batch as one: generations merged, the later step's next batch,
    timings summed (only a first step concatenates batches)."""
    a, b = earlier[2], later[2]
    timings = Timings(a.forward_ns + b.forward_ns, a.decode_ns + b.decode_ns, a.total_ns + b.total_ns, a.concat_ns)
    return merge_generations(earlier[0], later[0]), later[1], timings
