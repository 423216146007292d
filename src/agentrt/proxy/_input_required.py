"""One host call across its rounds, and a server's request as an input-required result.

A host on the 2026-07-28 revision is stateless: the proxy has no channel to
send it a server's request.  So when a forwarded request arrives during such
a host's call, the proxy answers the host's `tools/call` with an
input-required result carrying that request and a request state it issued
(`secrets.token_urlsafe`, unguessable), keeps the upstream call suspended,
and when the host retries the call with that state and its answer, hands the
answer to the server and goes on waiting for the same call: the call runs
once upstream and its run is the same run.  A state is single use, bound to
the call's tool and arguments, and dies with the call or at its deadline (the
call's timeout); a retry with any other state gets one sentence and touches
no call.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import anyio

from ..canonical import canonical_json
from ._answers import Answer

__all__ = ["HostCall", "Question", "Suspended", "is_stateless"]

MODERN_PROTOCOL_VERSIONS: Final = ("2026-07-28",)
"""The protocol versions of the era without a handshake: the MCP SDK's
`mcp_types.version.MODERN_PROTOCOL_VERSIONS` (a test holds them equal), written here so
that `_proxy`, which imports this module, does not import `mcp_types`' models with it
(issue 36, decision 0057)."""

# What a retry is told when its state names no call waiting for it.
_UNKNOWN_STATE: Final = (
    "This requestState is unknown or has expired: no call of this proxy waits for its "
    "answer, and nothing was run."
)


def is_stateless(protocol_version: str | None) -> bool:
    """Whether a host on `protocol_version` can only be asked through an input-required result."""
    return protocol_version in MODERN_PROTOCOL_VERSIONS


def _arguments_key(arguments: dict[str, Any] | None) -> str | None:
    """The arguments as canonical JSON, or None for ones that have none (an infinity the
    gate refuses as invalid): such a call never has a state to match."""
    try:
        return canonical_json(arguments or {})
    except (TypeError, ValueError):
        return None


@dataclass
class Question:
    """A server's request posted for the host, and the host's answer once it retries."""

    key: str
    method: str
    params: Any
    answered: anyio.Event = field(default_factory=anyio.Event)
    answer: dict[str, Any] | None = None

    def wire(self) -> dict[str, Any]:
        """The request as an entry of `inputRequests`."""
        request: dict[str, Any] = {"method": self.method}
        if self.params is not None:
            request["params"] = self.params
        return request


class HostCall:
    """One host-facing call: the host request currently waiting on it (`ctx`), the call's
    answer once the gate gives it, and the question the host must answer before that."""

    def __init__(self, ctx: Any, tool: str, arguments: dict[str, Any] | None) -> None:
        self.ctx = ctx
        self.tool = tool
        self._arguments = arguments
        self._key: str | None = None
        # True while a host request waits on this call (not while it is suspended).
        self.waiting = False
        self._answer: Answer | None = None
        self._posted: Question | None = None
        self._outstanding: Question | None = None
        # Made afresh by each wait (`_wait`): None until the first.
        self._changed: anyio.Event | None = None
        self._asked = 0

    @property
    def arguments(self) -> str | None:
        """The call's arguments as canonical JSON, the key a retry's must match: made
        only for a call that is suspended (most never are)."""
        if self._key is None:
            self._key = _arguments_key(self._arguments)
        return self._key

    @property
    def finished(self) -> bool:
        return self._answer is not None

    @property
    def asking(self) -> bool:
        """Whether a question of this call is already posted or out with the host."""
        return self._posted is not None or self._outstanding is not None

    def finish(self, answer: Answer) -> None:
        """The gate's answer; a question still out is released unanswered."""
        self._answer = answer
        for question in (self._posted, self._outstanding):
            if question is not None:
                question.answered.set()
        self._wake()

    async def answer(self) -> Answer:
        """Wait for the call's answer alone (a call whose server cannot ask)."""
        while self._answer is None:
            await self._wait()
        return self._answer

    async def next_round(self) -> Answer | Question:
        """Wait for the call's answer, or for a server's question the host must answer first
        (handed out once: the call is then suspended until the host's retry)."""
        while True:
            if self._answer is not None:
                return self._answer
            if self._posted is not None:
                question, self._posted = self._posted, None
                self._outstanding = question
                return question
            await self._wait()

    async def ask(self, method: str, params: Any, timeout: float) -> dict[str, Any] | None:  # noqa: ASYNC109
        """Post a server's request for the host and wait, at most `timeout` seconds, for the
        answer its retry carries; None when the call ended or the host never answered."""
        self._asked += 1
        question = Question(f"{method.split('/')[0]}-{self._asked}", method, params)
        self._posted = question
        self._wake()
        with anyio.move_on_after(timeout):
            await question.answered.wait()
        if self._posted is question:
            self._posted = None
        if self._outstanding is question:
            self._outstanding = None
        return question.answer

    def deliver(self, question: Question, answer: dict[str, Any]) -> bool:
        """The host's answer to the question it was handed; False when that question is no
        longer the one the call waits for."""
        if self._outstanding is not question or self.finished:
            return False
        self._outstanding = None
        question.answer = answer
        question.answered.set()
        return True

    async def _wait(self) -> None:
        self._changed = anyio.Event()
        await self._changed.wait()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()


@dataclass(frozen=True, slots=True)
class _Issued:
    call: HostCall
    question: Question
    deadline: float


@dataclass
class Suspended:
    """The request states the proxy issued to stateless hosts, each naming one suspended
    call and the question it was issued with."""

    issued: dict[str, _Issued] = field(default_factory=dict)

    def issue(self, call: HostCall, question: Question, timeout: float) -> str:
        """A fresh state for `question` of `call`, valid for `timeout` seconds."""
        self._forget_stale()
        state = secrets.token_urlsafe(32)
        self.issued[state] = _Issued(call, question, anyio.current_time() + timeout)
        return state

    def resume(
        self,
        state: Any,
        tool: str,
        arguments: dict[str, Any] | None,
        responses: Any,
        same_caller: Callable[[HostCall], bool] | None = None,
    ) -> HostCall | str:
        """Deliver the answer a retry carries to the call its `state` names, and return that
        call; else the one sentence the host is told (nothing delivered, no state spent).
        `same_caller(call)` says whether the retry is by whoever made the call (over HTTP
        with "principals": the same person); a state presented by anyone else is unknown."""
        self._forget_stale()
        issued = self.issued.get(state) if isinstance(state, str) else None
        if issued is None or (same_caller is not None and not same_caller(issued.call)):
            return _UNKNOWN_STATE
        call, question = issued.call, issued.question
        key = _arguments_key(arguments)
        if call.tool != tool or key is None or call.arguments != key:
            # A state is bound to its call; offered with another, it is left for its own.
            return (
                "This requestState was issued for another call; retry the call it was issued "
                "for with the same tool and arguments."
            )
        answer = responses.get(question.key) if isinstance(responses, dict) else None
        if not isinstance(answer, dict):
            return (
                f"The retry carries no answer to the input request {question.key!r}; "
                "answer it in inputResponses and retry with the same requestState."
            )
        del self.issued[state]
        if not call.deliver(question, answer):
            return _UNKNOWN_STATE
        return call

    def _forget_stale(self) -> None:
        now = anyio.current_time()
        for state, issued in list(self.issued.items()):
            if issued.call.finished or issued.deadline <= now:
                del self.issued[state]
