"""What the chat-style adapters share: the prompt, the tools as function
schemas, the history as messages, and an answer turned into a `Decision`.

The adapter never repairs or judges a tool call's arguments: it hands the
gate the exact text the model produced, and the gate (the one place requests
are checked) records a malformed one verbatim as an invalid decision and
tells the model what was wrong.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Final

from ..agent import Decision, Observation, StepInput
from ..canonical import JSONBoundaryError, canonical_json, parse_json
from ..sanitize import sanitize
from ..tools import ToolSpec
from ._http import (
    DEFAULT_TIMEOUT,
    MAX_RESPONSE_BYTES,
    Endpoint,
    HTTPClientFactory,
    ProviderError,
    post_json,
)

__all__ = [
    "SYSTEM_PROMPT",
    "ChatAgent",
    "arguments_object",
    "decision_from_message",
    "function_tools",
    "observation_text",
    "opening_messages",
]

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


class ChatAgent:
    """What the chat adapters share: a checked endpoint, one POST a step, the answer as a Decision.

    A subclass names its `provider` and `path`, builds `request_body`, and
    finds the assistant message in the parsed answer (`answer_message`).
    """

    provider: ClassVar[str] = ""
    path: ClassVar[str] = ""

    def __init__(
        self,
        model: str,
        endpoint: Endpoint,
        *,
        http_client_factory: HTTPClientFactory | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        self.model = model
        self.endpoint = endpoint
        self._client_factory = http_client_factory
        self._timeout = timeout
        self._max_response_bytes = max_response_bytes

    def __repr__(self) -> str:
        # Never the key.
        return f"{type(self).__name__}(model={self.model!r}, base_url={self.endpoint.base_url!r})"

    @property
    def description(self) -> str:
        """One line naming the model and where it is served, for the operator."""
        return f"{self.provider} model {sanitize(self.model)} at {sanitize(self.endpoint.base_url)}"

    def request_body(self, step_input: StepInput) -> dict[str, Any]:
        """The request for this step (public so tests and operators can read it)."""
        raise NotImplementedError

    def answer_message(self, answer: Any, where: str) -> Any:
        """The assistant message inside a parsed answer; `ProviderError` when there is none."""
        raise NotImplementedError

    async def decide(self, step_input: StepInput) -> Decision:
        """Ask the model; a tool call becomes `Decision.tool_call`, text `Decision.complete`.

        Raises `ProviderError` when the endpoint cannot be used: no decision
        is recorded in the model's name, and the run stays as it was, to be
        resumed once the endpoint is back.
        """
        answer = await post_json(
            self.endpoint,
            self.path,
            self.request_body(step_input),
            what=f"the {self.provider} endpoint",
            client_factory=self._client_factory,
            deadline=self._timeout,
            max_bytes=self._max_response_bytes,
        )
        where = f"the {self.provider} model {sanitize(self.model)}"
        return decision_from_message(self.answer_message(answer, where), where)
