"""CEL's standard operators and functions for conditions: typed as CEL types them, and
linear in the text they read.

cel-python evaluates CEL on Python's own types, and Python is lenient where CEL
is not: `true <= 100` holds (a bool is an int), `'rm' in "rm -rf /"` tests
single characters, `size(null)` is 0, `duration(30)` is thirty seconds, and a
macro ranges over a string's characters.  A condition written for one type and
handed another by the model must not decide by accident.  So every operator and
function cel-python defines is replaced here by one taking exactly the argument
types CEL's standard definitions list; anything else raises `ArgumentError`,
which cel-python turns into a CEL error (a person decides, unless `&&` or `||`
settles the answer without it, as CEL specifies).

Text is read without the library's parsers: `duration()` there is a
backtracking regular expression (25 letters and a `!` held the interpreter lock
for 6 s, each letter more doubled it) and `timestamp()` is pendulum's lenient
parser.  Here every conversion from text checks a bounded length first, then a
grammar that cannot backtrack.  `matches` runs RE2, linear in the text for a
given program but up to text bytes × program size when its DFA gives up, so a
search whose product exceeds `MATCH_STEPS` is refused instead of run.
"""

from __future__ import annotations

import datetime
import math
import operator
import re
import string
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

import celpy
import lark
import re2  # type: ignore[import-untyped]
from celpy import celtypes
from celpy.evaluation import CELEvalError, Evaluator

from ..sanitize import sanitize

__all__ = [
    "FUNCTIONS",
    "MATCH_STEPS",
    "NOT_CEL_MACROS",
    "ArgumentError",
    "StrictRunner",
    "kind_of",
]

# The most work one `matches` may do: text bytes × RE2 program size.  RE2's
# slowest path (its NFA, once the DFA's memory is spent) measured up to 14 ns a
# step here, so one search costs at most about 0.25 s, whatever the pattern.
MATCH_STEPS: Final = 1 << 24
# A pattern the model may send is at most this long, and compiles within this memory:
# compiling holds the interpreter lock, and under RE2's default 8 MiB a 22-character
# pattern took 70 ms to fail as too large, under 1 MiB 6 ms.
_PATTERN_CHARS: Final = 1000
_PATTERN_MEMORY: Final = 1 << 20
# The longest text a conversion reads: every valid duration, timestamp or number fits.
_TEXT_CHARS: Final = 64
_INT64: Final = 1 << 63
_UINT64: Final = 1 << 64
# CEL's duration range, about 10,000 years, in nanoseconds.
_DURATION_NANOS: Final = 315_576_000_000 * 10**9
_DIGITS: Final = frozenset(string.digits)
_DURATION_UNITS: Final = {
    "h": 3_600_000_000_000,
    "m": 60_000_000_000,
    "s": 1_000_000_000,
    "ms": 1_000_000,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # Greek mu
    "ns": 1,
}
# Fixed-width fields, one optional fraction: no quantifier can backtrack.
_RFC3339: Final = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(?:[Zz]|([+-])(\d{2}):(\d{2}))",
    re.ASCII,
)
_INT_TEXT: Final = re.compile(r"[+-]?\d{1,19}", re.ASCII)
_UINT_TEXT: Final = re.compile(r"\d{1,20}", re.ASCII)
# A mantissa then an exponent, each part starting with a different character.
_DOUBLE_TEXT: Final = re.compile(
    r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:inf|infinity|nan)",
    re.ASCII | re.IGNORECASE,
)
_BOOL_TEXT: Final = {
    **dict.fromkeys(("1", "t", "T", "true", "TRUE", "True"), True),
    **dict.fromkeys(("0", "f", "F", "false", "FALSE", "False"), False),
}
_ZONE_CHARS: Final = frozenset(string.ascii_letters + string.digits + "_+-/:")
_MAP_KEYS: Final = frozenset({"string", "int", "uint", "bool"})
_NUMBERS: Final = frozenset({"int", "uint", "double"})
_ORDERED: Final = frozenset(
    {"bool", "int", "uint", "double", "string", "bytes", "timestamp", "duration"}
)
# cel-python's own additions to CEL's macros; they are refused when a condition compiles.
NOT_CEL_MACROS: Final = frozenset({"reduce", "min"})


class ArgumentError(TypeError):
    """An operator or function given what CEL does not define it for (a type, or text it
    cannot read); the message says which.  A TypeError, which cel-python makes a CEL error."""


