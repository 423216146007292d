"""What a server offers besides tools, held to its pins: prompts, resources, templates.

At load each section is listed again and every element compared with its
pin, as a tool is: one whose description or shape (a prompt's arguments, a
resource's listing) changed since the pin is refused with its reason, one
that is not pinned is left out, and the rest are offered exactly as listed
now (which, having passed, is what was pinned).  A manifest without a
section (written before prompts and resources were pinned) offers none of it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from ..sanitize import sanitize
from ._connection import Connection
from ._manifest import OFFER_KEYS, OFFER_SECTIONS, Manifest, description_hash, shape_hash
from ._pin import LISTINGS

__all__ = ["Offers", "load_offers"]


@dataclass(slots=True)
class Offers:
    """Each section's elements that passed, as listed (parsed, literals kept), and one
    escaped line per element refused or left out."""

    prompts: list[dict[str, Any]] = field(default_factory=list)
    resources: list[dict[str, Any]] = field(default_factory=list)
    resource_templates: list[dict[str, Any]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


async def load_offers(
    connection: Connection,
    manifest: Manifest,
    *,
    prompts: Collection[str] | None = None,
    timeout: float,  # noqa: ASYNC109 - bounds the listings together
) -> Offers:
    """List and check every pinned section; `prompts` limits the prompts offered to those
    names (None: every pinned one).  A listing that fails fails the load of that section
    only, said in one line."""
    offers = Offers()
    server = sanitize(manifest.server)
    capabilities = connection.capabilities if isinstance(connection.capabilities, dict) else {}
    for section in OFFER_SECTIONS:
        pins = manifest.offers(section)
        label = section.replace("_", " ")
        if pins is None:
            offers.lines.append(
                f"{server}: the manifest pins no {label} (pinned before they were); "
                "pin again to offer them"
            )
            continue
        capability, method, key = LISTINGS[section]
        if not pins or capability not in capabilities:
            continue
        try:
            listed = await connection.list_all(method, key, timeout=timeout)
        except Exception as exc:
            offers.lines.append(f"{server}: no {label} offered: {sanitize(str(exc))}")
            continue
        kept: list[dict[str, Any]] = getattr(offers, section)
        seen: set[str] = set()
        for raw in listed:
            name = raw.get(OFFER_KEYS[section]) if isinstance(raw, dict) else None
            if not isinstance(name, str) or not isinstance(raw, dict):
                offers.lines.append(f"{server}: refused a {label} entry without a usable key")
                continue
            shown = sanitize(name)
            pinned = pins.get(name)
            if name in seen:
                offers.lines.append(f"{server}: refused {label} {shown}: listed twice")
                continue
            seen.add(name)
            if pinned is None:
                offers.lines.append(
                    f"{server}: unpinned {label} {shown}: offered but not in the manifest; "
                    "review it and pin again to use it"
                )
                continue
            if description_hash(raw) != pinned.description_hash:
                offers.lines.append(
                    f"{server}: refused {label} {shown}: its description changed since it was "
                    "pinned; review it and pin again"
                )
                continue
            if shape_hash(section, raw) != pinned.shape_hash:
                what = "arguments" if section == "prompts" else "listing"
                offers.lines.append(
                    f"{server}: refused {label} {shown}: its {what} changed since it was "
                    "pinned; review it and pin again"
                )
                continue
            if section == "prompts" and prompts is not None and name not in prompts:
                offers.lines.append(f"{server}: prompt {shown} is not in the server's prompts list")
                continue
            kept.append(raw)
    return offers
