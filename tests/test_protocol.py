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
