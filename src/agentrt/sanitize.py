"""Escaping of text a model or a server chose, before an operator reads it.

A tool name carrying a newline could print a line of its own (a registration
that never happened); a bidi override could make `approve` read as something
else; zero-width and tag characters can smuggle instructions a person cannot
see.  `sanitize` makes every such character visible as an escape and leaves
ordinary scripts and emoji alone.
"""

from __future__ import annotations

import unicodedata
from typing import Final

__all__ = ["MAX_COMBINING_RUN", "sanitize"]

MAX_COMBINING_RUN: Final = 4
"""Combining marks kept after one base character; the rest of a run is cut."""

# Invisible letters that unicodedata classifies as ordinary (Lo) characters.
_INVISIBLE_LETTERS: Final = frozenset({0x115F, 0x1160, 0x3164, 0xFFA0, 0x2800})
_ZERO_WIDTH_JOINER: Final = 0x200D
_EMOJI_VARIATION: Final = frozenset({0xFE0E, 0xFE0F})
_TAG_BLOCK_FIRST: Final = 0xE0000
_TAG_BLOCK_LAST: Final = 0xE007F


def _escape(code: int) -> str:
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _is_emoji(char: str) -> bool:
    code = ord(char)
    return (
        unicodedata.category(char) == "So"
        or 0x1F000 <= code <= 0x1FAFF
        or 0x2600 <= code <= 0x27BF
        or 0x1F3FB <= code <= 0x1F3FF
    )


def _needs_escape(char: str) -> bool:
    code = ord(char)
    if code in _INVISIBLE_LETTERS or _TAG_BLOCK_FIRST <= code <= _TAG_BLOCK_LAST:
        # The whole tag block, assigned or not: it is the classic invisible channel.
        return True
    category = unicodedata.category(char)
    # Cc: C0, DEL and C1 controls; Cf: bidi controls, zero-width characters,
    # the tag block, soft hyphen; Zl/Zp: line and paragraph separators;
    # Cs: a lone surrogate that reached a str.
    return category in ("Cc", "Cf", "Zl", "Zp", "Cs") or (
        # Variation selectors other than the emoji ones can carry hidden bytes.
        category == "Mn" and (0xFE00 <= code <= 0xFE0D or 0xE0100 <= code <= 0xE01EF)
    )


def sanitize(text: str) -> str:
    """Return `text` with control, bidi, invisible and tag characters escaped.

    Escapes look like `\\x1b`, `\\u202e`, `\\U000e0041`.  A zero-width joiner
    between two emoji and an emoji variation selector after one are kept, so
    emoji sequences print as they should.  Runs of combining marks longer than
    `MAX_COMBINING_RUN` are cut to that length followed by `\\u{…}`.
    """
    if text.isascii() and text.isprintable():
        return text
    out: list[str] = []
    combining_run = 0
    cut = False
    length = len(text)
    for index, char in enumerate(text):
        code = ord(char)
        category = unicodedata.category(char)
        if category in ("Mn", "Me") and not _needs_escape(char) and code not in _EMOJI_VARIATION:
            combining_run += 1
            if combining_run > MAX_COMBINING_RUN:
                if not cut:
                    out.append("\\u{…}")
                    cut = True
                continue
            out.append(char)
            continue
        combining_run = 0
        cut = False
        if code == _ZERO_WIDTH_JOINER:
            before = text[index - 1] if index > 0 else ""
            if ord(before or "\0") == 0xFE0F and index > 1:
                before = text[index - 2]  # ❤️‍🔥: the joiner follows the emoji's selector
            after = text[index + 1] if index + 1 < length else ""
            if before and after and _is_emoji(before) and _is_emoji(after):
                out.append(char)
                continue
        if code in _EMOJI_VARIATION:
            before = text[index - 1] if index > 0 else ""
            if before and (_is_emoji(before) or before.isdigit() or before in "#*"):
                out.append(char)
                continue
            out.append(_escape(code))
            continue
        if _needs_escape(char):
            out.append(_escape(code))
        else:
            out.append(char)
    return "".join(out)
