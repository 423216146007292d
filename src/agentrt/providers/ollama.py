"""`OllamaAgent`: a model served by Ollama, through its native `/api/chat` with tools."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final

import httpx2

from ..agent import StepInput
from ..sanitize import sanitize
from ._chat import (
    ChatAgent,
    arguments_object,
    function_tools,
    observation_text,
    opening_messages,
)
from ._http import (
    DEFAULT_TIMEOUT,
    MAX_RESPONSE_BYTES,
    Endpoint,
    HTTPClientFactory,
    ProviderError,
)

__all__ = ["DEFAULT_OLLAMA_URL", "OllamaAgent", "ollama_base_url"]

DEFAULT_OLLAMA_URL: Final = "http://127.0.0.1:11434"


def ollama_base_url(host: str | None) -> str:
    """The base URL for an `OLLAMA_HOST` value, as Ollama's own client reads it.

    Empty means the local default; a value without a scheme is plain http;
    `0.0.0.0` (a listening address, not one to connect to) means this machine.
    """
    value = (host or "").strip()
    if not value:
        return DEFAULT_OLLAMA_URL
    try:
        url = httpx2.URL(value if "://" in value else "http://" + value)
    except httpx2.InvalidURL:
        return value  # the Endpoint check names it
    hostname = url.host
    if hostname in ("0.0.0.0", "::"):  # noqa: S104 — a listening address, not one to connect to
        hostname = "127.0.0.1"
    if ":" in hostname:
        hostname = f"[{hostname}]"
    port = url.port or (443 if url.scheme == "https" else 11434)
    return f"{url.scheme}://{hostname}:{port}{url.path.rstrip('/')}"


class OllamaAgent(ChatAgent):
    """Asks an Ollama model for the next step; non-streaming, one request a step.

    `base_url` defaults to `OLLAMA_HOST` or http://127.0.0.1:11434.  `api_key`
    (for a hosted Ollama) is sent only over https or to a loopback host and is
    never read from the environment.  `http_client_factory` returns a new
    client for each request (the agent closes it); redirects are refused
    either way.  `options` (e.g. `{"temperature": 0}`) pass as Ollama's own.
    """

    provider = "Ollama"
    path = "/api/chat"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        http_client_factory: HTTPClientFactory | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        if not model:
            raise ProviderError("an Ollama agent needs a model name, e.g. ollama:qwen3:30b-a3b")
        if base_url is None:
            base_url = ollama_base_url(os.environ.get("OLLAMA_HOST"))
        super().__init__(
            model,
            Endpoint(base_url, api_key),
            http_client_factory=http_client_factory,
            timeout=timeout,
            max_response_bytes=max_response_bytes,
        )
        self._options = dict(options) if options is not None else None

    def request_body(self, step_input: StepInput) -> dict[str, Any]:
        messages = opening_messages(step_input)
        for observation in step_input.history:
            arguments = arguments_object(observation.args)
            if arguments is None:
                # Ollama takes only an object as a call's arguments; a call that
                # was not one is told back as text, exactly as it was sent.
                messages.append(
                    {
                        "role": "assistant",
                        "content": f"(called {observation.tool} with arguments {observation.args})",
                    }
                )
            else:
                messages.append(
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {"function": {"name": observation.tool, "arguments": arguments}}
                        ],
                    }
                )
            messages.append(
                {
                    "role": "tool",
                    "tool_name": observation.tool,
                    "content": observation_text(observation),
                }
            )
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "tools": function_tools(step_input.tools),
            "stream": False,
        }
        if self._options is not None:
            body["options"] = self._options
        return body

    def answer_message(self, answer: Any, where: str) -> Any:
        if not isinstance(answer, dict):
            raise ProviderError(f"{where} answered with something other than a JSON object")
        if isinstance(answer.get("error"), str):
            raise ProviderError(f"{where} answered with an error: {sanitize(answer['error'])}")
        return answer.get("message")
