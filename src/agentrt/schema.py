"""Self-contained JSON Schema compilation.

A tool schema may come from a server the operator does not control.  If the
compiler followed a `$ref` to `file:///home/op/.ssh/id_ed25519` or
`http://169.254.169.254/`, that server could make the runtime read the
operator's files, block on a pipe or reach the network.  So a schema is first
checked to be self-contained (`check_self_contained`), then compiled against a
registry holding only the standard metaschemas, with retrieval refused.

jsonschema (about 60 ms to import) is imported only when a schema needs it: a
2020-12 schema the fast proof (`agentrt.metaschema`) shows valid compiles without
it, and a value the schema's plan proves valid is checked without it, so a proxy
whose servers' schemas are of that kind answers its host before jsonschema loads
(issue 36).  Everything that refuses still comes from jsonschema.
"""

from __future__ import annotations

import contextvars
import functools
import numbers
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Final

from .errors import SchemaError
from .metaschema import DIALECT, proves_valid
from .sanitize import sanitize

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

__all__ = [
    "WELL_KNOWN_DRAFTS",
    "CompiledSchema",
    "check_self_contained",
    "compile_schema",
    "prepare_for",
]

# Each draft's metaschema URI, and the name of jsonschema's validator class for it.
_DRAFT_VALIDATORS: Final[dict[str, str]] = {
    "http://json-schema.org/draft-03/schema": "Draft3Validator",
    "http://json-schema.org/draft-04/schema": "Draft4Validator",
    "http://json-schema.org/draft-06/schema": "Draft6Validator",
    "http://json-schema.org/draft-07/schema": "Draft7Validator",
    "https://json-schema.org/draft/2019-09/schema": "Draft201909Validator",
    "https://json-schema.org/draft/2020-12/schema": "Draft202012Validator",
}

WELL_KNOWN_DRAFTS: Final = frozenset(
    {uri for base in _DRAFT_VALIDATORS for uri in (base, base + "#")}
)
"""The draft metaschema URIs a schema may name in `$schema` or `$id`."""

_OLD_DRAFTS: Final = frozenset(
    {
        "http://json-schema.org/draft-03/schema",
        "http://json-schema.org/draft-03/schema#",
        "http://json-schema.org/draft-04/schema",
        "http://json-schema.org/draft-04/schema#",
    }
)
_REF_KEYWORDS: Final = ("$ref", "$dynamicRef", "$recursiveRef")
_SCHEME_OR_HOST: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:|^//")


def _refuse_retrieval(uri: str) -> Any:
    from referencing.exceptions import NoSuchResource

    # Nothing outside the document and the bundled metaschemas is ever read.
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]


@functools.cache
def _registry() -> Any:
    """The registry every validator resolves in: the standard metaschemas, nothing else."""
    from jsonschema_specifications import REGISTRY as METASCHEMAS
    from referencing import Registry

    return Registry(retrieve=_refuse_retrieval).combine(METASCHEMAS)  # type: ignore[call-arg]


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    stack: list[tuple[Any, str]] = [(node, path)]
    while stack:
        current, where = stack.pop()
        if isinstance(current, dict):
            yield where, current
            for key, value in current.items():
                if isinstance(value, (dict, list)):
                    stack.append((value, f"{where}/{key}"))
        elif isinstance(current, list):
            for index, value in enumerate(current):
                if isinstance(value, (dict, list)):
                    stack.append((value, f"{where}/{index}"))


