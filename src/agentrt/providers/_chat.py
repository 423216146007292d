"""What the chat-style adapters share: the prompt, the tools as function
schemas, the history as messages, and an answer turned into a `Decision`.

The adapter never repairs or judges a tool call's arguments: it hands the
gate the exact text the model produced, and the gate (the one place requests
are checked) records a malformed one verbatim as an invalid decision and
tells the model what was wrong.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import anyio

from ..accounting import AttemptOutcome, AttemptReport, ModelMeter, SpendingLimitReached, Usage
from ..agent import Decision, Observation, StepInput
from ..canonical import JSONBoundaryError, canonical_bytes, canonical_json, parse_json
from ..sanitize import sanitize
from ..store import utc_now
from ..tools import ToolSpec
from ._http import (
    DEFAULT_TIMEOUT,
    MAX_RESPONSE_BYTES,
    AttemptError,
    Endpoint,
    HTTPClientFactory,
    ProviderError,
    bearer_key,
    post_json,
)

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "NO_RETRY",
    "SYSTEM_PROMPT",
    "ChatAgent",
    "ModelReply",
    "RetryPolicy",
    "arguments_object",
    "cut_off_note",
    "decision_from_message",
    "function_tools",
    "note_messages",
    "observation_text",
    "opening_messages",
    "read_usage",
]

DEFAULT_MAX_TOKENS: Final = 4096
"""The output budget of one reply when the consumer names none."""

SYSTEM_PROMPT: Final = (
    "You are an agent that reaches a goal by calling the tools you are given, one call at a"
    " time. Every call is checked and may be denied or held for a person's approval; you are"
    " told the outcome of each. When the goal is reached, or cannot be, answer with a short"
    " plain-text summary and no tool call."
)

_OBSERVATION_PREFIX: Final = {
    "result": "",
    "tool_error": "The tool failed: ",
    "invalid": "The call was not run because it was invalid: ",
    "denied": "The call was denied by the operator's policy: ",
    "interrupted": "The call was interrupted and may or may not have taken effect: ",
}


def function_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The tools as the `tools` array both chat APIs take."""
    return [
        {
            "type": "function",
            "function": {
                "name": spec.name,
                "description": spec.description,
                "parameters": spec.input_schema,
            },
        }
        for spec in tools
    ]


def opening_messages(step_input: StepInput) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": step_input.goal},
    ]


def note_messages(notes: Sequence[str]) -> list[dict[str, Any]]:
    """What the runtime tells the model after the history (a cut-off reply, say)."""
    return [{"role": "user", "content": note} for note in notes]


def observation_text(observation: Observation) -> str:
    """What the model is told about one step, in words it can act on."""
    prefix = _OBSERVATION_PREFIX.get(observation.kind, f"Outcome {observation.kind}: ")
    return prefix + observation.content


def arguments_object(args: str) -> dict[str, Any] | None:
    """The parsed object of a recorded call's arguments, or None when they were not one."""
    try:
        value = parse_json(args)
    except JSONBoundaryError:
        return None
    return value if isinstance(value, dict) else None


def decision_from_message(message: Any, where: str) -> Decision:
    """Turn an assistant message (`content`, `tool_calls`) into the next `Decision`.

    The first tool call wins (the gate takes one request a step; the model
    sees that call's outcome and may ask again).  Its arguments pass as the
    exact text the model sent; an object (Ollama's form) is written as
    canonical JSON, which keeps every number literal.
    """
    if not isinstance(message, Mapping):
        raise ProviderError(f"{where} answered without a message object")
    tool_calls = message.get("tool_calls")
    if tool_calls is not None and not isinstance(tool_calls, list):
        raise ProviderError(f"{where} answered with tool_calls that are not a list")
    if tool_calls:
        call = tool_calls[0]
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ProviderError(f"{where} answered with a tool call that has no function name")
        name: str = function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            args_text = arguments
        elif arguments is None:
            args_text = ""
        else:
            # Already parsed by our JSON boundary: write it back without changing a literal.
            args_text = canonical_json(arguments)
        return Decision.tool_call(name, args_text)
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise ProviderError(f"{where} answered with content that is not text")
    if content and content.strip():
        return Decision.complete(content)
    return Decision.fail(f"{sanitize(where)} answered with neither text nor a tool call")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a failed attempt is tried again: exponential backoff with jitter, bounded.

    Attempt n waits a random time between half and all of
    `initial_delay * 2**(n-1)` (capped at `max_delay`), or longer when the
    server's `Retry-After` asks; a `Retry-After` over `max_retry_after` is not
    waited for.  `max_attempts` counts every attempt, the first included.
    """

    max_attempts: int = 4
    initial_delay: float = 1.0
    max_delay: float = 30.0
    max_retry_after: float = 60.0

    def delay(self, failures: int, retry_after: float | None) -> float:
        backoff = min(self.max_delay, self.initial_delay * 2 ** (failures - 1))
        jittered = random.uniform(backoff / 2, backoff)
        return max(jittered, retry_after or 0.0)


NO_RETRY: Final = RetryPolicy(max_attempts=1)


@dataclass(frozen=True, slots=True)
class ModelReply:
    """One answer, read: the decision, the usage (None when not trusted), the stop reason,
    and whether the reply was cut off at its token limit."""

    decision: Decision
    usage: Usage | None
    stop_reason: str | None
    cut_off: bool
    note: str = ""
    carry: str | None = None
    """What the adapter keeps of this answer for the run's next request (JSON text)."""


