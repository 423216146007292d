"""The command's printing: bounded values, printable-ASCII JSON Lines with exact numbers."""

from __future__ import annotations

import json
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from agentrt.canonical import parse_json
from agentrt.cli._output import ascii_json, bounded, size_of, value_field


def test_a_long_value_keeps_its_head_and_tail_and_counts_what_is_cut() -> None:
    text = "A" * 100 + "B" * 1000 + "C" * 100
    shown = bounded(text, head=10, tail=5)
    assert shown == "A" * 10 + " …[1185 characters not shown]… " + "C" * 5


def test_a_short_value_is_shown_whole_but_escaped() -> None:
    assert bounded("ok\x1b[2J\u202e") == "ok\\x1b[2J\\u202e"


def test_the_cut_cannot_hide_an_escape_in_what_is_shown() -> None:
    text = "\x1b" * 500
    shown = bounded(text, head=4, tail=2)
    assert "\x1b" not in shown
    assert shown.startswith("\\x1b" * 4)


def test_sizes_count_characters_and_bytes_when_they_differ() -> None:
    assert size_of("abc") == "3 characters"
    assert size_of("é") == "1 character, 2 bytes"
    assert value_field("abc") == "abc  (3 characters)"
    assert value_field(None) == "-"
    assert value_field(7) == "7"


def test_json_lines_keep_number_literals_exactly() -> None:
    value = parse_json('{"big": 9007199254740993, "price": 0.10, "tiny": 1e-400}')
    line = ascii_json(value)
    assert '"big":9007199254740993' in line
    assert '"price":0.10' in line
    assert '"tiny":1e-400' in line
    assert json.loads(line, parse_float=Decimal)["big"] == 9007199254740993


@given(st.recursive(st.text(), lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner)))
def test_json_lines_are_printable_ascii_and_decode_to_the_same_value(value: object) -> None:
    line = ascii_json(value)
    assert line.isascii() and line.isprintable()
    assert json.loads(line) == value
