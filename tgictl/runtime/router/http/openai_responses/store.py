"""The responses `previous_response_id` can name: kept in the router's memory, bounded, least recently used
first out (docs/apis.md, "Responses API").

Each entry is what a follow-up needs, the conversation so far (every earlier input and output, without the
instructions, which OpenAI does not carry over) and the response object GET /v1/responses/{id} returns. A
request with `store: false` is not kept. Nothing survives a restart of the router, and an entry evicted to
stay within the bounds is gone: naming it is a 400 whose message says so.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from tgictl.runtime.router.http.chat.messages import ChatMessage

MAX_STORED_RESPONSES = 1024
MAX_STORED_CHARACTERS = 64 * 2**20  # of conversations and response objects together, about as many bytes


@dataclass(frozen=True)
class StoredResponse:
    conversation: tuple[ChatMessage, ...]
    response: dict[str, Any]

    @property
    def size(self) -> int:
        calls = sum(len(json.dumps(c.arguments)) for m in self.conversation for c in m.tool_calls)
        return sum(len(m.content) for m in self.conversation) + calls + len(json.dumps(self.response))


class ResponseStore:
    def __init__(self, max_responses: int = MAX_STORED_RESPONSES, max_characters: int = MAX_STORED_CHARACTERS) -> None:
        self.max_responses = max_responses
        self.max_characters = max_characters
        self._entries: OrderedDict[str, tuple[StoredResponse, int]] = OrderedDict()
        self._characters = 0  # only the event loop uses the store: no lock

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response_id: str, stored: StoredResponse) -> None:
        size = stored.size
        if size > self.max_characters:
            return  # larger than the whole store: not kept (a follow-up naming it is told it is not found)
        self._entries[response_id] = (stored, size)
        self._characters += size
        while len(self._entries) > self.max_responses or self._characters > self.max_characters:
            _, (_, evicted) = self._entries.popitem(last=False)
            self._characters -= evicted

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is None:
            return None
        self._entries.move_to_end(response_id)
        return entry[0]