def read_usage(
    fields: Any, names: Mapping[str, str], *, promised: Sequence[str], where: str
) -> tuple[Usage | None, str]:
    """`Usage` from an answer's counters (`names`: our field → the API's), or None and why.

    A counter that is negative or not an integer, or one in `promised` that
    is missing, makes the whole usage untrusted: it is flagged, and the
    attempt is charged its full budget instead.
    """
    if not isinstance(fields, Mapping):
        if promised:
            return None, f"usage not trusted: {sanitize(where)} reported no usage object"
        fields = {}
    counts: dict[str, int] = {}
    for ours, theirs in names.items():
        value = fields.get(theirs)
        if value is None:
            if theirs in promised:
                return None, f"usage not trusted: {sanitize(where)} reported no {theirs}"
            value = 0
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            shown = sanitize(canonical_json(value))[:40] if _is_json(value) else "?"
            return None, f"usage not trusted: {sanitize(where)} reported {theirs} = {shown}"
        counts[ours] = value
    return Usage(**counts), ""


def _is_json(value: Any) -> bool:
    try:
        canonical_json(value)
    except (TypeError, JSONBoundaryError):
        return False
    return True


def cut_off_note(max_tokens: int) -> str:
    """What the model is told when its reply was cut off at its token limit."""
    return (
        f"Your previous reply was cut off at the token limit ({max_tokens} tokens) before it"
        " was complete, so nothing in it was run. Reply again within the limit: one tool call"
        " with shorter arguments, or a short answer."
    )


_MAX_CUT_OFF_REPLIES: Final = 2


