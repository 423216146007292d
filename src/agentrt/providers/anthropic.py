"""`AnthropicAgent`: Claude through the Messages API (`/v1/messages`), with tools."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..accounting import Usage
from ..agent import Decision, DecisionKind, StepInput
from ..canonical import JSONBoundaryError, canonical_json, parse_json
from ..sanitize import sanitize
from ..tools import ToolSpec
from ._chat import (
    DEFAULT_MAX_TOKENS,
    SYSTEM_PROMPT,
    ChatAgent,
    ModelReply,
    RetryPolicy,
    arguments_object,
    observation_text,
    read_usage,
)
from ._http import (
    DEFAULT_TIMEOUT,
    MAX_RESPONSE_BYTES,
    Endpoint,
    HTTPClientFactory,
    ProviderError,
    key_from_environment,
)
from ._strict import strict_refusal

__all__ = ["ANTHROPIC_VERSION", "DEFAULT_ANTHROPIC_URL", "AnthropicAgent"]

DEFAULT_ANTHROPIC_URL: Final = "https://api.anthropic.com"
ANTHROPIC_VERSION: Final = "2023-06-01"
"""The `anthropic-version` header every request carries."""

_KEY_VARIABLE: Final = "ANTHROPIC_API_KEY"


def _messages_path(base_url: str) -> str:
    # The SDKs' base URL has no /v1; one that already ends in it is taken as meant.
    return "/messages" if base_url.rstrip("/").endswith("/v1") else "/v1/messages"


def _text_turn(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "content": [{"type": "text", "text": text}]}


def _tools(tools: Sequence[ToolSpec], *, strict: bool = False) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = []
    for spec in tools:
        tool: dict[str, Any] = {
            "name": spec.name,
            "description": spec.description,
            "input_schema": spec.input_schema,
        }
        if strict:
            refusal = strict_refusal(spec.name, spec.input_schema)
            if refusal is not None:
                raise ProviderError(refusal)
            tool["strict"] = True
        listed.append(tool)
    return listed


MIN_THINKING_BUDGET: Final = 1024
"""The smallest `budget_tokens` the Messages API takes for extended thinking."""


def _carried_blocks(carried: str | None) -> list[dict[str, Any]]:
    """The thinking blocks kept with a step's tool call (written by `_thinking`), as sent."""
    if carried is None:
        return []
    try:
        blocks = parse_json(carried)
    except JSONBoundaryError:
        return []
    if not isinstance(blocks, list):
        return []
    return [block for block in blocks if isinstance(block, dict) and block.get("type") in _KEPT]


class AnthropicAgent(ChatAgent):
    """Asks a Claude model for the next step, one Messages request a step.

    The key is `api_key`, else `ANTHROPIC_API_KEY` — the variable only when
    `base_url` is the default https://api.anthropic.com, so a key meant for
    Anthropic is never handed to another URL by accident.  It travels as
    `x-api-key`, over plain http only to a loopback host.  `max_tokens` (the
    API requires one) bounds each reply; `extra_body` adds fields (e.g.
    `{"temperature": 0}`).  A `tool_use` block becomes a tool call whose
    arguments are the canonical JSON of its `input` (every literal kept).

    `thinking_budget` turns extended thinking on; the thinking blocks that led
    to a tool call (signatures included) are recorded with the attempt and sent
    back with that call in every later request of the run, as the API requires,
    also after a resume in another process.  `strict_tools` asks for strict
    tool use: every tool's schema must fit the API's subset, else the request
    is refused in one sentence naming the tool and where (see `_strict`).
    """

    provider = "Anthropic"
    provider_key = "anthropic"

    def __init__(
        self,
        model: str,
        *,
        base_url: str = DEFAULT_ANTHROPIC_URL,
        api_key: str | None = None,
        http_client_factory: HTTPClientFactory | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        retry: RetryPolicy | None = None,
        record_replies: bool = False,
        extra_body: Mapping[str, Any] | None = None,
        thinking_budget: int | None = None,
        strict_tools: bool = False,
    ) -> None:
        if not model:
            raise ProviderError("an Anthropic agent needs a model name, e.g. anthropic:NAME")
        if thinking_budget is not None and (
            isinstance(thinking_budget, bool)
            or not isinstance(thinking_budget, int)
            or not MIN_THINKING_BUDGET <= thinking_budget < max_tokens
        ):
            raise ProviderError(
                f"thinking_budget must be a whole number of tokens from {MIN_THINKING_BUDGET} "
                f"up to max_tokens ({max_tokens}) exclusive, not {thinking_budget!r}"
            )
        api_key = key_from_environment(
            api_key, base_url, default_url=DEFAULT_ANTHROPIC_URL, variable=_KEY_VARIABLE
        )
        super().__init__(
            model,
            Endpoint(base_url, api_key),
            http_client_factory=http_client_factory,
            timeout=timeout,
            max_response_bytes=max_response_bytes,
            max_tokens=max_tokens,
            retry=retry,
            record_replies=record_replies,
        )
        self.path = _messages_path(base_url)
        self._extra_body = dict(extra_body) if extra_body is not None else {}
        self.thinking_budget = thinking_budget
        self.strict_tools = strict_tools
        # With thinking on, each tool call goes back with the thinking that led to it.
        self.carries_context = thinking_budget is not None

    def key_headers(self, key: str) -> Mapping[str, str]:
        return {"x-api-key": key}

    def extra_headers(self) -> Mapping[str, str]:
        return {"anthropic-version": ANTHROPIC_VERSION}

    def request_body(self, step_input: StepInput, notes: Sequence[str] = ()) -> dict[str, Any]:
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": [{"type": "text", "text": step_input.goal}]}
        ]
        offered = {spec.name for spec in step_input.tools}
        for observation in step_input.history:
            arguments = arguments_object(observation.args)
            told = observation_text(observation)
            if arguments is None or observation.tool not in offered:
                # `tool_use` takes an object input and a tool the request offers; a
                # call that was neither is told back as text, exactly as it was sent.
                called = f"(called {observation.tool} with arguments {observation.args})"
                messages.append(
                    {"role": "assistant", "content": [{"type": "text", "text": called}]}
                )
                messages.append({"role": "user", "content": [{"type": "text", "text": told}]})
                continue
            use_id = f"toolu_agentrt_{observation.step}"
            # The thinking that led to this call, exactly as it came (signatures and all):
            # the API requires it back with the tool call when thinking is on.
            thought = _carried_blocks(step_input.carried.get(observation.step))
            messages.append(
                {
                    "role": "assistant",
                    "content": [
                        *thought,
                        {"type": "tool_use", "id": use_id, "name": observation.tool,
                         "input": arguments},
                    ],
                }
            )  # fmt: skip
            result: dict[str, Any] = {"type": "tool_result", "tool_use_id": use_id, "content": told}
            if observation.kind != "result":
                result["is_error"] = True
            messages.append({"role": "user", "content": [result]})
        if notes:
            # After the last user turn, in the same turn: roles must alternate.
            messages[-1]["content"].extend({"type": "text", "text": note} for note in notes)
        body: dict[str, Any] = dict(self._extra_body)
        body.update(
            {
                "model": self.model,
                "max_tokens": self.max_tokens,
                "system": SYSTEM_PROMPT,
                "messages": messages,
                "tools": _tools(step_input.tools, strict=self.strict_tools),
            }
        )
        if self.thinking_budget is not None:
            body["thinking"] = {"type": "enabled", "budget_tokens": self.thinking_budget}
        return body

    def read_reply(self, answer: Any, where: str) -> ModelReply:
        if not isinstance(answer, dict):
            raise ProviderError(f"{where} answered with something other than a JSON object")
        content = answer.get("content")
        if not isinstance(content, list):
            raise ProviderError(f"{where} answered without a content list")
        stop = answer.get("stop_reason")
        stop_reason = stop if isinstance(stop, str) else None
        usage, note = _usage(answer.get("usage"), where)
        decision = _decision(content, where)
        carry = _thinking(content, where) if decision.kind is DecisionKind.TOOL_CALL else None
        return ModelReply(decision, usage, stop_reason, stop_reason in _CUT_OFF, note, carry)