def check_self_contained(schema: Mapping[str, Any]) -> None:
    """Refuse a schema that could make a compiler look outside it.

    Refused anywhere in the document: a `$ref`, `$dynamicRef` or
    `$recursiveRef` that is not a fragment; an `$id` that is neither a
    fragment nor a well-known draft URI; a `$schema` that is not a well-known
    draft URI; and, when the document uses draft-03/04, an `id` naming a
    scheme or host.
    """
    nodes = list(_walk(dict(schema)))
    old_draft = any(
        isinstance(node.get("$schema"), str) and node["$schema"] in _OLD_DRAFTS for _, node in nodes
    )
    for where, node in nodes:
        at = where or "/"
        for keyword in _REF_KEYWORDS:
            value = node.get(keyword)
            if isinstance(value, str) and not value.startswith("#"):
                raise SchemaError(
                    f"the schema is not self-contained: {keyword} {sanitize(repr(value))} "
                    f"at {sanitize(at)} points outside the document"
                )
        identifier = node.get("$id")
        if (
            isinstance(identifier, str)
            and not identifier.startswith("#")
            and identifier not in WELL_KNOWN_DRAFTS
        ):
            raise SchemaError(
                f"the schema is not self-contained: $id {sanitize(repr(identifier))} "
                f"at {sanitize(at)} is neither a fragment nor a well-known draft"
            )
        dialect = node.get("$schema")
        if dialect is not None and (
            not isinstance(dialect, str) or dialect not in WELL_KNOWN_DRAFTS
        ):
            raise SchemaError(
                f"the schema is not self-contained: $schema {sanitize(repr(dialect))} "
                f"at {sanitize(at)} is not a well-known draft"
            )
        legacy_id = node.get("id")
        if old_draft and isinstance(legacy_id, str) and _SCHEME_OR_HOST.search(legacy_id):
            raise SchemaError(
                f"the schema is not self-contained: id {sanitize(repr(legacy_id))} "
                f"at {sanitize(at)} names a scheme or host"
            )


def _is_integer(checker: Any, instance: Any) -> bool:
    if isinstance(instance, bool):
        return False
    if isinstance(instance, int):
        return True
    if isinstance(instance, Decimal):
        return instance.is_finite() and instance == instance.to_integral_value()
    return isinstance(instance, float) and instance.is_integer()


# A server chooses the patterns and a model the strings they are matched
# against; Python's `re` backtracks without bound and holds the event loop.
# The `regex` module accepts the same syntax (lookaround included) and takes a
# timeout, so a catastrophic pattern costs at most this long per check.
_REGEX_SECONDS: Final = 0.25
_MAX_MESSAGE_CHARS: Final = 500
_DECIMAL_REPR: Final = re.compile(r"Decimal\('([^']*)'\)")


@functools.lru_cache(maxsize=1024)
def _regex(pattern: str) -> Any:
    import regex

    return regex.compile(pattern)


class _PatternTimeout(Exception):
    """A pattern check ran out of time; it ends the whole validation, not one value."""

    def __init__(self, pattern: str) -> None:
        super().__init__(pattern)
        self.pattern = pattern


# One budget for all the pattern checks of one validation: a model could
# otherwise send a thousand strings that each take the per-check timeout.
_REGEX_BUDGET_SECONDS: Final = 0.5
_regex_deadline: contextvars.ContextVar[float] = contextvars.ContextVar("_regex_deadline")


def _search(pattern: str, text: str) -> bool:
    deadline = _regex_deadline.get(None)
    limit = _REGEX_SECONDS
    if deadline is not None:
        limit = min(limit, deadline - time.monotonic())
        if limit <= 0:
            raise _PatternTimeout(pattern)
    try:
        return _regex(pattern).search(text, timeout=limit) is not None
    except TimeoutError:
        raise _PatternTimeout(pattern) from None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        from jsonschema.exceptions import ValidationError

        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: Mapping[str, Any], instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = []
    for key in instance:
        if key in properties or any(_search(pattern, key) for pattern in patterns):
            continue
        extras.append(key)
    if validator.is_type(additional, "object"):
        for key in extras:
            yield from validator.descend(instance[key], additional, path=key)
    elif additional is False and extras:
        from jsonschema.exceptions import ValidationError

        listed = ", ".join(repr(key) for key in sorted(extras))
        yield ValidationError(f"additional properties are not allowed ({listed} unexpected)")


def _exact(number: Any) -> Fraction:
    if isinstance(number, float):
        return Fraction(Decimal(repr(number)))
    return Fraction(number)


