"""`OpenAIAgent`: any OpenAI-compatible chat-completions endpoint, with tools."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final

import httpx2

from ..agent import StepInput
from ._chat import ChatAgent, function_tools, observation_text, opening_messages
from ._http import (
    DEFAULT_TIMEOUT,
    MAX_RESPONSE_BYTES,
    Endpoint,
    HTTPClientFactory,
    ProviderError,
)

__all__ = ["DEFAULT_OPENAI_URL", "OpenAIAgent"]

DEFAULT_OPENAI_URL: Final = "https://api.openai.com/v1"
_DEFAULT_HOST: Final = "api.openai.com"
_KEY_VARIABLE: Final = "OPENAI_API_KEY"


def _is_default_host(base_url: str) -> bool:
    try:
        url = httpx2.URL(base_url)
    except httpx2.InvalidURL:
        return False
    return url.scheme == "https" and url.host == _DEFAULT_HOST and url.port in (None, 443)


class OpenAIAgent(ChatAgent):
    """Asks a chat-completions model for the next step, one request a step.

    The key is `api_key`, or `OPENAI_API_KEY` only when `base_url` is the
    default host: a key meant for one provider is never handed to another
    URL by accident.  Any key goes over plain http only to a loopback host;
    otherwise construction refuses before anything is sent.  `extra_body`
    adds fields to every request (e.g. `{"temperature": 0}`).
    """

    provider = "OpenAI-compatible"
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
    ) -> None:
        if not model:
            raise ProviderError("an OpenAI-compatible agent needs a model name, e.g. openai:NAME")
        if api_key is None and _is_default_host(base_url):
            api_key = os.environ.get(_KEY_VARIABLE) or None
            if api_key is None:
                raise ProviderError(
                    f"{_KEY_VARIABLE} is not set; the default endpoint {DEFAULT_OPENAI_URL}"
                    " needs a key"
                )
        super().__init__(
            model,
            Endpoint(base_url, api_key),
            http_client_factory=http_client_factory,
            timeout=timeout,
            max_response_bytes=max_response_bytes,
        )
        self._extra_body = dict(extra_body) if extra_body is not None else {}

    def request_body(self, step_input: StepInput) -> dict[str, Any]:
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
        body: dict[str, Any] = dict(self._extra_body)
        body.update(
            {
                "model": self.model,
                "messages": messages,
                "tools": function_tools(step_input.tools),
                "stream": False,
            }
        )
        return body

    def answer_message(self, answer: Any, where: str) -> Any:
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ProviderError(f"{where} answered without a choice")
        return choices[0].get("message")
