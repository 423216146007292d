"""`OpenAIAgent`: any OpenAI-compatible chat-completions endpoint, with tools."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..accounting import Usage
from ..agent import StepInput
from ._chat import (
    DEFAULT_MAX_TOKENS,
    ChatAgent,
    ModelReply,
    RetryPolicy,
    decision_from_message,
    function_tools,
    note_messages,
    observation_text,
    opening_messages,
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

__all__ = ["DEFAULT_OPENAI_URL", "OpenAIAgent"]

DEFAULT_OPENAI_URL: Final = "https://api.openai.com/v1"
_KEY_VARIABLE: Final = "OPENAI_API_KEY"


class OpenAIAgent(ChatAgent):
    """Asks a chat-completions model for the next step, one request a step.

    The key is `api_key`, or `OPENAI_API_KEY` only when `base_url` is the
    default host: a key meant for one provider is never handed to another
    URL by accident.  Any key goes over plain http only to a loopback host;
    otherwise construction refuses before anything is sent.  `extra_body`
    adds fields to every request (e.g. `{"temperature": 0}`).  `max_tokens`
    is sent as `max_tokens`, unless `extra_body` names `max_completion_tokens`
    (which OpenAI's reasoning models need), whose value is then the budget.
    """

    provider = "OpenAI-compatible"
    provider_key = "openai"
    path = "/chat/completions"

    def __init__(
        self,
        model: str,
        *,
        base_url: str = DEFAULT_OPENAI_URL,
        api_key: str | None = None,
        http_client_factory: HTTPClientFactory | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        extra_body: Mapping[str, Any] | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        retry: RetryPolicy | None = None,
        record_replies: bool = False,
    ) -> None:
        if not model:
            raise ProviderError("an OpenAI-compatible agent needs a model name, e.g. openai:NAME")
        api_key = key_from_environment(
            api_key, base_url, default_url=DEFAULT_OPENAI_URL, variable=_KEY_VARIABLE
        )
        super().__init__(
            model,
            Endpoint(base_url, api_key),
            http_client_factory=http_client_factory,
            timeout=timeout,
            max_response_bytes=max_response_bytes,
            max_tokens=_budget(extra_body, max_tokens),
            retry=retry,
            record_replies=record_replies,
        )
        self._extra_body = dict(extra_body) if extra_body is not None else {}

    def request_body(self, step_input: StepInput, notes: Sequence[str] = ()) -> dict[str, Any]:
        messages = opening_messages(step_input)
        for observation in step_input.history:
            call_id = f"call_{observation.step}"
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            # The exact text the model sent, valid or not.
                            "function": {"name": observation.tool, "arguments": observation.args},
                        }
                    ],
                }
            )
            messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": observation_text(observation)}
            )
        messages.extend(note_messages(notes))
        body: dict[str, Any] = dict(self._extra_body)
        if "max_completion_tokens" not in body:
            body["max_tokens"] = self.max_tokens
        body.update(
            {
                "model": self.model,
                "messages": messages,
                "tools": function_tools(step_input.tools),
                "stream": False,
            }
        )
        return body

    def read_reply(self, answer: Any, where: str) -> ModelReply:
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ProviderError(f"{where} answered without a choice")
        choice = choices[0]
        decision = decision_from_message(choice.get("message"), where)
        finish_reason = choice.get("finish_reason")
        stop_reason = finish_reason if isinstance(finish_reason, str) else None
        usage, note = _usage(answer.get("usage"), where)
        return ModelReply(decision, usage, stop_reason, stop_reason == "length", note)


def _budget(extra_body: Mapping[str, Any] | None, max_tokens: int) -> int:
    named = (extra_body or {}).get("max_completion_tokens")
    if isinstance(named, int) and not isinstance(named, bool):
        return named
    return max_tokens


def _usage(fields: Any, where: str) -> tuple[Usage | None, str]:
    """Chat completions promise `usage` with prompt and completion tokens; cached tokens
    (`prompt_tokens_details.cached_tokens`) are part of the prompt's, counted apart here."""
    usage, note = read_usage(
        fields,
        {"input_tokens": "prompt_tokens", "output_tokens": "completion_tokens"},
        promised=("prompt_tokens", "completion_tokens"),
        where=where,
    )
    if usage is None:
        return None, note
    details = fields.get("prompt_tokens_details") if isinstance(fields, Mapping) else None
    cached, note = read_usage(
        details, {"cache_read_input_tokens": "cached_tokens"}, promised=(), where=where
    )
    if cached is None:
        return None, note
    if cached.cache_read_input_tokens > usage.input_tokens:
        return None, f"usage not trusted: {where} reported more cached tokens than prompt tokens"
    return (
        Usage(
            usage.input_tokens - cached.cache_read_input_tokens,
            usage.output_tokens,
            0,
            cached.cache_read_input_tokens,
        ),
        "",
    )
