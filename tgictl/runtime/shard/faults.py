"""Test-only fault injection for the shard (TGICTL_FAULT_INJECT, parsed by tgictl.env).

The reliability tests need a shard that fails one batch the way a recoverable failure would: the
batch's requests fail, the shard keeps serving. Without the variable `StepFaults(None)` does nothing
but return, so production pays one comparison per step.
"""

from __future__ import annotations

from tgictl.env import FaultInjection
from tgictl.errors import GenerationError


class InjectedFaultError(GenerationError):
    """The injected failure. Not INTERNAL: the servicer treats it as recoverable and keeps serving."""

    grpc_status = "ABORTED"


class StepFaults:
    """Counts Prefill and Decode steps on the device thread (one thread: no lock needed)."""

    def __init__(self, plan: FaultInjection | None) -> None:
        self._plan = plan
        self._steps = 0

    def before_step(self, method: str) -> None:
        """Call before a step changes any state; raises InjectedFaultError on a planned step."""
        if self._plan is None:
            return
        self._steps += 1
        if self._plan.fails(self._steps):
            raise InjectedFaultError(f"injected fault: {method} step {self._steps} (TGICTL_FAULT_INJECT)")