def kind_of(value: Any) -> str:
    """The CEL type of a value, by name (`bool` before `int`: a Python bool is an int)."""
    known = _KINDS.get(type(value))
    if known is not None:
        return known
    if isinstance(value, CELEvalError):
        return "error"
    if value is None:
        return "null_type"
    if isinstance(value, bool | celtypes.BoolType):
        return "bool"
    if isinstance(value, celtypes.UintType):
        return "uint"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bytes):
        return "bytes"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "map"
    if isinstance(value, datetime.datetime):
        return "timestamp"
    if isinstance(value, datetime.timedelta):
        return "duration"
    if isinstance(value, type | _Conversion):
        return "type"
    return type(value).__name__


# The types values have here, looked up before the checks in `kind_of` (a membership
# test over a long list asks for each element's type).
_KINDS: Final[dict[type, str]] = {
    celtypes.BoolType: "bool",
    celtypes.IntType: "int",
    celtypes.UintType: "uint",
    celtypes.DoubleType: "double",
    celtypes.StringType: "string",
    celtypes.BytesType: "bytes",
    celtypes.ListType: "list",
    celtypes.MapType: "map",
    celtypes.TimestampType: "timestamp",
    celtypes.DurationType: "duration",
    type(None): "null_type",
}


def _refuse(name: str, *arguments: Any) -> ArgumentError:
    kinds = " and ".join(kind_of(argument) for argument in arguments)
    return ArgumentError(f"'{name}' is not defined for {kinds}")


def _unreadable(name: str, text: str, what: str) -> ArgumentError:
    shown = str(text) if len(text) <= 40 else str(text)[:40] + "…"
    return ArgumentError(f"'{name}' cannot read {sanitize(repr(shown))}: {what}")


def _first_error(arguments: Iterable[Any]) -> CELEvalError | None:
    for argument in arguments:
        if isinstance(argument, CELEvalError):
            return argument
    return None


def _passing_errors(function: Callable[..., Any]) -> Callable[..., Any]:
    """An error among the arguments is the result (cel-python hands operators errors)."""

    def strict(*arguments: Any) -> Any:
        error = _first_error(arguments)
        return error if error is not None else function(*arguments)

    strict.__name__ = function.__name__
    return strict


# -- equality, ordering, membership --------------------------------------------


def _equal(left: Any, right: Any) -> bool:
    """CEL equality: null equals only null; otherwise both sides must be of one type
    (`int == double` included: it is refused, not converted)."""
    left_kind, right_kind = kind_of(left), kind_of(right)
    if "null_type" in (left_kind, right_kind):
        return left_kind == right_kind
    if left_kind != right_kind:
        raise _refuse("==", left, right)
    if left_kind == "list":
        return _all_equal(zip(left, right, strict=False), len(left) == len(right))
    if left_kind == "map":
        if len(left) != len(right):
            return False
        theirs = {(kind_of(key), key): value for key, value in right.items()}
        if any((kind_of(key), key) not in theirs for key in left):
            return False
        pairs = ((value, theirs[kind_of(key), key]) for key, value in left.items())
        return _all_equal(pairs, True)
    if left_kind == "type":
        return _type_of(left) is _type_of(right)
    return bool(operator.eq(_plain(left), _plain(right)))


def _all_equal(pairs: Iterable[tuple[Any, Any]], same_size: bool) -> bool:
    """Every pair equal; one pair that differs decides false over a pair of other types."""
    if not same_size:
        return False
    refused: ArgumentError | None = None
    for mine, theirs in pairs:
        try:
            if not _equal(mine, theirs):
                return False
        except ArgumentError as exc:
            refused = exc
    if refused is not None:
        raise refused
    return True


def _plain(value: Any) -> Any:
    """A number as Python's own, so int and float compare exactly (cel-python's refuse)."""
    kind = kind_of(value)
    if kind in ("int", "uint"):
        return int(value)
    if kind == "double":
        return float(value)
    return value


def _type_of(value: Any) -> Any:
    return value.cel_type if isinstance(value, _Conversion) else value


@_passing_errors
def _equals(left: Any, right: Any) -> Any:
    return celtypes.BoolType(_equal(left, right))


@_passing_errors
def _differs(left: Any, right: Any) -> Any:
    return celtypes.BoolType(not _equal(left, right))