class ChatAgent:
    """What the model adapters share: a checked endpoint, one POST an attempt, retries, books.

    A subclass names its `provider` (shown), `provider_key` (prices, rows)
    and `path`, builds `request_body`, and reads a parsed answer into a
    `ModelReply` (`read_reply`).
    """

    provider: ClassVar[str] = ""
    provider_key: ClassVar[str] = ""
    path: str = ""
    carries_context: bool = False
    """Whether `request_body` needs `StepInput.carried` (the Driver reads it only then)."""

    def __init__(
        self,
        model: str,
        endpoint: Endpoint,
        *,
        http_client_factory: HTTPClientFactory | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        retry: RetryPolicy | None = None,
        record_replies: bool = False,
    ) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ProviderError(f"max_tokens must be a positive integer, not {max_tokens!r}")
        self.model = model
        self.endpoint = endpoint
        self.max_tokens = max_tokens
        self.retry = retry if retry is not None else RetryPolicy()
        self._client_factory = http_client_factory
        self._timeout = timeout
        self._max_response_bytes = max_response_bytes
        self.record_replies = record_replies
        """Keep each answer's body, byte for byte, with its attempt (for `replay_client`)."""

    def __repr__(self) -> str:
        # Never the key.
        return f"{type(self).__name__}(model={self.model!r}, base_url={self.endpoint.base_url!r})"

    @property
    def description(self) -> str:
        """One line naming the model and where it is served, for the operator."""
        return f"{self.provider} model {sanitize(self.model)} at {sanitize(self.endpoint.base_url)}"

    def request_body(self, step_input: StepInput, notes: Sequence[str] = ()) -> dict[str, Any]:
        """The request for this step, `notes` told last (public so tests can read it)."""
        raise NotImplementedError

    def read_reply(self, answer: Any, where: str) -> ModelReply:
        """The parsed answer as a `ModelReply`; `ProviderError` when it holds no usable message."""
        raise NotImplementedError

    def key_headers(self, key: str) -> Mapping[str, str]:
        return bearer_key(key)

    def extra_headers(self) -> Mapping[str, str]:
        return {}

    async def decide(self, step_input: StepInput) -> Decision:
        """Ask the model; a tool call becomes `Decision.tool_call`, text `Decision.complete`.

        Raises `ProviderError` when the endpoint cannot be used (after the
        retries it allows): no decision is recorded in the model's name, and
        the run stays as it was, to be resumed once the endpoint is back.
        """
        return await self.decide_metered(step_input, ModelMeter())

    async def decide_metered(self, step_input: StepInput, meter: ModelMeter) -> Decision:
        """`decide`, with every attempt checked by `meter` first and recorded by it after.

        Transient failures and ambiguous ones (a model call acts on nothing but
        the bill, and the bill is charged in full) are retried under
        `self.retry` and the meter's deadline; permanent ones are not.  A reply
        cut off at its token limit is never acted on: the model is told and
        asked again, at most twice.
        """
        where = f"the {self.provider} model {sanitize(self.model)}"
        notes: list[str] = []
        failures = 0
        cut_offs = 0
        while True:
            await meter.check(self.provider_key, self.model)
            body = self.request_body(step_input, notes)
            started_at = utc_now()
            try:
                answer = await post_json(
                    self.endpoint,
                    self.path,
                    body,
                    what=f"the {self.provider} endpoint",
                    client_factory=self._client_factory,
                    deadline=self._attempt_deadline(meter),
                    max_bytes=self._max_response_bytes,
                    key_headers=self.key_headers,
                    headers=self.extra_headers(),
                )
                reply = self.read_reply(answer.value, where)
            except anyio.get_cancelled_exc_class():
                # Stopped mid-attempt (Ctrl-C, a deadline above us): the request may
                # have gone out, so the books say so before the cancellation goes on.
                stopped = AttemptError(
                    f"the request to {where} was cancelled before an answer came",
                    AttemptOutcome.AMBIGUOUS,
                    charge_in_full=True,
                )
                with anyio.CancelScope(shield=True):
                    await meter.record(self._report(started_at, body, failure=stopped))
                raise
            except AttemptError as failure:
                failures += 1
                await meter.record(self._report(started_at, body, failure=failure))
                await self._wait_to_retry(failure, failures, meter)
                continue
            except ProviderError as refused:
                # Answered 2xx, but with nothing usable: the model ran, so it is charged.
                unusable = AttemptError(
                    str(refused), AttemptOutcome.PERMANENT_ERROR, charge_in_full=True
                )
                await meter.record(self._report(started_at, body, failure=unusable))
                raise unusable from None
            raw = answer.raw if self.record_replies else None
            await meter.record(self._report(started_at, body, reply=reply, raw=raw))
            if not reply.cut_off:
                return reply.decision
            cut_offs += 1
            if cut_offs >= _MAX_CUT_OFF_REPLIES:
                return Decision.fail(
                    f"model_cut_off: {where} was cut off at its token limit ({self.max_tokens})"
                    f" {cut_offs} times in a row; raise max_tokens"
                )
            notes = [cut_off_note(self.max_tokens)]

    def _attempt_deadline(self, meter: ModelMeter) -> float:
        if meter.deadline is None:
            return self._timeout
        return max(0.001, min(self._timeout, meter.deadline - time.time()))

    async def _wait_to_retry(self, failure: AttemptError, failures: int, meter: ModelMeter) -> None:
        """Sleep before the next attempt, or raise when there must be none."""
        if failure.outcome not in (AttemptOutcome.TRANSIENT_ERROR, AttemptOutcome.AMBIGUOUS):
            raise failure
        tried = f"{failures} attempt" + ("s" if failures != 1 else "")
        if failures >= self.retry.max_attempts:
            if failures == 1:
                raise failure
            raise ProviderError(f"{failure} ({tried}, no more allowed)")
        if failure.retry_after is not None and failure.retry_after > self.retry.max_retry_after:
            raise ProviderError(
                f"{failure} (it asks to wait {failure.retry_after:g} s, longer than the"
                f" {self.retry.max_retry_after:g} s a retry waits; {tried})"
            )
        delay = self.retry.delay(failures, failure.retry_after)
        if meter.deadline is not None and time.time() + delay >= meter.deadline:
            # The next attempt could only start after the run's time is up.
            raise SpendingLimitReached(
                meter.deadline_reason,
                f"{failure} (no retry: the run's time runs out first; {tried})",
            )
        await anyio.sleep(delay)

    def _report(
        self,
        started_at: str,
        body: Mapping[str, Any],
        *,
        reply: ModelReply | None = None,
        failure: AttemptError | None = None,
        raw: bytes | None = None,
    ) -> AttemptReport:
        budget_input = len(canonical_bytes(body))
        if failure is not None:
            return AttemptReport(
                provider=self.provider_key,
                model=self.model,
                started_at=started_at,
                finished_at=utc_now(),
                outcome=failure.outcome,
                stop_reason=None,
                usage=None,
                charge_in_full=failure.charge_in_full,
                budget_input=budget_input,
                budget_output=self.max_tokens,
                note="charged its full budget: the provider may have billed it"
                if failure.charge_in_full
                else "",
                error=str(failure)[:2000],
            )
        assert reply is not None
        note = reply.note
        if reply.cut_off:
            note = (note + "; " if note else "") + "cut off at the token limit; not acted on"
        return AttemptReport(
            provider=self.provider_key,
            model=self.model,
            started_at=started_at,
            finished_at=utc_now(),
            outcome=AttemptOutcome.OK,
            stop_reason=reply.stop_reason,
            usage=reply.usage,
            charge_in_full=reply.usage is None,
            budget_input=budget_input,
            budget_output=self.max_tokens,
            note=note,
            carry=reply.carry,
            reply=raw,
        )
