"""Agents behind the `agentrt.agent.Agent` seam: real models and a scripted one.

`OllamaAgent`, `OpenAIAgent` and `AnthropicAgent` ask a model for the next
step over HTTP with the same care: no redirect followed, every response body bounded, a key sent
over plain http only to this machine, text the model chose escaped before it
reaches an error.  A tool call's arguments reach the gate as the exact text
the model sent; the gate checks them.  Each reply's usage and stop reason
are read; a reply cut off at its token limit is never acted on; failures are
retried with backoff (`RetryPolicy`) and every attempt is told to a
`ModelMeter` (the Driver's keeps the run's books); with `record_replies=True`
each answer's body is kept with its attempt, and `replay_client(store, run)`
plays a recorded run's answers back byte for byte.  `ScriptedAgent` answers
from a script.  `agent_for(spec)` builds one from a `--model` value
(`ollama:NAME`, `openai:NAME`, `anthropic:NAME`).
"""

from __future__ import annotations

from ..sanitize import sanitize
from ._chat import DEFAULT_MAX_TOKENS, NO_RETRY, ChatAgent, RetryPolicy
from ._http import MAX_RESPONSE_BYTES, AttemptError, ProviderError, is_loopback_host
from ._replay import replay_client
from .anthropic import DEFAULT_ANTHROPIC_URL, AnthropicAgent
from .ollama import DEFAULT_OLLAMA_URL, OllamaAgent
from .openai import DEFAULT_OPENAI_URL, OpenAIAgent
from .scripted import Script, ScriptedAgent

__all__ = [
    "DEFAULT_ANTHROPIC_URL",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_OLLAMA_URL",
    "DEFAULT_OPENAI_URL",
    "MAX_RESPONSE_BYTES",
    "NO_RETRY",
    "AnthropicAgent",
    "AttemptError",
    "ChatAgent",
    "OllamaAgent",
    "OpenAIAgent",
    "ProviderError",
    "RetryPolicy",
    "Script",
    "ScriptedAgent",
    "agent_for",
    "is_loopback_host",
    "replay_client",
]


def agent_for(model: str, *, base_url: str | None = None) -> ChatAgent:
    """The agent a `--model` value names: `ollama:NAME`, `openai:NAME` or `anthropic:NAME`.

    Raises `ProviderError` naming the value when the provider is unknown or
    the name is empty.
    """
    provider, colon, name = model.partition(":")
    if not colon or not name:
        raise ProviderError(
            f"--model {sanitize(model)!r} must be ollama:NAME, openai:NAME or anthropic:NAME"
            " (e.g. ollama:qwen3:30b-a3b)"
        )
    if provider == "ollama":
        return OllamaAgent(name, base_url=base_url)
    if provider == "openai":
        if base_url is None:
            return OpenAIAgent(name)
        return OpenAIAgent(name, base_url=base_url)
    if provider == "anthropic":
        if base_url is None:
            return AnthropicAgent(name)
        return AnthropicAgent(name, base_url=base_url)
    raise ProviderError(
        f"--model {sanitize(model)!r} names an unknown provider; use ollama:, openai: or anthropic:"
    )
