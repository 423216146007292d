"""Pinning a server's prompts, resources and templates from the bytes it sent."""

from __future__ import annotations

import hashlib

import pytest
from servers.harness import stdio_server

from agentrt.mcp import pin

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

_ANNOUNCING = (
    '{"protocolVersion":"2025-11-25","serverInfo":{"name":"x","version":"1"},'
    '"capabilities":{"tools":{},"prompts":{},"resources":{}}}'
)


async def test_a_section_the_server_announces_but_cannot_list_is_left_unpinned() -> None:
    server = stdio_server(
        {
            "initialize": {"result": _ANNOUNCING},
            "methods": {
                "prompts/list": {"error": {"code": -32603, "message": "broken"}},
                "resources/list": {"result": '{"Resources":[]}'},
                "resources/templates/list": {
                    "result": '{"resourceTemplates":[{"uriTemplate":"x://{id}","name":"x",'
                    '"description":"one x"}]}'
                },
            },
        }
    )
    manifest = await pin(server)
    # The tools are pinned as ever; the sections that failed are not pinned at all.
    assert manifest.tools
    assert manifest.prompts is None and manifest.resources is None
    assert manifest.resource_templates is not None
    (template,) = manifest.resource_templates.values()
    assert template.key == "x://{id}" and template.description == "one x"
    shape = '{"name":"x","uriTemplate":"x://{id}"}'
    assert template.shape_hash == hashlib.sha256(shape.encode()).hexdigest()
    assert '"prompts"' not in manifest.to_json()