def _multiple_of(
    validator: Any, step: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    # Exact arithmetic: Decimal % float raises, and Decimal % Decimal rounds
    # past 28 digits, which would refuse a true multiple.
    if not validator.is_type(instance, "number"):
        return
    try:
        failed = (_exact(instance) / _exact(step)).denominator != 1
    except (ArithmeticError, ValueError, TypeError):
        failed = True
    if failed:
        from jsonschema.exceptions import ValidationError

        yield ValidationError(f"{instance!r} is not a multiple of {step}")


def _in_2020_12(schema: Mapping[str, Any]) -> bool:
    """Whether `schema` is in the 2020-12 dialect (named, or by default)."""
    dialect = schema.get("$schema")
    return dialect is None or (isinstance(dialect, str) and dialect.rstrip("#") == DIALECT)


def _dialect(schema: Mapping[str, Any]) -> str | None:
    """The draft `schema` names (its URI without the empty fragment), None for the default."""
    dialect = schema.get("$schema")
    return dialect.rstrip("#") if isinstance(dialect, str) else None


def _validator_class(schema: Mapping[str, Any]) -> type[Any]:
    return _validator_class_for(_dialect(schema))


@functools.lru_cache(maxsize=16)
def _validator_class_for(dialect: str | None) -> type[Any]:
    # One class per dialect: it is built from the draft, this module's keyword
    # functions and the integer check only, never from the schema itself, and
    # building one costs about a millisecond.
    import jsonschema
    import jsonschema.validators

    base_class: type[Any] = jsonschema.Draft202012Validator
    if dialect is not None:
        base_class = getattr(jsonschema, _DRAFT_VALIDATORS[dialect])
    # JSON Schema counts 1.0 as an integer; parse_json yields Decimal('1.0').
    type_checker = base_class.TYPE_CHECKER.redefine("integer", _is_integer)
    keywords = {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
        "multipleOf": _multiple_of,
    }
    return jsonschema.validators.extend(  # type: ignore[no-any-return]
        base_class, validators=keywords, type_checker=type_checker
    )


def _regex_module() -> Any:
    """The pattern engine (`regex`), imported at its first use."""
    import regex

    return regex


# A `$schema` keyword, and a pattern keyword, as a pinned manifest's JSON writes them (a
# description's quotes are escaped there, so text inside one does not match).
_NAMED_DIALECT: Final = re.compile(rb'"\$schema":\s*"([^"\\]*)"')
_NAMED_PATTERN: Final = re.compile(rb'"pattern(?:Properties)?":')


def prepare_for(manifest: bytes) -> list[str]:
    """Import now what compiling the schemas of `manifest` (a pinned manifest's bytes)
    will need: the validator classes of the drafts other than 2020-12 its schemas name
    (their check is jsonschema's), and the pattern engine if they have patterns.  A proxy
    does it while its servers start, not after they list their tools (issue 36).  Only
    ever earlier work: the drafts prepared, for the log of a test."""
    named = {found.decode("utf-8", "replace") for found in _NAMED_DIALECT.findall(manifest)}
    drafts = sorted({name.rstrip("#") for name in named} & set(_DRAFT_VALIDATORS) - {DIALECT})
    for draft in drafts:
        _validator_class_for(draft)
    if _NAMED_PATTERN.search(manifest):
        _regex_module()  # imported now: `_check_patterns` will compile the patterns
    return drafts


def _check_patterns(schema: Mapping[str, Any]) -> None:
    """Refuse, at compile time, a pattern no regular-expression engine here accepts."""
    for where, node in _walk(dict(schema)):
        candidates = []
        if isinstance(node.get("pattern"), str):
            candidates.append(node["pattern"])
        if isinstance(node.get("patternProperties"), dict):
            candidates.extend(node["patternProperties"])
        for pattern in candidates:
            try:
                _regex(pattern)
            except (_regex_module().error, TypeError, ValueError, OverflowError, RecursionError):
                raise SchemaError(
                    f"the schema does not compile: the pattern {sanitize(repr(pattern))} "
                    f"at {sanitize(where or '/')} is not a regular expression"
                ) from None


_TYPES: Final = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
# The keywords `_Plan` checks itself, and the annotations that never refuse a value.
_PLANNED: Final = frozenset(
    {"type", "properties", "required", "additionalProperties", "minimum", "maximum",
     "minLength", "maxLength", "description", "title", "$comment", "examples", "default"}
)  # fmt: skip
_MAX_PLAN_DEPTH: Final = 16


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, Decimal)) and not isinstance(value, bool)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True, slots=True)
class _Plan:
    """A schema in the small subset most tools use (types, properties, required, closed
    objects, bounds), checked without jsonschema's walk: it only ever *proves* a value
    valid; anything it cannot prove goes to jsonschema, which alone words refusals."""

    types: tuple[str, ...]
    properties: Mapping[str, _Plan]
    required: tuple[str, ...]
    closed: bool
    minimum: Any
    maximum: Any
    min_length: int | None
    max_length: int | None

    def proves(self, instance: Any) -> bool:
        kinds = _kinds(instance)
        if self.types and kinds.isdisjoint(self.types):
            return False
        if "object" in kinds:
            for name in self.required:
                if name not in instance:
                    return False
            for name, value in instance.items():
                inner = self.properties.get(name)
                if inner is None:
                    if self.closed:
                        return False
                elif not inner.proves(value):
                    return False
        elif "number" in kinds:
            if self.minimum is not None and instance < self.minimum:
                return False
            if self.maximum is not None and instance > self.maximum:
                return False
        elif "string" in kinds:
            if self.min_length is not None and len(instance) < self.min_length:
                return False
            if self.max_length is not None and len(instance) > self.max_length:
                return False
        return True


