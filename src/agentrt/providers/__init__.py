"""Agents behind the `agentrt.agent.Agent` seam: real models and a scripted one.

`OllamaAgent` and `OpenAIAgent` ask a model for the next step over HTTP with
the same care: no redirect followed, every response body bounded, a key sent
over plain http only to this machine, text the model chose escaped before it
reaches an error.  A tool call's arguments reach the gate as the exact text
the model sent; the gate checks them.  `ScriptedAgent` answers from a script.
`agent_for(spec)` builds one from a `--model` value (`ollama:NAME`,
`openai:NAME`).
"""

from __future__ import annotations

from ..sanitize import sanitize
from ._http import MAX_RESPONSE_BYTES, ProviderError, is_loopback_host
from .ollama import DEFAULT_OLLAMA_URL, OllamaAgent
from .openai import DEFAULT_OPENAI_URL, OpenAIAgent
from .scripted import Script, ScriptedAgent

__all__ = [
    "DEFAULT_OLLAMA_URL",
    "DEFAULT_OPENAI_URL",
    "MAX_RESPONSE_BYTES",
    "OllamaAgent",
    "OpenAIAgent",
    "ProviderError",
    "Script",
    "ScriptedAgent",
    "agent_for",
    "is_loopback_host",
]


def agent_for(model: str, *, base_url: str | None = None) -> OllamaAgent | OpenAIAgent:
    """The agent a `--model` value names: `ollama:NAME` or `openai:NAME`.

    Raises `ProviderError` naming the value when the provider is unknown or
    the name is empty.
    """
    provider, colon, name = model.partition(":")
    if not colon or not name:
        raise ProviderError(
            f"--model {sanitize(model)!r} must be ollama:NAME or openai:NAME"
            " (e.g. ollama:qwen3:30b-a3b)"
        )
    if provider == "ollama":
        return OllamaAgent(name, base_url=base_url)
    if provider == "openai":
        if base_url is None:
            return OpenAIAgent(name)
        return OpenAIAgent(name, base_url=base_url)
    raise ProviderError(
        f"--model {sanitize(model)!r} names an unknown provider; use ollama: or openai:"
    )