# The stop reasons of a reply cut short: by its `max_tokens`, or by the context window.
_CUT_OFF: Final = frozenset({"max_tokens", "model_context_window_exceeded"})


# The blocks kept for the next request: thinking with its signature, and redacted thinking.
_KEPT: Final = frozenset({"thinking", "redacted_thinking"})


def _thinking(content: list[Any], where: str) -> str | None:
    """The thinking blocks before the first `tool_use`, unmodified, as JSON text (None when
    there are none); a block without the field the API needs back is refused."""
    kept: list[Any] = []
    for block in content:
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "tool_use":
            break
        if kind == "thinking":
            if not isinstance(block.get("thinking"), str) or not isinstance(
                block.get("signature"), str
            ):
                raise ProviderError(f"{where} answered with a thinking block without its signature")
            kept.append(block)
        elif kind == "redacted_thinking":
            if not isinstance(block.get("data"), str):
                raise ProviderError(f"{where} answered with a redacted thinking block without data")
            kept.append(block)
    return canonical_json(kept) if kept else None


def _decision(content: list[Any], where: str) -> Decision:
    """The first `tool_use` block as the call; otherwise the text blocks as the answer."""
    texts: list[str] = []
    for block in content:
        if not isinstance(block, Mapping):
            raise ProviderError(f"{where} answered with a content block that is not an object")
        kind = block.get("type")
        if kind == "tool_use":
            name = block.get("name")
            if not isinstance(name, str):
                raise ProviderError(f"{where} answered with a tool_use block that has no name")
            arguments = block.get("input")
            # `input` arrives as a value inside the API's own JSON, parsed by our
            # boundary (repeats refused, numbers kept as literals); its canonical
            # form is the exact text the gate records and checks.
            return Decision.tool_call(name, "" if arguments is None else canonical_json(arguments))
        if kind == "text":
            text = block.get("text")
            if not isinstance(text, str):
                raise ProviderError(f"{where} answered with a text block that holds no text")
            texts.append(text)
    joined = "".join(texts)
    if joined.strip():
        return Decision.complete(joined)
    return Decision.fail(f"{sanitize(where)} answered with neither text nor a tool call")


def _usage(fields: Any, where: str) -> tuple[Usage | None, str]:
    """The Messages API always reports input and output tokens; cache counters may be absent."""
    return read_usage(
        fields,
        {
            "input_tokens": "input_tokens",
            "output_tokens": "output_tokens",
            "cache_creation_input_tokens": "cache_creation_input_tokens",
            "cache_read_input_tokens": "cache_read_input_tokens",
        },
        promised=("input_tokens", "output_tokens"),
        where=where,
    )