_OBJECT: Final = frozenset({"object"})
_STRING: Final = frozenset({"string"})
_ARRAY: Final = frozenset({"array"})
_BOOLEAN: Final = frozenset({"boolean"})
_NULL: Final = frozenset({"null"})
_NUMBER: Final = frozenset({"number"})
_INTEGER: Final = frozenset({"number", "integer"})
_NO_KIND: Final = frozenset[str]()


def _kinds(instance: Any) -> frozenset[str]:
    """The JSON Schema types `instance` is, by the 2020-12 type checker this module
    validates with (`integer` redefined by `_is_integer`)."""
    if isinstance(instance, dict):
        return _OBJECT
    if isinstance(instance, str):
        return _STRING
    if isinstance(instance, bool):
        return _BOOLEAN
    if instance is None:
        return _NULL
    if isinstance(instance, list):
        return _ARRAY
    if isinstance(instance, numbers.Number):
        return _INTEGER if _is_integer(None, instance) else _NUMBER
    return _NO_KIND


def _plan(schema: Any, depth: int = 0) -> _Plan | None:
    """`schema` as a `_Plan`, or None when it uses anything outside the subset."""
    if not isinstance(schema, Mapping) or depth > _MAX_PLAN_DEPTH:
        return None
    if any(key not in _PLANNED and not (depth == 0 and key == "$schema") for key in schema):
        return None
    kinds = schema.get("type", ())
    types = (kinds,) if isinstance(kinds, str) else kinds
    if (
        not isinstance(types, (list, tuple))
        or ("type" in schema and not types)
        or not all(name in _TYPES for name in types)
    ):
        return None
    properties = schema.get("properties", {})
    required = schema.get("required", ())
    closed = schema.get("additionalProperties", True)
    minimum, maximum = schema.get("minimum"), schema.get("maximum")
    min_length, max_length = schema.get("minLength"), schema.get("maxLength")
    if (
        not isinstance(properties, Mapping)
        or not isinstance(required, (list, tuple))
        or not all(isinstance(name, str) for name in required)
        or not isinstance(closed, bool)
        or any(bound is not None and not _is_number(bound) for bound in (minimum, maximum))
        or any(bound is not None and not _is_count(bound) for bound in (min_length, max_length))
    ):
        return None
    planned: dict[str, _Plan] = {}
    for name, inner in properties.items():
        inner_plan = _plan(inner, depth + 1)
        if not isinstance(name, str) or inner_plan is None:
            return None
        planned[name] = inner_plan
    return _Plan(
        types=tuple(types),
        properties=planned,
        required=tuple(required),
        closed=not closed,
        minimum=minimum,
        maximum=maximum,
        min_length=min_length,
        max_length=max_length,
    )


