"""The bounded store behind previous_response_id: least recently used out first, bounded in count and in
size, a response larger than the whole store not kept."""

from __future__ import annotations

from tgictl.runtime.router.http.chat.messages import CalledTool, ChatMessage
from tgictl.runtime.router.http.openai_responses.store import ResponseStore, StoredResponse


def stored(text: str) -> StoredResponse:
    return StoredResponse((ChatMessage("user", text), ChatMessage("assistant", "", (CalledTool("c", "f", {"a": 1}),))),
                          {"id": text})


def test_least_recently_used_goes_first() -> None:
    store = ResponseStore(max_responses=2)
    store.put("a", stored("a"))
    store.put("b", stored("b"))
    assert store.get("a") is not None  # "a" is now the most recent
    store.put("c", stored("c"))
    assert store.get("b") is None and store.get("a") is not None and store.get("c") is not None
    assert len(store) == 2


def test_bounded_by_size_too() -> None:
    one = stored("x" * 100)
    store = ResponseStore(max_responses=100, max_characters=one.size * 2 + 10)
    for name in "abc":
        store.put(name, stored("x" * 99 + name))
    assert len(store) == 2 and store.get("a") is None
    store.put("huge", stored("y" * 10_000))  # larger than the whole store: not kept, nothing evicted
    assert store.get("huge") is None and len(store) == 2
