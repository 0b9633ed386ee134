"""One generation for the APIs that answer with one (Anthropic's Messages, OpenAI's Responses): its permit,
validation and channel, then either the whole outcome or a stream of the API's SSE text read from it."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from fastapi import Request

from tgictl.runtime.router.http.openai_choices import Job, start_jobs
from tgictl.runtime.router.http.outcome import Outcome, collect_all
from tgictl.runtime.router.http.responses import KEEP_ALIVE_S, SSEResponse, in_bursts, until_disconnect
from tgictl.runtime.router.request import StreamEvent, ValidatedRequest
from tgictl.runtime.router.scheduling.event_channel import EventChannel
from tgictl.runtime.router.service import Admission, RouterService
from tgictl.runtime.router.validation import GenerationInput


@dataclass
class OneGeneration:
    admission: Admission
    request: ValidatedRequest
    channel: EventChannel

    @classmethod
    async def start(cls, service: RouterService, request: GenerationInput) -> OneGeneration:
        """A permit (429 / 503), validation (422) and the queued request; nothing is held on failure."""
        admissions, validated = await start_jobs(service, [Job(0, 0, request)])
        return cls(admissions[0], validated[0], service.open(admissions, validated))

    async def collect(self, http: Request) -> Outcome | None:
        """The whole outcome; None when the client left first (its generation is cancelled)."""
        try:
            outcomes = await until_disconnect(http, collect_all(self.channel))
        finally:
            self.admission.release()
        return outcomes[0] if outcomes is not None else None

    def stream(self, texts: Callable[[OneGeneration], AsyncGenerator[str, None]]) -> SSEResponse:
        """An SSE response of `texts(self)`, which reads `events()`."""
        return SSEResponse(in_bursts(self.channel, texts(self)), on_close=self.admission.release)

    async def events(self) -> AsyncGenerator[StreamEvent | None, None]:
        """The generation's events in order; None when KEEP_ALIVE_S passed without one (send a keep-alive).
        The channel is closed when this ends or is closed, which cancels what still runs."""
        try:
            while not self.channel.done:
                item = await self.channel.next(KEEP_ALIVE_S)
                yield None if item is None else item[1]
        finally:
            self.channel.close()
