"""Answers in each API's documented format, for the fake servers to send."""

from __future__ import annotations

from typing import Any


def anthropic_message(
    content: list[dict[str, Any]],
    *,
    stop_reason: str = "end_turn",
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Messages API response (`type: message`)."""
    return {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-fake",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage
        if usage is not None
        else {
            "input_tokens": 120,
            "output_tokens": 30,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def anthropic_tool_use(name: str, tool_input: Any, **kwargs: Any) -> dict[str, Any]:
    kwargs.setdefault("stop_reason", "tool_use")
    return anthropic_message(
        [
            {"type": "text", "text": "I will call a tool."},
            {"type": "tool_use", "id": "toolu_01", "name": name, "input": tool_input},
        ],
        **kwargs,
    )


def anthropic_text(text: str, **kwargs: Any) -> dict[str, Any]:
    return anthropic_message([{"type": "text", "text": text}], **kwargs)


def anthropic_error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def openai_completion(
    message: dict[str, Any], *, finish_reason: str = "stop", usage: Any = None
) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", **message},
                "finish_reason": finish_reason,
            }
        ],
    }
    if usage is not None:
        answer["usage"] = usage
    return answer


def ollama_chat(
    message: dict[str, Any], *, done_reason: str = "stop", **counters: Any
) -> dict[str, Any]:
    return {
        "model": "m",
        "created_at": "2026-01-01T00:00:00Z",
        "message": {"role": "assistant", **message},
        "done": True,
        "done_reason": done_reason,
        **counters,
    }
