"""Conditions on a call's arguments: a rule's `"when"` list, compiled once, decided per call.

A condition is a CEL expression (cel-python) over `args` (the call's
canonical arguments), `tool` (the final name), `server` and `class` (the
operator's side-effect class).  The first that holds decides; none holding
leaves the decision to the rule or the class policy.  Everything here fails
towards a person: an expression that does not compile refuses the
configuration, one that cannot be evaluated (a missing field, a wrong type,
a path that cannot be resolved, the time budget spent) decides
`require_approval` and says why, never `allow`.  CEL's operators and
functions are `_cel`'s, which type arguments as CEL does, not as Python does.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
import time
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final

import anyio

from ..canonical import canonical_json, sha256_hex
from ..policy import ClassPolicy, Outcome
from ..sanitize import sanitize
from ..tools import SideEffect

if TYPE_CHECKING:
    from ..store import Principal
    from .config import UpstreamConfig

__all__ = [
    "EVALUATION_SECONDS",
    "MAX_ARGUMENT_BYTES",
    "MAX_CONDITIONS",
    "MAX_EXPRESSION_CHARS",
    "Condition",
    "ConditionError",
    "ConditionVerdict",
    "ToolConditions",
    "bytes_len",
    "compile_when",
    "conditions_by_tool",
    "path_within",
    "policy_id",
]

# Bounds on what one condition may cost.  CEL has no loops beyond its
# macros over finite lists, but nested macros over a large list still take
# as long as an attacker likes; so the expression and the arguments are
# capped, and the evaluation runs in a worker thread under a deadline that a
# watchdog enforces: it raises the stop in that thread, again every 10 ms until it ends.
# The stop lands between bytecodes; `_cel` keeps every C call a condition can make
# linear in the arguments (one RE2 search is capped), so none holds the thread long.
MAX_EXPRESSION_CHARS: Final = 2000
MAX_CONDITIONS: Final = 32
MAX_ARGUMENT_BYTES: Final = 1024 * 1024
EVALUATION_SECONDS: Final = 1.0
_REASON_CHARS: Final = 200
_CONDITION_FIELDS: Final = frozenset({"if", "outcome", "reason"})
_OUTCOMES: Final = {
    "allow": Outcome.ALLOW,
    "require_approval": Outcome.REQUIRE_APPROVAL,
    "deny": Outcome.DENY,
}
# CEL's int is 64-bit signed; a larger JSON integer is not silently wrapped.
_INT64: Final = 2**63


class ConditionError(ValueError):
    """A `"when"` entry cannot be used; the message names the entry and, for CEL, the column."""


class _Undecidable(Exception):
    """A condition that cannot be evaluated for this call; the message says why."""


class _OutOfTime(BaseException):
    """The evaluation's deadline passed.  A BaseException, so that no `except Exception`
    inside the evaluator can swallow it and carry on."""


# How often the stop is raised again once the deadline passed, should one be swallowed.
_RESTOP_SECONDS: Final = 0.01


def _check_pending() -> None:
    """A Python function: entering it raises an asynchronous exception still pending."""


@contextlib.contextmanager
def _deadline(deadline: float) -> Iterator[None]:
    """Raise `_OutOfTime` in this thread once `deadline` passed, and again every 10 ms
    until it ends the evaluation.

    A watchdog thread raises it in this one (`PyThreadState_SetAsyncExc`).  Raised once
    by a trace function, it could be swallowed (a `__hash__` called from C that ignores
    errors, say), and Python switches off a trace function that raises: the evaluation
    would then run on unbounded.  Nothing here is raised after this returns.
    """
    import ctypes  # only where a rule has a condition (the proxy's start-up does without)

    # Raises an exception in a thread at its next bytecode check.  (Never called with NULL
    # to withdraw one: on Python 3.11 that leaves the thread's pending-work flag set, and
    # its next function call spins on it.)
    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    target = ctypes.c_ulong(threading.get_ident())
    stop = threading.Event()

    def watch() -> None:
        if stop.wait(max(0.0, deadline - time.monotonic())):
            return
        while not stop.is_set():
            set_async_exc(target, ctypes.py_object(_OutOfTime))
            stop.wait(_RESTOP_SECONDS)

    watchdog = threading.Thread(target=watch, name="agentrt-condition-deadline", daemon=True)
    watchdog.start()
    out_of_time = False
    try:
        yield
    except _OutOfTime:
        out_of_time = True
    finally:
        while True:
            try:
                stop.set()
                watchdog.join()
                _check_pending()  # one raised just before the watchdog stopped
                break
            except _OutOfTime:
                out_of_time = True
    if out_of_time:
        raise _OutOfTime


def _celpy() -> Any:
    try:
        import celpy
    except ImportError:
        raise ConditionError(
            'conditions ("when") need the cel-python package: install agentrt[conditions]'
        ) from None
    return celpy


def _strict() -> Any:
    """CEL's operators and functions typed strictly (`_cel`), which imports cel-python."""
    _celpy()
    from . import _cel

    return _cel


