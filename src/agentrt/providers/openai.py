"""`OpenAIAgent`: any OpenAI-compatible chat-completions endpoint, with tools."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final

import httpx2

from ..agent import Decision, StepInput
from ..sanitize import sanitize
from ._chat import decision_from_message, function_tools, observation_text, opening_messages
from ._http import (
    DEFAULT_TIMEOUT,
    MAX_RESPONSE_BYTES,
    Endpoint,
    HTTPClientFactory,
    ProviderError,
    post_json,
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


class OpenAIAgent:
    """Asks a chat-completions model for the next step, one request a step.

    The key is `api_key`, or `OPENAI_API_KEY` only when `base_url` is the
    default host: a key meant for one provider is never handed to another
    URL by accident.  Any key goes over plain http only to a loopback host;
    otherwise construction refuses before anything is sent.
    """

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
        self.model = model
        self.endpoint = Endpoint(base_url, api_key)
        self._client_factory = http_client_factory
        self._timeout = timeout
        self._max_response_bytes = max_response_bytes
        self._extra_body = dict(extra_body) if extra_body is not None else {}

    def __repr__(self) -> str:
        # Never the key.
        return f"OpenAIAgent(model={self.model!r}, base_url={self.endpoint.base_url!r})"

    @property
    def description(self) -> str:
        """One line naming the model and where it is served, for the operator."""
        return (
            f"OpenAI-compatible model {sanitize(self.model)} at {sanitize(self.endpoint.base_url)}"
        )

    def request_body(self, step_input: StepInput) -> dict[str, Any]:
        """The `/chat/completions` request for this step (exposed so tests can read it)."""
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

    async def decide(self, step_input: StepInput) -> Decision:
        """Ask the model; a tool call becomes `Decision.tool_call`, text `Decision.complete`.

        Raises `ProviderError` when the endpoint cannot be used (the run is
        left as it was, so it can be resumed once the endpoint is back).
        """
        answer = await post_json(
            self.endpoint,
            "/chat/completions",
            self.request_body(step_input),
            what="the OpenAI-compatible endpoint",
            client_factory=self._client_factory,
            deadline=self._timeout,
            max_bytes=self._max_response_bytes,
        )
        where = f"the model {sanitize(self.model)}"
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ProviderError(f"{where} answered without a choice")
        return decision_from_message(choices[0].get("message"), where)
