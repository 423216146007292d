"""`OllamaAgent`: a model served by Ollama, through its native `/api/chat` with tools."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Final

import httpx2

from ..agent import StepInput
from ..sanitize import sanitize
from ._chat import (
    DEFAULT_MAX_TOKENS,
    ChatAgent,
    ModelReply,
    RetryPolicy,
    arguments_object,
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
    either way.  `options` (e.g. `{"temperature": 0}`) pass as Ollama's own;
    `max_tokens` is sent as `options.num_predict` unless `options` sets it,
    whose value is then the budget.
    """

    provider = "Ollama"
    provider_key = "ollama"
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
        max_tokens: int = DEFAULT_MAX_TOKENS,
        retry: RetryPolicy | None = None,
        record_replies: bool = False,
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
            max_tokens=_budget(options, max_tokens),
            retry=retry,
            record_replies=record_replies,
        )
        self._options = dict(options) if options is not None else {}
        self._options.setdefault("num_predict", self.max_tokens)

    def request_body(self, step_input: StepInput, notes: Sequence[str] = ()) -> dict[str, Any]:
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
        messages.extend(note_messages(notes))
        return {
            "model": self.model,
            "messages": messages,
            "tools": function_tools(step_input.tools),
            "stream": False,
            "options": self._options,
        }

    def read_reply(self, answer: Any, where: str) -> ModelReply:
        if not isinstance(answer, dict):
            raise ProviderError(f"{where} answered with something other than a JSON object")
        if isinstance(answer.get("error"), str):
            raise ProviderError(f"{where} answered with an error: {sanitize(answer['error'])}")
        decision = decision_from_message(answer.get("message"), where)
        done_reason = answer.get("done_reason")
        stop_reason = done_reason if isinstance(done_reason, str) else None
        # Ollama leaves prompt_eval_count out when the prompt came from its cache,
        # so neither counter is promised; a negative or non-integer one is still flagged.
        usage, note = read_usage(
            answer,
            {"input_tokens": "prompt_eval_count", "output_tokens": "eval_count"},
            promised=(),
            where=where,
        )
        return ModelReply(decision, usage, stop_reason, stop_reason == "length", note)


def _budget(options: Mapping[str, Any] | None, max_tokens: int) -> int:
    named = (options or {}).get("num_predict")
    if isinstance(named, int) and not isinstance(named, bool) and named > 0:
        return named
    return max_tokens
