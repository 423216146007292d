"""The JSON boundary and the canonical encoder.

Everything a model or a server hands the runtime as JSON passes `parse_json`,
which refuses what a careful reader would: bad UTF-8, repeated keys, unpaired
surrogates, absurd nesting and absurd numbers.  `canonical_json` writes a
parsed value back in one stable form that keeps every number literal, so a
hash over it changes whenever the meaning (or the precision) of the input
changes and never when only whitespace or key order does.

Numbers are parsed as `int` (integer literals up to 4,000 digits) or
`decimal.Decimal` (every other literal).  A `Decimal` keeps its digits and
exponent, so `1.50` stays distinct from `1.5` and `9007199254740993` is never
rounded to a float64.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from hashlib import sha256 as _sha256
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any, Final

from .sanitize import sanitize

__all__ = [
    "MAX_DEPTH",
    "MAX_NUMBER_EXPONENT",
    "MAX_NUMBER_LITERAL",
    "JSONBoundaryError",
    "canonical_bytes",
    "canonical_json",
    "json_string",
    "parse_json",
    "plain_json",
    "sha256_hex",
]

MAX_DEPTH: Final = 256
MAX_NUMBER_LITERAL: Final = 10_000
MAX_NUMBER_EXPONENT: Final = 10_000

# Python's int() refuses more than 4,300 digits by default; longer integer
# literals (still within MAX_NUMBER_LITERAL) are kept as Decimal instead.
_INT_DIGITS_AS_INT: Final = 4_000

_encode_string: Callable[[str], str] = encode_basestring
_EXPONENT = re.compile(r"[eE]([+-]?)0*(\d*)$")


class JSONBoundaryError(ValueError):
    """Raised when input is not one well-formed JSON value the runtime accepts."""


def _check_literal(literal: str) -> None:
    if len(literal) > MAX_NUMBER_LITERAL:
        raise JSONBoundaryError(
            f"a number literal of {len(literal)} characters is longer than "
            f"the {MAX_NUMBER_LITERAL} allowed"
        )
    match = _EXPONENT.search(literal)
    if match is not None:
        digits = match.group(2) or "0"
        # Compare by length first: int() of a 9,000-digit exponent is itself a hazard.
        if len(digits) > 6 or int(digits) > MAX_NUMBER_EXPONENT:
            raise JSONBoundaryError(f"a number's exponent is beyond ±{MAX_NUMBER_EXPONENT}")


def _parse_int(literal: str) -> int | Decimal:
    _check_literal(literal)
    # "-0" is kept as a Decimal so its sign survives a round trip.
    if len(literal) > _INT_DIGITS_AS_INT or literal == "-0":
        return Decimal(literal)
    return int(literal)


def _parse_float(literal: str) -> Decimal:
    _check_literal(literal)
    return Decimal(literal)


def _parse_constant(name: str) -> Any:
    raise JSONBoundaryError(f"{name} is not a JSON value")


def _object_without_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        # Some key is repeated: name the first one met again, reading in order.
        seen: set[str] = set()
        for key, _value in pairs:
            if key in seen:
                raise JSONBoundaryError(
                    f"the key {sanitize(_encode_string(key))} is repeated in one object"
                )
            seen.add(key)
    return result


_decoder = json.JSONDecoder(
    object_pairs_hook=_object_without_repeats,
    parse_int=_parse_int,
    parse_float=_parse_float,
    parse_constant=_parse_constant,
    strict=True,
)


def _check_tree(value: Any) -> None:
    """Refuse depth past MAX_DEPTH and unpaired surrogates, iteratively."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            _check_string(node)
        elif isinstance(node, dict):
            if depth > MAX_DEPTH:
                raise JSONBoundaryError(f"the value is nested deeper than {MAX_DEPTH} levels")
            for key, item in node.items():
                _check_string(key)
                if isinstance(item, (dict, list, str)):
                    stack.append((item, depth + 1))
        elif isinstance(node, list):
            if depth > MAX_DEPTH:
                raise JSONBoundaryError(f"the value is nested deeper than {MAX_DEPTH} levels")
            for item in node:
                if isinstance(item, (dict, list, str)):
                    stack.append((item, depth + 1))