def _ordering(symbol: str, compare: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    @_passing_errors
    def ordered(left: Any, right: Any) -> Any:
        left_kind, right_kind = kind_of(left), kind_of(right)
        same = left_kind == right_kind and left_kind in _ORDERED
        if not (same or (left_kind in _NUMBERS and right_kind in _NUMBERS)):
            raise _refuse(symbol, left, right)
        return celtypes.BoolType(compare(_plain(left), _plain(right)))

    return ordered


@_passing_errors
def _in(item: Any, container: Any) -> Any:
    """`item in list` (an element equal to it) or `key in map`; never in a string."""
    container_kind = kind_of(container)
    if container_kind == "list":
        candidates: Iterable[Any] = container
    elif container_kind == "map" and kind_of(item) in _MAP_KEYS:
        candidates = container.keys()
    else:
        raise _refuse("in", item, container)
    other: Any = None
    for candidate in candidates:
        try:
            if _equal(candidate, item):
                return celtypes.BoolType(True)
        except ArgumentError:
            other = candidate
    if other is not None:
        raise ArgumentError(
            f"'in' is not defined for {kind_of(item)} and a {container_kind} holding "
            f"{kind_of(other)}"
        )
    return celtypes.BoolType(False)


# -- logic -----------------------------------------------------------------------


def _as_logical(value: Any, symbol: str) -> Any:
    """A bool or an error as it is; anything else an error (CEL's `&&`, `||` take bools)."""
    if isinstance(value, CELEvalError) or kind_of(value) == "bool":
        return value
    problem = _refuse(symbol, value)
    return CELEvalError(str(problem), ArgumentError, problem.args)


def _and(left: Any, right: Any) -> Any:
    """CEL's `&&`: false if either side is false, whatever the other; else an error if any."""
    left, right = _as_logical(left, "&&"), _as_logical(right, "&&")
    for side in (left, right):
        if not isinstance(side, CELEvalError) and not side:
            return celtypes.BoolType(False)
    error = _first_error((left, right))
    return error if error is not None else celtypes.BoolType(True)


def _or(left: Any, right: Any) -> Any:
    """CEL's `||`: true if either side is true, whatever the other; else an error if any."""
    left, right = _as_logical(left, "||"), _as_logical(right, "||")
    for side in (left, right):
        if not isinstance(side, CELEvalError) and side:
            return celtypes.BoolType(True)
    error = _first_error((left, right))
    return error if error is not None else celtypes.BoolType(False)


@_passing_errors
def _not(value: Any) -> Any:
    if kind_of(value) != "bool":
        raise _refuse("!", value)
    return celtypes.BoolType(not value)


def _choose(condition: Any, chosen: Any, other: Any) -> Any:
    if isinstance(condition, CELEvalError):
        return condition
    if kind_of(condition) != "bool":
        raise _refuse("? :", condition)
    return chosen if condition else other


# -- arithmetic ------------------------------------------------------------------

_ADDITIONS: Final = frozenset(
    {
        ("int", "int"), ("uint", "uint"), ("double", "double"), ("string", "string"),
        ("bytes", "bytes"), ("list", "list"), ("timestamp", "duration"),
        ("duration", "timestamp"), ("duration", "duration"),
    }
)  # fmt: skip
_SUBTRACTIONS: Final = frozenset(
    {
        ("int", "int"), ("uint", "uint"), ("double", "double"),
        ("timestamp", "timestamp"), ("timestamp", "duration"), ("duration", "duration"),
    }
)  # fmt: skip
_ALIKE_NUMBERS: Final = frozenset({("int", "int"), ("uint", "uint"), ("double", "double")})
_WRAPPERS: Final[dict[str, Callable[[Any], Any]]] = {
    "double": celtypes.DoubleType,
    "string": celtypes.StringType,
    "bytes": celtypes.BytesType,
    "list": celtypes.ListType,
}


def _arithmetic(
    symbol: str, pairs: frozenset[tuple[str, str]], apply: Callable[[Any, Any], Any]
) -> Callable[..., Any]:
    """An operator over exactly `pairs` of types; cel-python's types check the ranges."""

    @_passing_errors
    def arithmetic(left: Any, right: Any) -> Any:
        pair = (kind_of(left), kind_of(right))
        if pair not in pairs:
            raise _refuse(symbol, left, right)
        if pair == ("duration", "timestamp"):
            left, right = right, left
        result = apply(left, right)
        # Python's `str + str` is a str, `float * float` a float: CEL's types again.
        wrap = _WRAPPERS.get(kind_of(result))
        return wrap(result) if wrap is not None else result

    return arithmetic


@_passing_errors
def _negate(value: Any) -> Any:
    if kind_of(value) not in ("int", "double"):
        raise _refuse("-", value)
    return -value


# -- indexing, size, strings -----------------------------------------------------


@_passing_errors
def _index(container: Any, key: Any) -> Any:
    container_kind, key_kind = kind_of(container), kind_of(key)
    if container_kind == "list" and key_kind in ("int", "uint"):
        position = int(key)
        if not 0 <= position < len(container):
            raise ArgumentError(f"index {position} is outside a list of {len(container)}")
        return container[position]
    if container_kind == "map" and key_kind in _MAP_KEYS:
        return container[key]
    raise _refuse("[]", container, key)


@_passing_errors
def _size(value: Any) -> Any:
    if kind_of(value) not in ("string", "bytes", "list", "map"):
        raise _refuse("size()", value)
    return celtypes.IntType(len(value))


def _text_test(name: str, test: Callable[[str, str], bool]) -> Callable[..., Any]:
    @_passing_errors
    def text_test(text: Any, fragment: Any) -> Any:
        if kind_of(text) != "string" or kind_of(fragment) != "string":
            raise _refuse(name, text, fragment)
        return celtypes.BoolType(test(text, fragment))

    return text_test


@_passing_errors
def _matches(text: Any, pattern: Any) -> Any:
    """RE2 search, refused where its worst case (text bytes × program size) is over budget."""
    if kind_of(text) != "string" or kind_of(pattern) != "string":
        raise _refuse("matches()", text, pattern)
    if len(pattern) > _PATTERN_CHARS:
        raise ArgumentError(f"'matches()' takes a pattern of at most {_PATTERN_CHARS} characters")
    try:
        encoded = str(text).encode("utf-8")
        options = re2.Options()
        options.never_capture = True  # a yes or no needs no groups, whose search is slower
        options.log_errors = False
        options.max_mem = _PATTERN_MEMORY
        program = re2.compile(str(pattern), options)
    except UnicodeEncodeError:
        raise ArgumentError("'matches()' cannot search text holding a lone surrogate") from None
    except re2.error as exc:
        raise _unreadable("matches()", str(pattern), f"not an RE2 pattern ({exc})") from None
    if len(encoded) * max(1, program.programsize) > MATCH_STEPS:
        raise ArgumentError(
            f"'matches()' would search {len(encoded)} bytes with a program of "
            f"{program.programsize} steps, more than its budget of {MATCH_STEPS}"
        )
    return celtypes.BoolType(program.search(encoded) is not None)


# -- conversions -----------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class _Conversion:
    """A CEL type name: called, a conversion from the types CEL lists; compared, the type."""

    name: str
    cel_type: Any
    convert: Callable[[Any], Any] | None

    def __call__(self, *arguments: Any) -> Any:
        error = _first_error(arguments)
        if error is not None:
            return error
        if self.convert is None or len(arguments) != 1:
            raise _refuse(f"{self.name}()", *arguments)
        return self.convert(arguments[0])


def _bounded_text(name: str, text: str) -> str:
    if len(text) > _TEXT_CHARS:
        raise _unreadable(name, text, f"longer than {_TEXT_CHARS} characters")
    return text


def _to_int(value: Any) -> Any:
    kind = kind_of(value)
    if kind == "int":
        return value
    if kind == "uint":
        number = int(value)
    elif kind == "double":
        if not math.isfinite(value):
            raise ArgumentError("'int()' of a double that is not finite")
        number = math.trunc(value)
    elif kind == "string":
        if not _INT_TEXT.fullmatch(_bounded_text("int()", value)):
            raise _unreadable("int()", value, "not a decimal integer")
        number = int(value)
    elif kind == "timestamp":
        number = math.floor(value.timestamp())
    else:
        raise _refuse("int()", value)
    if not -_INT64 <= number < _INT64:
        raise ArgumentError(f"'int()' of {number} is outside CEL's 64-bit int")
    return celtypes.IntType(number)


def _to_uint(value: Any) -> Any:
    kind = kind_of(value)
    if kind == "uint":
        return value
    if kind == "int":
        number = int(value)
    elif kind == "double":
        if not math.isfinite(value):
            raise ArgumentError("'uint()' of a double that is not finite")
        number = math.trunc(value)
    elif kind == "string":
        if not _UINT_TEXT.fullmatch(_bounded_text("uint()", value)):
            raise _unreadable("uint()", value, "not an unsigned decimal integer")
        number = int(value)
    else:
        raise _refuse("uint()", value)
    if not 0 <= number < _UINT64:
        raise ArgumentError(f"'uint()' of {number} is outside CEL's 64-bit uint")
    return celtypes.UintType(number)


def _to_double(value: Any) -> Any:
    kind = kind_of(value)
    if kind == "double":
        return value
    if kind in ("int", "uint"):
        return celtypes.DoubleType(float(int(value)))
    if kind == "string":
        if not _DOUBLE_TEXT.fullmatch(_bounded_text("double()", value)):
            raise _unreadable("double()", value, "not a decimal number")
        return celtypes.DoubleType(float(value))
    raise _refuse("double()", value)


def _to_string(value: Any) -> Any:
    kind = kind_of(value)
    if kind == "string":
        return value
    if kind == "bool":
        return celtypes.StringType("true" if value else "false")
    if kind in ("int", "uint"):
        return celtypes.StringType(str(int(value)))
    if kind in ("double", "timestamp"):
        return celtypes.StringType(str(value))
    if kind == "duration":
        return celtypes.StringType(_duration_text(value))
    if kind == "bytes":
        try:
            return celtypes.StringType(bytes(value).decode("utf-8"))
        except UnicodeDecodeError:
            raise ArgumentError("'string()' of bytes that are not UTF-8") from None
    raise _refuse("string()", value)


def _to_bytes(value: Any) -> Any:
    kind = kind_of(value)
    if kind == "bytes":
        return value
    if kind == "string":
        try:
            return celtypes.BytesType(str(value).encode("utf-8"))
        except UnicodeEncodeError:
            raise ArgumentError("'bytes()' of a string holding a lone surrogate") from None
    raise _refuse("bytes()", value)


def _to_bool(value: Any) -> Any:
    kind = kind_of(value)
    if kind == "bool":
        return value
    if kind == "string" and str(value) in _BOOL_TEXT:
        return celtypes.BoolType(_BOOL_TEXT[str(value)])
    if kind == "string":
        raise _unreadable("bool()", value, "not true or false")
    raise _refuse("bool()", value)


def _to_duration(value: Any) -> Any:
    kind = kind_of(value)
    if kind == "duration":
        return value
    if kind != "string":
        raise _refuse("duration()", value)
    nanos = _duration_nanos(_bounded_text("duration()", str(value)))
    # timedelta keeps microseconds: truncated towards zero, as CEL's own types are.
    micros = nanos // 1000 if nanos >= 0 else -(-nanos // 1000)
    return celtypes.DurationType(datetime.timedelta(microseconds=micros))


def _duration_nanos(text: str) -> int:
    """A Go-style duration (`1h30m`, `-2.5s`, `300ms`, `0`) in nanoseconds, read in one
    pass: each part is digits, an optional fraction, then a unit."""

    def unreadable() -> ArgumentError:
        return _unreadable("duration()", text, "not a duration such as 1h30m or 2.5s")

    position, sign = 0, 1
    if text[:1] in ("+", "-"):
        sign = -1 if text[0] == "-" else 1
        position = 1
    if text[position:] == "0":
        return 0
    if position == len(text):
        raise unreadable()
    total = 0
    while position < len(text):
        start = position
        while position < len(text) and text[position] in _DIGITS:
            position += 1
        whole = text[start:position]
        fraction = ""
        if position < len(text) and text[position] == ".":
            position += 1
            start = position
            while position < len(text) and text[position] in _DIGITS:
                position += 1
            fraction = text[start:position]
        start = position
        while position < len(text) and text[position] not in _DIGITS and text[position] != ".":
            position += 1
        unit = _DURATION_UNITS.get(text[start:position])
        if unit is None or not (whole or fraction):
            raise unreadable()
        total += int(whole or "0") * unit
        if fraction:
            total += int(fraction) * unit // 10 ** len(fraction)
        if total > _DURATION_NANOS:
            raise ArgumentError(f"'duration()' of {sanitize(repr(text))} is beyond 10,000 years")
    return sign * total


def _duration_text(value: datetime.timedelta) -> str:
    """A duration as CEL writes it: seconds with only the fraction they need (`1.5s`)."""
    micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    sign = "-" if micros < 0 else ""
    seconds, fraction = divmod(abs(micros), 1_000_000)
    return f"{sign}{seconds}.{fraction:06d}".rstrip("0").rstrip(".") + "s"


def _to_timestamp(value: Any) -> Any:
    kind = kind_of(value)
    if kind == "timestamp":
        return value
    if kind != "string":
        raise _refuse("timestamp()", value)
    text = _bounded_text("timestamp()", str(value))
    parts = _RFC3339.fullmatch(text)
    if parts is None:
        raise _unreadable("timestamp()", text, "not an RFC 3339 time such as 2025-01-31T12:00:00Z")
    year, month, day, hour, minute, second, fraction, sign, zone_hours, zone_minutes = (
        parts.groups()
    )
    offset = datetime.timedelta(0)
    if sign is not None:
        offset = datetime.timedelta(hours=int(zone_hours), minutes=int(zone_minutes))
        offset = -offset if sign == "-" else offset
    try:
        moment = datetime.datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second),
            int((fraction or "0")[:6].ljust(6, "0")), tzinfo=datetime.timezone(offset),
        )  # fmt: skip
    except ValueError as exc:
        raise _unreadable("timestamp()", text, str(exc)) from None
    return celtypes.TimestampType(moment)


