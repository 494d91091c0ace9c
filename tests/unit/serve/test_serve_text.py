"""Streamed text: stop strings end the reply before them and are never streamed in part;
half a UTF-8 character is held back."""

from __future__ import annotations

from serve_helpers import CharTokenizer

from kiln.serve.text import IncrementalText


def _stream(text: str, stop: list[str]) -> tuple[list[str], IncrementalText]:
    tok = CharTokenizer()
    inc = IncrementalText(tok.decode, stop)
    pieces = []
    for t in tok.encode(text):
        pieces.append(inc.push(t))
        if inc.stopped:
            break
    pieces.append(inc.flush())
    return pieces, inc


def test_stop_string_cuts_the_reply_and_no_part_of_it_is_streamed():
    pieces, inc = _stream("Hello, world. More", ["ld."])
    assert inc.stopped and inc.text == "Hello, wor" == "".join(pieces)
    assert "l" not in pieces[-3:]  # the 'l' of 'ld.' waited, then was dropped


def test_a_stop_prefix_that_does_not_complete_is_released():
    pieces, inc = _stream("abXabY", ["abZ"])
    assert not inc.stopped and "".join(pieces) == "abXabY"
    assert pieces[1] == ""  # 'ab' held while it could begin 'abZ'


def test_earliest_of_several_stops_wins():
    _, inc = _stream("one two three", ["three", "two"])
    assert inc.text == "one "


def test_incomplete_utf8_is_held_back():
    raw = "é!".encode()
    inc = IncrementalText(lambda ids: bytes(ids).decode("utf-8", "replace"))
    assert inc.push(raw[0]) == ""
    assert inc.push(raw[1]) == "é"
    assert inc.push(raw[2]) == "!" and inc.flush() == ""