def _check_string(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise JSONBoundaryError("a string contains an unpaired surrogate escape") from None


def parse_json(data: bytes | str) -> Any:
    """Parse exactly one JSON value, refusing anything outside the boundary rules.

    Raises `JSONBoundaryError` with one sentence saying what was wrong.
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            text = bytes(data).decode("utf-8", errors="strict")
        except UnicodeDecodeError as exc:
            raise JSONBoundaryError(f"the input is not valid UTF-8 (byte {exc.start})") from None
    else:
        text = data
    try:
        value, end = _decoder.raw_decode(text, _skip_whitespace(text, 0))
    except JSONBoundaryError:
        raise
    except RecursionError:
        raise JSONBoundaryError(f"the value is nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise JSONBoundaryError(
            f"the input is not valid JSON: {exc.msg} at character {exc.pos}"
        ) from None
    except ValueError as exc:  # e.g. int() limits
        raise JSONBoundaryError(f"the input is not valid JSON: {exc}") from None
    if _skip_whitespace(text, end) != len(text):
        raise JSONBoundaryError(
            f"the input holds more than one JSON value (extra data at character {end})"
        )
    if _tree_may_be_refused(text, data is not text):
        _check_tree(value)
    return value


def _tree_may_be_refused(text: str, from_bytes: bool) -> bool:
    """Whether `_check_tree` could refuse what `text` parsed to; when not, it need not run.

    An unpaired surrogate can only come from a `\\u` escape or, in text not
    decoded here from UTF-8, from the text itself; nesting past `MAX_DEPTH`
    needs more than `MAX_DEPTH` opening brackets.
    """
    if "\\u" in text or not (from_bytes or text.isascii()):
        return True
    return text.count("{") + text.count("[") > MAX_DEPTH


_WHITESPACE = re.compile(r"[ \t\n\r]*")


def _skip_whitespace(text: str, position: int) -> int:
    match = _WHITESPACE.match(text, position)
    return match.end() if match else position


def _number_literal(number: int | Decimal | float) -> str:
    if isinstance(number, int):
        return str(number)
    if isinstance(number, float):
        if number != number or number in (float("inf"), float("-inf")):
            raise JSONBoundaryError("NaN and infinities are not JSON numbers")
        if number.is_integer() and abs(number) < 2**53:
            return str(int(number))
        # Through Decimal, so a float and its parsed-back literal print alike.
        number = Decimal(repr(number))
    if not number.is_finite():
        raise JSONBoundaryError("NaN and infinities are not JSON numbers")
    # str(Decimal) keeps the digits and exponent as parsed; only the exponent
    # marker is normalised ("1E+2" -> "1e2").
    return str(number).replace("E+", "e").replace("E", "e")


def _encode(value: Any, out: list[str]) -> None:
    # The common kinds first, by exact type (a payload the runtime built itself is
    # all dicts, lists, strings and ints); anything else, subclasses included, takes
    # the general path below, which decides every case exactly as before.
    kind = type(value)
    if kind is str:
        out.append(_encode_string(value))
    elif kind is dict:
        if not value:
            out.append("{}")
            return
        separator = "{"
        for key in sorted(value):
            if type(key) is not str and not isinstance(key, str):
                raise TypeError(f"object keys must be strings, not {type(key).__name__}")
            out.append(separator)
            separator = ","
            out.append(_encode_string(key))
            out.append(":")
            item = value[key]
            if type(item) is str:
                out.append(_encode_string(item))
            else:
                _encode(item, out)
        out.append("}")
    elif kind is int:
        out.append(int.__repr__(value))
    elif kind is list:
        separator = "["
        for item in value:
            out.append(separator)
            separator = ","
            _encode(item, out)
        out.append("]" if separator == "," else "[]")
    else:
        _encode_other(value, out)


def _encode_other(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(_encode_string(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, (int, Decimal, float)):
        out.append(_number_literal(value))
    elif isinstance(value, Mapping):
        out.append("{")
        first = True
        for key in sorted(value):
            if not isinstance(key, str):
                raise TypeError(f"object keys must be strings, not {type(key).__name__}")
            if not first:
                out.append(",")
            first = False
            out.append(_encode_string(key))
            out.append(":")
            _encode(value[key], out)
        out.append("}")
    elif isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _encode(item, out)
        out.append("]")
    else:
        raise TypeError(f"{type(value).__name__} is not a JSON value")


def canonical_json(value: Any) -> str:
    """Encode a parsed JSON value canonically.

    Keys sorted by code point, no insignificant whitespace, no HTML escaping,
    strings escaped only where JSON requires, every number written from its
    literal (exponent marker normalised).  Pass the output of `parse_json`
    (or plain Python JSON values) — a `str` argument is a JSON *string*.
    """
    out: list[str] = []
    _encode(value, out)
    return "".join(out)


def json_string(text: str) -> str:
    """`canonical_json` of a string, without the dispatch: the quoted, escaped text."""
    return _encode_string(text)


def canonical_bytes(value: Any) -> bytes:
    """`canonical_json` as UTF-8 bytes, the form every hash is taken over."""
    return canonical_json(value).encode("utf-8")


def plain_json(value: Any) -> Any:
    """A parsed JSON value (Decimal numbers) as plain Python (floats), for libraries
    such as the MCP SDK's models that do not take Decimals."""
    import json

    return json.loads(canonical_json(value))


def sha256_hex(data: bytes) -> str:
    """SHA-256 of `data`, lowercase hex."""
    return _sha256(data).hexdigest()