@dataclass(frozen=True, slots=True)
class Condition:
    """One compiled `{"if", "outcome", "reason"}` entry."""

    expression: str
    outcome: Outcome
    reason: str
    program: Any = field(compare=False, repr=False)

    def to_json(self) -> dict[str, str]:
        return {"if": self.expression, "outcome": str(self.outcome), "reason": self.reason}


@dataclass(frozen=True, slots=True)
class ConditionVerdict:
    """What a tool's conditions decided: the outcome, why, and whether it was an error."""

    outcome: Outcome
    reason: str
    error: bool = False


@dataclass(frozen=True, slots=True)
class ToolConditions:
    """The conditions of one tool, with the names and class they are evaluated against."""

    server: str
    tool: str
    side_effect: SideEffect
    conditions: tuple[Condition, ...]

    async def decide(
        self,
        arguments: Any,
        *,
        session: Mapping[str, Any] | None = None,
        labels: Sequence[str] = (),
        principal: Mapping[str, Any] | None = None,
    ) -> ConditionVerdict | None:
        """The first condition that holds, an error verdict, or None when none holds.
        `session` (`{"id", "labels"}`) and `labels` (the tool's own) are what a condition
        sees of information flow (docs/flows.md); `principal` who asked (`principal_fields`)."""
        try:
            # The thread is stopped at the deadline; this backstop is for time spent
            # inside one C call (an RE2 search, capped), which the stop cannot cut.
            with anyio.fail_after(EVALUATION_SECONDS * 2):
                return await anyio.to_thread.run_sync(
                    functools.partial(
                        self.decide_now,
                        arguments,
                        session=session,
                        labels=labels,
                        principal=principal,
                    ),
                    abandon_on_cancel=True,
                )
        except TimeoutError:
            return self._undecidable(f"its conditions took longer than {EVALUATION_SECONDS:g}s")

    def decide_now(
        self,
        arguments: Any,
        *,
        session: Mapping[str, Any] | None = None,
        labels: Sequence[str] = (),
        principal: Mapping[str, Any] | None = None,
    ) -> ConditionVerdict | None:
        """`decide` in the calling thread, stopped once EVALUATION_SECONDS are spent."""
        deadline = time.monotonic() + EVALUATION_SECONDS
        try:
            with _deadline(deadline):
                return self._first_holding(arguments, session, labels, principal)
        except _OutOfTime:
            return self._undecidable(f"its conditions took longer than {EVALUATION_SECONDS:g}s")

    def _first_holding(
        self,
        arguments: Any,
        session: Mapping[str, Any] | None,
        labels: Sequence[str],
        principal: Mapping[str, Any] | None = None,
    ) -> ConditionVerdict | None:
        try:
            activation = self._activation(arguments, session, labels, principal)
        except _Undecidable as exc:
            return self._undecidable(str(exc))
        for position, condition in enumerate(self.conditions):
            try:
                held = _holds(condition, activation)
            except _Undecidable as exc:
                return self._undecidable(f"when[{position}] could not be evaluated: {exc}")
            if held:
                reason = condition.reason or f"when[{position}] of {self.tool} holds"
                return ConditionVerdict(condition.outcome, reason)
        return None

    def _activation(
        self,
        arguments: Any,
        session: Mapping[str, Any] | None,
        labels: Sequence[str],
        principal: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        if len(canonical_json(arguments).encode("utf-8", "surrogatepass")) > MAX_ARGUMENT_BYTES:
            raise _Undecidable(
                f"the arguments are larger than {MAX_ARGUMENT_BYTES} bytes, "
                "more than conditions look at"
            )
        celtypes = _celpy().celtypes
        return {
            "args": _to_cel(arguments),
            "tool": celtypes.StringType(self.tool),
            "server": celtypes.StringType(self.server),
            "class": celtypes.StringType(str(self.side_effect)),
            # The host session's taint and this tool's labels (empty without labels).
            "session": _to_cel(dict(session or {"id": "", "labels": []})),
            "labels": _to_cel(list(labels)),
            # Who asked (over HTTP with "principals"); every field empty without one.
            "principal": _to_cel(dict(principal or principal_fields(None))),
        }

    def _undecidable(self, why: str) -> ConditionVerdict:
        return ConditionVerdict(
            Outcome.REQUIRE_APPROVAL,
            f"a person decides: a condition of {sanitize(self.tool)} cannot decide: {why}",
            error=True,
        )


def principal_fields(principal: Principal | None) -> dict[str, Any]:
    """What a condition may read of who asked, as `principal` (docs/identity.md): the
    token's subject, issuer, client id, scopes and groups; `present` is false, and every
    other field empty, for a call with no principal (stdio, or only the shared --token)."""
    if principal is None:
        return {"present": False, "subject": "", "issuer": "", "client_id": "",
                "scopes": [], "groups": []}  # fmt: skip
    return {
        "present": True,
        "subject": principal.subject,
        "issuer": principal.issuer,
        "client_id": principal.client_id or "",
        "scopes": list(principal.scopes),
        "groups": list(principal.groups),
    }


def _holds(condition: Condition, activation: dict[str, Any]) -> bool:
    celpy = _celpy()
    try:
        value = condition.program.evaluate(activation)
    except celpy.CELEvalError as exc:
        # Where an operator refused its arguments, its own sentence says which and why.
        refused = exc.__cause__
        raise _Undecidable(
            _short(refused if isinstance(refused, _strict().ArgumentError) else exc)
        ) from None
    except (ValueError, TypeError, LookupError, ArithmeticError, RecursionError) as exc:
        raise _Undecidable(_short(exc)) from None
    if isinstance(value, celpy.CELEvalError):
        raise _Undecidable(_short(value))
    if not isinstance(value, celpy.celtypes.BoolType):
        raise _Undecidable(f"it gave {type(value).__name__}, not true or false")
    return bool(value)


def _short(exc: BaseException) -> str:
    """The first line of an error, bounded: cel-python's messages quote its whole activation."""
    text = str(exc.args[0]) if exc.args else type(exc).__name__
    for marker in (" (in activation", "\n"):
        text = text.split(marker, 1)[0]
    if len(text) > _REASON_CHARS:
        text = text[:_REASON_CHARS] + "…"
    return sanitize(text)


def _to_cel(value: Any) -> Any:
    """A parsed JSON value as CEL values: an integer literal is `int`, a fraction `double`."""
    return _cel_value(value, _celpy().celtypes)


def _cel_value(value: Any, celtypes: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        if not -_INT64 <= value < _INT64:
            raise _Undecidable(f"the integer {value} is outside CEL's 64-bit int")
        # Checked above: cel-python's own constructor checks again, 20 times slower.
        return int.__new__(celtypes.IntType, value)
    if isinstance(value, (Decimal, float)):
        number = float(value)
        if not math.isfinite(number):
            raise _Undecidable("a number in the arguments is not finite as a double")
        return celtypes.DoubleType(number)
    if isinstance(value, str):
        return celtypes.StringType(value)
    if isinstance(value, list):
        return celtypes.ListType([_cel_value(item, celtypes) for item in value])
    if isinstance(value, dict):
        return celtypes.MapType(
            {celtypes.StringType(key): _cel_value(item, celtypes) for key, item in value.items()}
        )
    raise _Undecidable(f"a {type(value).__name__} in the arguments is not JSON")


# -- helpers a condition may call -------------------------------------------


def _resolve(path: str) -> str:
    """The real path a server opening `path` would reach, or `_Undecidable`.

    A server may resolve `..` by text before following links (the stock
    filesystem server does) or after (the kernel does); where the two reach
    different places, which one the server takes cannot be known here.
    """
    resolved = _resolve_strictly(path)
    if ".." in path.split(os.sep) and _resolve_strictly(os.path.normpath(path)) != resolved:
        raise _Undecidable(
            f"{sanitize(repr(path))} climbs with '..' out of a symbolic link, which servers "
            "resolve to different places"
        )
    return resolved


def _resolve_strictly(path: str) -> str:
    """The real path the kernel reaches opening `path`, or `_Undecidable`.

    The longest existing prefix is resolved through its symbolic links
    strictly (a loop or a dangling link cannot be resolved safely: the server
    would follow it somewhere this check cannot see); what does not exist yet
    is appended, and may not climb with `..`.
    """
    if not path or "\x00" in path:
        raise _Undecidable("the path is empty or holds a NUL")
    if not os.path.isabs(path):
        raise _Undecidable(
            f"{sanitize(repr(path))} is relative, and what it names depends on the server's "
            "working directory"
        )
    existing, missing = path, list[str]()
    while not os.path.lexists(existing):
        existing, tail = os.path.split(existing)
        if tail:
            missing.insert(0, tail)
        if existing == os.path.dirname(existing):
            break
    if ".." in missing:
        raise _Undecidable(f"{sanitize(repr(path))} climbs with '..' through a missing directory")
    try:
        real = os.path.realpath(existing, strict=True)
    except OSError as exc:
        raise _Undecidable(f"{sanitize(repr(path))} cannot be resolved: {exc.strerror}") from None
    if missing:
        _refuse_unicode_twin(real, missing[0], path)
    return os.path.join(real, *missing) if missing else real


def _refuse_unicode_twin(directory: str, name: str, path: str) -> None:
    """Refuse a missing `name` that an entry of `directory` equals in Unicode NFC form.

    A server may open that entry for it (the stock filesystem server does,
    for a path that does not exist), and the entry may be a link elsewhere.
    """
    try:
        entries = os.listdir(directory)
    except OSError:
        return  # not a directory: nothing can be opened under it
    wanted = unicodedata.normalize("NFC", name)
    if any(entry != name and unicodedata.normalize("NFC", entry) == wanted for entry in entries):
        raise _Undecidable(
            f"{sanitize(repr(path))} names a missing entry that an existing one equals in "
            "another Unicode form, which a server may open instead"
        )


def path_within(path: Any, root: Any) -> Any:
    """CEL `path_within(path, root)`: `path`, resolved as the server will open it, is `root`
    or lies under it (both through their symbolic links, at the time of the call)."""
    celtypes = _celpy().celtypes
    if not isinstance(path, str) or not isinstance(root, str):
        raise _Undecidable("path_within takes two strings")
    real_path = _resolve(str(path))
    real_root = _resolve(str(root))
    inside = real_path == real_root or real_path.startswith(real_root.rstrip(os.sep) + os.sep)
    return celtypes.BoolType(inside)


def bytes_len(text: Any) -> Any:
    """CEL `bytes_len(s)`: the size of a string in UTF-8 bytes (`size(s)` counts code points)."""
    celtypes = _celpy().celtypes
    if isinstance(text, bytes):
        return celtypes.IntType(len(text))
    if not isinstance(text, str):
        raise _Undecidable("bytes_len takes a string")
    return celtypes.IntType(len(str(text).encode("utf-8", "surrogatepass")))


_FUNCTIONS: Final = {"path_within": path_within, "bytes_len": bytes_len}


# -- compiling ---------------------------------------------------------------


def compile_when(raw: Any, where: str) -> tuple[Condition, ...]:
    """Check and compile a rule's `"when"` list; `ConditionError` names the entry and column."""
    if not isinstance(raw, list):
        raise ConditionError(f'{where}: "when" must be a list of conditions')
    if len(raw) > MAX_CONDITIONS:
        raise ConditionError(f'{where}: "when" has more than {MAX_CONDITIONS} conditions')
    return tuple(
        _compile_one(entry, f'{where}: "when"[{index}]') for index, entry in enumerate(raw)
    )


def _compile_one(entry: Any, where: str) -> Condition:
    if not isinstance(entry, dict):
        raise ConditionError(f"{where} must be an object with if, outcome and reason")
    for name in entry:
        if name not in _CONDITION_FIELDS:
            raise ConditionError(f'{where} has the unknown field "{sanitize(name)}"')
    expression = entry.get("if")
    if not isinstance(expression, str) or not expression.strip():
        raise ConditionError(f'{where}: "if" must be a non-empty CEL expression')
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ConditionError(f'{where}: "if" is longer than {MAX_EXPRESSION_CHARS} characters')
    outcome = entry.get("outcome")
    if outcome not in _OUTCOMES:
        raise ConditionError(f'{where}: "outcome" must be allow, require_approval or deny')
    reason = entry.get("reason", "")
    if not isinstance(reason, str):
        raise ConditionError(f'{where}: "reason" must be a string')
    celpy = _celpy()
    strict = _strict()
    environment = celpy.Environment(runner_class=strict.StrictRunner)
    try:
        tree = environment.compile(expression)
    except celpy.CELParseError as exc:
        line = getattr(exc, "line", None)
        column = getattr(exc, "column", None)
        at = f"line {line} column {column}" if line not in (None, 1) else f"column {column}"
        raise ConditionError(
            f'{where}: "if" does not compile at {at}: {sanitize(expression)}'
        ) from None
    except (RecursionError, ValueError) as exc:
        raise ConditionError(f'{where}: "if" does not compile: {_short(exc)}') from None
    for node in tree.iter_subtrees():
        if node.data == "member_dot_arg" and str(node.children[1]) in strict.NOT_CEL_MACROS:
            raise ConditionError(
                f'{where}: "if" uses {node.children[1]}(), which cel-python adds to CEL '
                "and conditions do not take"
            )
    program = environment.program(tree, functions={**strict.FUNCTIONS, **_FUNCTIONS})
    return Condition(expression, _OUTCOMES[outcome], reason, program)


# -- the proxy's table of conditions, and its identity ------------------------


def conditions_by_tool(servers: Sequence[UpstreamConfig]) -> dict[str, ToolConditions]:
    """Each tool's conditions keyed by its final name (the name the host calls it by)."""
    table: dict[str, ToolConditions] = {}
    for upstream in servers:
        for tool, conditions in upstream.conditions.items():
            rule = upstream.rules[tool]
            # The final name as `load` gives it: the rename, else `<server>_<tool>`.
            name = rule.rename if rule.rename is not None else f"{upstream.server.name}_{tool}"
            table[name] = ToolConditions(upstream.server.name, name, rule.side_effect, conditions)
    return table


def policy_id(policy: ClassPolicy, servers: Sequence[UpstreamConfig]) -> str:
    """SHA-256 of the canonical JSON of the class policy, every rule and its conditions."""
    rules: dict[str, Any] = {}
    for upstream in servers:
        server_rules: dict[str, Any] = {}
        for tool, rule in upstream.rules.items():
            server_rules[tool] = {
                "side_effect": str(rule.side_effect),
                "timeout": rule.timeout,
                "terminal": rule.terminal,
                "description": rule.description,
                "deny": list(rule.deny),
                "fixed": dict(rule.fixed),
                "rename": rule.rename,
                "allow_hint_mismatch": rule.allow_hint_mismatch,
                "when": [condition.to_json() for condition in upstream.conditions.get(tool, ())],
            }
            extra = upstream.tool_rules.get(tool)
            if extra is not None and extra.outcome is not None:
                # Only when set, so a policy without per-tool outcomes keeps its identity.
                server_rules[tool]["outcome"] = str(extra.outcome)
        rules[upstream.server.name] = server_rules
    outcomes: Mapping[SideEffect, Outcome] = policy.outcomes
    document = {
        "policy": {str(side_effect): str(outcome) for side_effect, outcome in outcomes.items()},
        "rules": rules,
    }
    return sha256_hex(canonical_json(document).encode("utf-8"))