@dataclass(frozen=True, slots=True)
class CompiledSchema:
    """A compiled input schema; `first_error` validates one parsed instance."""

    schema: Mapping[str, Any]
    # The draft the schema names (None: 2020-12); its validator class is built with the
    # validator, so jsonschema is imported only by a schema or a value that needs it.
    _dialect: str | None
    # The jsonschema validator, built at the first check unless compiling needed it: a
    # server's thousand tools then cost their checks at load, not a thousand validators.
    _built: list[Any] = field(default_factory=list, compare=False, repr=False)
    # The schema's `_Plan` (2020-12 only), built at the first check: a value it proves
    # valid skips jsonschema's walk (about 20 us a call), any other goes through it.
    _planned: list[_Plan | None] = field(default_factory=list, compare=False, repr=False)

    def _validator(self) -> Any:
        if not self._built:
            validator_class = _validator_class_for(self._dialect)
            self._built.append(validator_class(self.schema, registry=_registry()))
        return self._built[0]

    def _plan(self) -> _Plan | None:
        if not self._planned:
            self._planned.append(_plan(self.schema) if _in_2020_12(self.schema) else None)
        return self._planned[0]

    def first_error(self, instance: Any) -> str | None:
        """Return one sentence describing the first violation, or None when valid."""
        plan = self._plan()
        if plan is not None:
            try:
                if plan.proves(instance):
                    return None
            except Exception:  # noqa: S110 - unproven: jsonschema decides below
                pass
        from jsonschema.exceptions import best_match

        token = _regex_deadline.set(time.monotonic() + _REGEX_BUDGET_SECONDS)
        try:
            error = best_match(self._validator().iter_errors(instance))
        except _PatternTimeout as timeout:
            return sanitize(
                f"the pattern {timeout.pattern!r} took too long to check; the value is refused"
            )
        except Exception as exc:  # a hostile schema must not crash the loop
            return f"the arguments could not be checked against the schema: {type(exc).__name__}"
        finally:
            _regex_deadline.reset(token)
        if error is None:
            return None
        where = "/".join(str(part) for part in error.absolute_path)
        location = f" at /{where}" if where else ""
        message = _DECIMAL_REPR.sub(r"\1", f"{error.message}{location}")
        if len(message) > _MAX_MESSAGE_CHARS:
            message = message[: _MAX_MESSAGE_CHARS - 1] + "…"
        # The message quotes keys and values the model chose.
        return sanitize(message)


def compile_schema(schema: Mapping[str, Any]) -> CompiledSchema:
    """Check a schema is self-contained and compile it, or raise `SchemaError` saying why."""
    if not isinstance(schema, Mapping):
        raise SchemaError("the input schema is not a JSON object")
    check_self_contained(schema)
    # The proof only ever skips the check; every refusal comes from jsonschema's own walk.
    if not (_in_2020_12(schema) and proves_valid(schema)):
        validator_class = _validator_class(schema)
        from jsonschema.exceptions import SchemaError as MetaschemaError

        try:
            validator_class.check_schema(schema)
        except MetaschemaError as exc:
            raise SchemaError(f"the schema does not compile: {sanitize(exc.message)}") from None
        except Exception as exc:
            raise SchemaError(f"the schema does not compile: {type(exc).__name__}") from None
    _check_patterns(schema)
    compiled = CompiledSchema(schema=schema, _dialect=_dialect(schema))
    references = [
        node["$ref"] for _, node in _walk(dict(schema)) if isinstance(node.get("$ref"), str)
    ]
    if not references:
        return compiled
    # jsonschema resolves references lazily; resolve each one now so a
    # dangling reference is refused at registration, not at the first call.
    resolver = compiled._validator()._resolver
    for reference in references:
        try:
            resolver.lookup(reference)
        except Exception:
            raise SchemaError(
                f"the schema does not compile: $ref {sanitize(repr(reference))} "
                "does not resolve inside the document"
            ) from None
    return compiled