# -- timestamp and duration parts ------------------------------------------------


def _part(name: str, of_durations: bool) -> Callable[..., Any]:
    """`t.getHours()`, `t.getHours('Europe/Paris')`, `d.getHours()`: cel-python's own, once
    the receiver's type and the time zone's spelling are checked."""

    @_passing_errors
    def part(value: Any, *zone: Any) -> Any:
        kind = kind_of(value)
        if kind == "duration" and of_durations and not zone:
            return getattr(value, name)()
        if kind != "timestamp" or len(zone) > 1:
            raise _refuse(f"{name}()", value, *zone)
        if zone and kind_of(zone[0]) != "string":
            raise _refuse(f"{name}()", value, *zone)
        if zone:
            _check_zone(str(zone[0]))
        try:
            return getattr(value, name)(*zone)
        except (ValueError, OSError, LookupError):
            # An unknown zone (or a directory of zones) is the condition's error, not ours.
            shown = str(zone[0]) if zone else "UTC"
            raise _unreadable(f"{name}()", shown, "not a known time zone") from None

    return part


def _check_zone(zone: str) -> None:
    """An IANA name (`Europe/Paris`) or an offset (`+05:30`): short, plain characters, no
    way out of the zone database."""
    if not (
        0 < len(zone) <= _TEXT_CHARS
        and set(zone) <= _ZONE_CHARS
        and not zone.startswith("/")
        and "//" not in zone
    ):
        raise _unreadable("a time zone", zone, "not a zone name such as Europe/Paris or +05:30")


