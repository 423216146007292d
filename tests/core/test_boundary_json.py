"""The JSON boundary: what `parse_json` refuses, what it accepts, and how it says no.

Every refusal here is fed the hostile bytes themselves, checks the one-sentence
refusal, and then checks the parser still accepts a good value afterwards (a
refusal must not leave the decoder in a state that harms the next caller).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal

import pytest

from agentrt.canonical import (
    MAX_DEPTH,
    MAX_NUMBER_EXPONENT,
    MAX_NUMBER_LITERAL,
    JSONBoundaryError,
    parse_json,
)
from agentrt.sanitize import sanitize

GOOD_DOCUMENT = b'{"path": "notes.txt", "lines": [1, 2.50]}'


def assert_one_sentence(message: str) -> None:
    """A refusal is one sentence on one line, with no second sentence after it."""
    assert message
    assert message == message.strip()
    assert "\n" not in message and "\r" not in message
    assert re.search(r"[.!?]\s+\S", message) is None, message
    assert len(message) <= 200, message


def refusal(data: bytes | str) -> str:
    with pytest.raises(JSONBoundaryError) as caught:
        parse_json(data)
    message = str(caught.value)
    assert_one_sentence(message)
    # Nothing else was harmed: the decoder still takes a good document.
    assert parse_json(GOOD_DOCUMENT) == {"path": "notes.txt", "lines": [1, Decimal("2.50")]}
    return message


def nested_arrays(depth: int) -> str:
    return "[" * depth + "]" * depth


def nested_objects(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


# --- repeated keys -----------------------------------------------------------


def test_a_repeated_key_is_refused_naming_the_key() -> None:
    message = refusal(b'{"amount": 1, "amount": 1000000}')
    assert '"amount"' in message
    assert "repeated" in message


def test_a_repeated_key_in_a_nested_object_is_refused() -> None:
    message = refusal(b'{"outer": [{"inner": {"k": true, "k": false}}]}')
    assert '"k"' in message


def test_keys_that_differ_only_in_case_are_not_repeats() -> None:
    assert parse_json(b'{"tools": 1, "Tools": 2}') == {"tools": 1, "Tools": 2}


def test_a_repeated_key_written_with_an_escape_is_still_a_repeat() -> None:
    # "\u0061" is "a": a second spelling of the same key must not slip past.
    message = refusal(b'{"a": 1, "\\u0061": 2}')
    assert '"a"' in message


def test_a_repeated_key_is_named_with_its_invisible_characters_escaped() -> None:
    hostile_key = "\u202eevil\u2066"
    message = refusal(f'{{"{hostile_key}": 1, "{hostile_key}": 2}}'.encode())
    assert "\u202e" not in message
    assert "\u2066" not in message
    assert sanitize(message) == message


# --- UTF-8 and surrogates ----------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b'"\xff"', id="invalid-byte"),
        pytest.param(b'"\xc3"', id="truncated-sequence"),
        pytest.param(b'"\xc0\xaf"', id="overlong-slash"),
        pytest.param(b'"\xed\xa0\x80"', id="encoded-high-surrogate"),
        pytest.param(b'"\xed\xb0\x80"', id="encoded-low-surrogate"),
        pytest.param(b'"\xf4\x90\x80\x80"', id="beyond-u10ffff"),
        pytest.param(b'{"k\x80": 1}', id="bad-byte-in-key"),
    ],
)
def test_bad_utf8_is_refused_naming_the_byte(data: bytes) -> None:
    message = refusal(data)
    assert "not valid UTF-8" in message
    assert re.search(r"byte \d+", message)


@pytest.mark.parametrize(
    "document",
    [
        pytest.param('"\\ud800"', id="lone-high"),
        pytest.param('"\\udbff"', id="lone-high-last"),
        pytest.param('"\\udc00"', id="lone-low"),
        pytest.param('"\\udfff"', id="lone-low-last"),
        pytest.param('"\\ude00\\ud83d"', id="pair-in-wrong-order"),
        pytest.param('"x\\ud800y"', id="high-between-letters"),
        pytest.param('{"\\ud800": 1}', id="lone-high-in-key"),
        pytest.param('{"k": ["\\udc00"]}', id="lone-low-nested"),
    ],
)
def test_an_unpaired_surrogate_escape_is_refused(document: str) -> None:
    message = refusal(document.encode())
    assert "unpaired surrogate" in message


def test_an_unpaired_surrogate_in_a_str_argument_is_refused() -> None:
    # The str form of the boundary: a lone surrogate that is already a code point.
    message = refusal('"\ud800"')
    assert "unpaired surrogate" in message


def test_a_paired_surrogate_escape_is_one_code_point() -> None:
    assert parse_json(b'"\\ud83d\\ude00"') == "\U0001f600"


# --- depth -------------------------------------------------------------------


def test_depth_256_is_accepted() -> None:
    assert MAX_DEPTH == 256
    value = parse_json(nested_arrays(256).encode())
    depth = 0
    while isinstance(value, list):
        depth += 1
        value = value[0] if value else None
    assert depth == 256
    assert parse_json(nested_objects(256).encode()) is not None


@pytest.mark.parametrize("build", [nested_arrays, nested_objects], ids=["arrays", "objects"])
def test_depth_257_is_refused(build: Callable[[int], str]) -> None:
    message = refusal(build(257).encode())
    assert "nested deeper than 256" in message


def test_a_deep_mix_of_objects_and_arrays_is_counted_as_one_depth() -> None:
    mixed_257 = '{"a":[' * 128 + "{}" + "]}" * 128  # 128*2 + 1 = 257 levels
    assert "nested deeper than 256" in refusal(mixed_257.encode())
    mixed_256 = '{"a":[' * 128 + "1" + "]}" * 128  # 256 levels
    assert parse_json(mixed_256.encode()) is not None


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "document",
    [
        pytest.param("[" * 100_000, id="open-brackets"),
        pytest.param(nested_arrays(100_000), id="closed-brackets"),
        pytest.param('{"a":' * 100_000, id="open-objects"),
    ],
)
def test_a_hundred_thousand_open_brackets_fail_cleanly(document: str) -> None:
    message = refusal(document.encode())
    assert "nested deeper than 256" in message


# --- numbers -----------------------------------------------------------------


def test_a_number_literal_of_10000_characters_is_accepted_exactly() -> None:
    assert MAX_NUMBER_LITERAL == 10_000
    literal = "9" * 10_000
    value = parse_json(literal.encode())
    assert value == int(Decimal(literal))
    assert str(value) == literal
    negative = "-" + "8" * 9_999
    assert str(parse_json(negative.encode())) == negative


@pytest.mark.parametrize(
    "literal",
    [
        pytest.param("9" * 10_001, id="10001-digits"),
        pytest.param("-" + "9" * 10_000, id="sign-makes-10001"),
        pytest.param("1." + "0" * 9_999, id="fraction-10001"),
        pytest.param("[" + "1" * 20_000 + "]", id="in-an-array"),
    ],
)
def test_a_number_literal_over_10000_characters_is_refused(literal: str) -> None:
    message = refusal(literal.encode())
    assert "longer than the 10000 allowed" in message


@pytest.mark.parametrize("literal", ["1e10000", "1E+10000", "1e-10000", "-2.5e+010000"])
def test_an_exponent_of_10000_is_accepted(literal: str) -> None:
    assert MAX_NUMBER_EXPONENT == 10_000
    value = parse_json(literal.encode())
    assert isinstance(value, Decimal)
    assert value.as_tuple() == Decimal(literal).as_tuple()


@pytest.mark.parametrize(
    "literal",
    ["1e10001", "1E+10001", "1e-10001", "-1.5E-10001", "1e999999999", "1e" + "9" * 5_000],
)
def test_an_exponent_beyond_10000_is_refused(literal: str) -> None:
    message = refusal(literal.encode())
    assert "exponent is beyond ±10000" in message


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_literals_are_refused(literal: str) -> None:
    message = refusal(literal.encode())
    assert literal in message
    assert "not a JSON value" in message
    nested = refusal(f'{{"limit": [{literal}]}}'.encode())
    assert literal in nested


@pytest.mark.parametrize("literal", ["01", "+1", ".5", "1.", "0x10", "1e", "--1"])
def test_numbers_outside_the_json_grammar_are_refused(literal: str) -> None:
    refusal(literal.encode())


def test_9007199254740993_is_not_rounded_to_a_float() -> None:
    value = parse_json(b"9007199254740993")
    assert value == 9007199254740993
    assert isinstance(value, int)


def test_a_fraction_keeps_its_precision() -> None:
    assert str(parse_json(b"1.50")) == "1.50"
    assert parse_json(b"1.50").as_tuple() != parse_json(b"1.5").as_tuple()


# --- one value, nothing around it --------------------------------------------


@pytest.mark.parametrize(
    "document",
    [
        pytest.param(b"{} {}", id="two-objects"),
        pytest.param(b"1 2", id="two-numbers"),
        pytest.param(b'{"a": 1}x', id="letter-after"),
        pytest.param(b'{"a": 1}\x00', id="nul-after"),
        pytest.param(b'"a"\n"b"', id="json-lines"),
        pytest.param(b"[]]", id="extra-bracket"),
    ],
)
def test_trailing_data_after_the_value_is_refused(document: bytes) -> None:
    message = refusal(document)
    assert "more than one JSON value" in message


def test_whitespace_around_the_value_is_accepted() -> None:
    assert parse_json(b' \t\r\n{"a": 1} \t\r\n') == {"a": 1}


def test_a_utf8_byte_order_mark_is_refused() -> None:
    message = refusal(b'\xef\xbb\xbf{"a": 1}')
    assert "not valid JSON" in message


def test_a_byte_order_mark_in_a_str_argument_is_refused() -> None:
    refusal('\ufeff{"a": 1}')


@pytest.mark.parametrize(
    "document",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"   ", id="only-whitespace"),
        pytest.param(b"\xc2\xa0{}", id="no-break-space-is-not-json-whitespace"),
        pytest.param(b'{"a": 1,}', id="trailing-comma"),
        pytest.param(b"{'a': 1}", id="single-quotes"),
        pytest.param(b'"tab\there"', id="raw-control-in-string"),
        pytest.param(b'"\\x41"', id="invalid-escape"),
        pytest.param(b"[1, 2", id="unclosed"),
    ],
)
def test_malformed_json_is_refused_in_one_sentence(document: bytes) -> None:
    assert "not valid JSON" in refusal(document)
