"""apgas.protocol: the lines built here are the lines of docs/protocol.md, and parsing
gives back what was built."""

from __future__ import annotations

import re

import pytest

from apgas import protocol


def test_job_messages_are_the_documented_lines():
    assert protocol.READY == "APGAS-Ready" and protocol.NOT_MALLEABLE == "APGAS-NotMalleable"
    assert protocol.timing("grow", 2, 165802561) == "growTimeAPGAS;2;165802561"
    assert protocol.request(3) == "Evolving;Request;3"
    assert protocol.release("node2") == "Evolving;Release;node2"
    assert protocol.check(1, 4, None, 2) == "Evolving;Check;1;4;0;2"


def test_orders_are_the_documented_lines():
    assert protocol.grow(["a", "b"]) == "grow 2 a b"
    assert protocol.shrink(1) == "shrink 1"
    assert protocol.refuse(2, "no nodes") == "refuse 2 no nodes"
    assert protocol.STATUS == "status"


@pytest.mark.parametrize("text, kind, fields, ask", [
    (protocol.READY, "ready", [], False),
    (protocol.NOT_MALLEABLE, "not_malleable", [], False),
    (protocol.timing("shrink", 1, 99), "timing", ["1", "99"], False),
    (protocol.request(2), "request", ["2"], True),
    (protocol.check(1, 3, 2, 1), "check", ["1", "3", "2", "1"], True),
    (protocol.release("n1"), "release", ["n1"], False),
    ("Hello;there", "other", ["there"], False),
])
def test_parse_gives_back_what_was_built(text, kind, fields, ask):
    message = protocol.parse_message(f"{text}:127.0.0.1:7")
    assert (message.text, message.sender) == (text, "127.0.0.1:7")
    assert (message.kind, message.fields, message.is_ask) == (kind, fields, ask)


def test_checks_are_validated_with_the_value():
    assert protocol.parse_check(protocol.parse_message(protocol.check(1, 4, 2, 1))) == (1, 4, 2, 1)
    for line, words in [("Evolving;Check;1;2;0", "got 3 field(s)"),
                        ("Evolving;Check;x;2;0;1", "min 'x' is not a whole number"),
                        ("Evolving;Check;3;2;0;1", "max 2 is below min 3"),
                        ("Evolving;Check;1;2;5;1", "preferred 5 is outside [1, 2]")]:
        with pytest.raises(ValueError, match=re.escape(words)):
            protocol.parse_check(protocol.parse_message(line))


def test_timing_lines_parse_and_anything_else_is_none():
    line = protocol.timing("grow", 2, 165802561) + ":127.0.0.1:7"
    assert protocol.parse_timing(protocol.parse_message(line)) == ("growTimeAPGAS", 2, 165802561)
    for line in ("growTimeAPGAS;2", "growTimeAPGAS;2;1;3", "growTimeAPGAS;2;x", "growTimeAPGAS;2;²",
                 "growTimeAPGAS;2;-5", "growTimeAPGAS;2;" + "9" * 20, "Evolving;Request;2", "ready"):
        assert protocol.parse_timing(protocol.parse_message(line)) is None, line


@pytest.mark.parametrize("line, order", [
    ("status", protocol.Order("status")),
    ("grow 2 a b", protocol.Order("grow", 2, ("a", "b"))),
    ("shrink 1", protocol.Order("shrink", 1)),
    ("refuse 2 no room", protocol.Order("refuse", 2, reason="no room")),
    ("refuse 1", protocol.Order("refuse", 1, reason="no reason given")),
])
def test_orders_parse(line, order):
    assert protocol.parse_order(line) == order


@pytest.mark.parametrize("line, words", [
    ("", "empty order; expected grow, shrink, status or refuse"),
    ("fly 2", "unknown order 'fly'; expected grow, shrink, status or refuse"),
    ("status now", "status takes no arguments, got ['now']"),
    ("grow", "grow needs a count"),
    ("shrink -1", "the count must be a positive integer, got '-1'"),
    ("shrink 1 x", "shrink takes one count, got extra words ['x']"),
])
def test_bad_orders_say_what_is_wrong(line, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        protocol.parse_order(line)


def test_replies():
    assert protocol.status_reply("malleable", [(0, "a"), (3, "b")]) == [
        "status malleable 2", "place 0 a", "place 3 b"]
    assert protocol.grow_reply(2, [4, 5]) == "ok grow 2 places 4 5"
    assert protocol.refuse_reply(1) == "ok refuse 1"
    assert protocol.error_reply("first\n  second\n") == "error first | second"