# -- macros and has() --------------------------------------------------------------

_MACROS: Final = frozenset({"all", "exists", "exists_one", "map", "filter"})


class _StrictEvaluator(Evaluator):
    """cel-python's evaluator, but a macro ranges over a list or a map only (never a
    string's characters) and `has()` selects a field of a map only."""

    def sub_evaluator(self, ast: lark.Tree[Any]) -> Evaluator:
        return _StrictEvaluator(ast, activation=self.activation)

    def member_dot_arg(self, tree: lark.Tree[Any]) -> Any:
        method = tree.children[1]
        name = method.value if isinstance(method, lark.Token) else ""
        if name not in _MACROS:
            return super().member_dot_arg(tree)
        target = self.visit(tree.children[0])  # type: ignore[arg-type]
        if isinstance(target, CELEvalError):
            return target
        if kind_of(target) not in ("list", "map"):
            return _error(_refuse(f"{name}()", target), tree)
        items = list(target)  # a map's keys, as CEL ranges over them
        if name in ("all", "exists"):
            return self._quantify(name, tree, items)
        predicate = self.build_macro_eval(tree)  # an error in it raises: the whole fails
        if name == "map":
            return celtypes.ListType([predicate(item) for item in items])
        kept, count = [], 0
        for item in items:
            held = predicate(item)
            if kind_of(held) != "bool":
                problem = f"'{name}()' needs true or false from its predicate, not {kind_of(held)}"
                return _error(ArgumentError(problem), tree)
            if held:
                kept.append(item)
                count += 1
        if name == "filter":
            return celtypes.ListType(kept)
        return celtypes.BoolType(count == 1)

    def _quantify(self, name: str, tree: lark.Tree[Any], items: list[Any]) -> Any:
        """`all` as `&&` and `exists` as `||` over the items: an error on one item is
        absorbed by a false (a true) on another, as CEL specifies."""
        predicate = self.build_ss_macro_eval(tree)
        combine, settled = (_and, False) if name == "all" else (_or, True)
        result: Any = celtypes.BoolType(not settled)
        for item in items:
            result = combine(result, predicate(item))
            if not isinstance(result, CELEvalError) and bool(result) is settled:
                break
        return result

    def macro_has_eval(self, exprlist: lark.Tree[Any]) -> Any:
        node: Any = exprlist
        while isinstance(node, lark.Tree) and node.data != "member_dot" and len(node.children) == 1:
            node = node.children[0]
        if not (isinstance(node, lark.Tree) and node.data == "member_dot"):
            return _error(ArgumentError("'has()' takes a field selection, such as has(args.path)"))
        container = self.visit(node.children[0])  # type: ignore[arg-type]
        if isinstance(container, CELEvalError):
            return container
        if kind_of(container) != "map":
            return _error(_refuse("has()", container), node)
        field = node.children[1]
        return celtypes.BoolType(str(field) in container)


