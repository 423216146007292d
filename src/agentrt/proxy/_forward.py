"""A server's `tools/call` result as the host receives it: the server's own blocks, bounded.

The host gets what the server returned — text blocks as text, image, audio
and resource blocks as blocks, `structuredContent` as structured content —
cut to the server's `max_result_bytes`.  A cut is never silent: the result
then ends in a text block saying what was left out, which the model reads
like any other text.  The audit log records the size and SHA-256 of exactly
the object forwarded, so the record and the answer are tied.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..canonical import canonical_json, plain_json

__all__ = ["DEFAULT_MAX_RESULT_BYTES", "MIN_MAX_RESULT_BYTES", "Forwarded", "forwardable"]

DEFAULT_MAX_RESULT_BYTES: Final = 512 * 1024
"""Half of the 1 MiB the official Python client accepts in one streamable-HTTP event."""

MIN_MAX_RESULT_BYTES: Final = 1024

# Room kept for the note that says what was cut (it names counts, never content).
_NOTE_RESERVE: Final = 400


@dataclass(frozen=True, slots=True)
class Forwarded:
    """The result object sent to the host, with the size and SHA-256 of its canonical JSON."""

    result: dict[str, Any]
    size: int
    sha256: str

    def summary(self) -> str:
        """The words added to the step's summary in the audit log."""
        return f"forwarded {self.size} bytes, sha256 {self.sha256}"


def _size(value: Any) -> int:
    return len(canonical_json(value).encode("utf-8"))


def _cut_text(text: str, budget: int) -> str:
    """The longest prefix of `text` whose JSON string form fits in `budget` bytes."""
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if _size(text[:middle]) <= budget:
            low = middle
        else:
            high = middle - 1
    return text[:low]


def forwardable(raw: Mapping[str, Any], max_bytes: int) -> Forwarded:
    """The host's copy of a successful result `raw`, at most about `max_bytes` of JSON.

    Kept: `content` (every block as the server sent it) and `structuredContent`.
    Over the bound, structured content that does not fit is left out, then
    whole blocks while they fit; a text block that does not fit is cut; a note
    naming what was left out ends the content.
    """
    blocks = raw.get("content")
    content: list[Any] = [plain_json(block) for block in blocks] if isinstance(blocks, list) else []
    result: dict[str, Any] = {"content": content, "isError": False}
    structured = raw.get("structuredContent")
    if structured is not None:
        result["structuredContent"] = plain_json(structured)
    encoded = canonical_json(result).encode("utf-8")
    if len(encoded) <= max_bytes:
        # Its canonical form, encoded once, gives both the bound's answer and the seal.
        return Forwarded(result, len(encoded), hashlib.sha256(encoded).hexdigest())

    left_out: list[str] = []
    kept: dict[str, Any] = {"content": [], "isError": False}
    used = _size(kept) + _NOTE_RESERVE
    if structured is not None:
        structured_bytes = _size(result["structuredContent"])
        if used + structured_bytes + len(',"structuredContent":') <= max_bytes:
            kept["structuredContent"] = result["structuredContent"]
            used += structured_bytes + len(',"structuredContent":')
        else:
            left_out.append(f"the structured content ({structured_bytes} bytes)")
    for position, block in enumerate(content, start=1):
        block_bytes = _size(block) + 1  # and its comma
        if used + block_bytes <= max_bytes:
            kept["content"].append(block)
            used += block_bytes
            continue
        if isinstance(block, dict) and block.get("type") == "text" and used < max_bytes:
            text = block.get("text")
            if isinstance(text, str):
                # A text block cut keeps its other members; only the text shrinks.
                empty = dict(block, text="")
                budget = max_bytes - used - _size(empty) - 1
                if budget > 16:
                    kept_text = _cut_text(text, budget)
                    kept["content"].append(dict(block, text=kept_text))
                    used = max_bytes
                    left_out.append(
                        f"the rest of text block {position} "
                        f"({len(text) - len(kept_text)} of {len(text)} characters)"
                    )
                    continue
        kind = block.get("type") if isinstance(block, dict) else None
        left_out.append(
            f"block {position} ({kind if isinstance(kind, str) else 'unknown'}, "
            f"{block_bytes - 1} bytes)"
        )
    kept["content"].append(
        {
            "type": "text",
            "text": (
                f"[agentrt: this result was cut to the proxy's limit of {max_bytes} bytes; "
                f"left out: {_listed(left_out)}]"
            ),
        }
    )
    return _sealed(kept)


def _listed(left_out: list[str]) -> str:
    shown = "; ".join(left_out[:4])
    more = len(left_out) - 4
    return shown if more <= 0 else f"{shown}; and {more} more blocks"


def _sealed(result: dict[str, Any]) -> Forwarded:
    encoded = canonical_json(result).encode("utf-8")
    return Forwarded(result, len(encoded), hashlib.sha256(encoded).hexdigest())
