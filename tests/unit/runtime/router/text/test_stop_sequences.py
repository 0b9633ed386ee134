from __future__ import annotations

from tgictl.runtime.router.text.stop_sequences import StopSequenceMatcher


def feed_all(matcher: StopSequenceMatcher, pieces: list[str]) -> tuple[str, str | None]:
    out = []
    for piece in pieces:
        check = matcher.feed(piece)
        out.append(check.emit)
        if check.matched is not None:
            return "".join(out), check.matched
    out.append(matcher.flush())
    return "".join(out), None


def test_no_stops_passes_text_through() -> None:
    assert feed_all(StopSequenceMatcher([]), ["a", "b"]) == ("ab", None)


def test_stop_across_pieces_is_found_and_stripped() -> None:
    assert feed_all(StopSequenceMatcher(["/test;"]), ["x /te", "st", ";y"]) == ("x ", "/test;")


def test_text_that_might_start_a_stop_is_held_back_then_released() -> None:
    matcher = StopSequenceMatcher(["STOP"])
    assert matcher.feed("abcST").emit == "abc"
    assert matcher.feed("x").emit == "STx"
    assert matcher.flush() == ""


def test_earliest_stop_wins() -> None:
    assert feed_all(StopSequenceMatcher(["world", "lo"]), ["hello world"]) == ("hel", "lo")


def test_trailing_space_does_not_match_a_stop_without_it() -> None:
    # TGI's own example: "/test;" matches "/test;" but the text "/test; " also contains it
    assert feed_all(StopSequenceMatcher(["/test; "]), ["/test;"]) == ("/test;", None)


def test_regex_characters_are_literal() -> None:
    assert feed_all(StopSequenceMatcher(["<|stop|>"]), ["a<|st", "op|>b"]) == ("a", "<|stop|>")