def _error(problem: ArgumentError, tree: lark.Tree[Any] | None = None) -> CELEvalError:
    error = CELEvalError(str(problem), ArgumentError, problem.args, tree=tree)
    error.__cause__ = problem
    return error


class StrictRunner(celpy.InterpretedRunner):
    """cel-python's interpreter with the strict evaluator above."""

    def evaluate(self, context: Any) -> Any:
        return _StrictEvaluator(ast=self.ast, activation=self.new_activation()).evaluate(context)


# Every name cel-python defines, replaced (`type` is kept: it only names a value's type).
FUNCTIONS: Final[dict[str, Any]] = {
    "!_": _not,
    "-_": _negate,
    "_+_": _arithmetic("+", _ADDITIONS, operator.add),
    "_-_": _arithmetic("-", _SUBTRACTIONS, operator.sub),
    "_*_": _arithmetic("*", _ALIKE_NUMBERS, operator.mul),
    "_/_": _arithmetic("/", _ALIKE_NUMBERS, operator.truediv),
    "_%_": _arithmetic("%", frozenset({("int", "int"), ("uint", "uint")}), operator.mod),
    "_<_": _ordering("<", operator.lt),
    "_<=_": _ordering("<=", operator.le),
    "_>_": _ordering(">", operator.gt),
    "_>=_": _ordering(">=", operator.ge),
    "_==_": _equals,
    "_!=_": _differs,
    "_in_": _in,
    "_||_": _or,
    "_&&_": _and,
    "_?_:_": _choose,
    "_[_]": _index,
    "size": _size,
    "contains": _text_test("contains()", lambda text, fragment: fragment in text),
    "startsWith": _text_test("startsWith()", str.startswith),
    "endsWith": _text_test("endsWith()", str.endswith),
    "matches": _matches,
    "type": celtypes.TypeType,
    "getDate": _part("getDate", of_durations=False),
    "getDayOfMonth": _part("getDayOfMonth", of_durations=False),
    "getDayOfWeek": _part("getDayOfWeek", of_durations=False),
    "getDayOfYear": _part("getDayOfYear", of_durations=False),
    "getFullYear": _part("getFullYear", of_durations=False),
    "getMonth": _part("getMonth", of_durations=False),
    "getHours": _part("getHours", of_durations=True),
    "getMilliseconds": _part("getMilliseconds", of_durations=True),
    "getMinutes": _part("getMinutes", of_durations=True),
    "getSeconds": _part("getSeconds", of_durations=True),
    "bool": _Conversion("bool", celtypes.BoolType, _to_bool),
    "bytes": _Conversion("bytes", celtypes.BytesType, _to_bytes),
    "double": _Conversion("double", celtypes.DoubleType, _to_double),
    "duration": _Conversion("duration", celtypes.DurationType, _to_duration),
    "int": _Conversion("int", celtypes.IntType, _to_int),
    "list": _Conversion("list", celtypes.ListType, None),
    "map": _Conversion("map", celtypes.MapType, None),
    "null_type": _Conversion("null_type", type(None), None),
    "string": _Conversion("string", celtypes.StringType, _to_string),
    "timestamp": _Conversion("timestamp", celtypes.TimestampType, _to_timestamp),
    "uint": _Conversion("uint", celtypes.UintType, _to_uint),
}
