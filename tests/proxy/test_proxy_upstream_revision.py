"""A server built with the official SDK in its modern stateless mode (2026-07-28 over
streamable HTTP, no session) governed end to end through `agentrt proxy`: pinned over the
revision, listed, called (an `x-mcp-header` argument mirrored as the SDK checks), and a
write held for approval and run once approved."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from proxy_helpers import build_setup, host, text_of, write_private

from agentrt.mcp import Server, pin
from agentrt.store import open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

SDK_REVISION = Path(__file__).resolve().parents[1] / "mcp" / "servers" / "sdk_revision.py"


@pytest.fixture
def stateless_url() -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, str(SDK_REVISION), "http", "--stateless"], stdout=subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        yield f"http://127.0.0.1:{int(process.stdout.readline())}/mcp"
    finally:
        process.kill()
        process.wait()


async def test_a_stateless_sdk_server_is_pinned_called_and_held_for_approval(
    tmp_path: Path, stateless_url: str
) -> None:
    manifest = await pin(Server(name="sdk", endpoint=stateless_url, revision="auto"))
    assert manifest.revision == "2026-07-28"
    (tmp_path / "conf").mkdir()
    write_private(tmp_path / "conf" / "sdk.manifest.json", manifest.to_json())
    rules = {
        "add": {"side_effect": "read_only"},
        "region": {"side_effect": "read_only"},
        "write_note": {"side_effect": "remote_mutation"},
    }
    setup = await build_setup(
        tmp_path,
        servers=[
            {
                "name": "sdk",
                "endpoint": stateless_url,
                "revision": "auto",
                "default_timeout": "10s",
                "manifest": "sdk.manifest.json",
                "rules": rules,
            }
        ],
    )
    async with host(setup) as session:
        listing = await session.list_tools()
        assert sorted(tool.name for tool in listing.tools) == [
            "gate_status",
            "sdk_add",
            "sdk_region",
            "sdk_write_note",
        ]
        added = await session.call_tool("sdk_add", {"a": 2, "b": 40})
        assert text_of(added).startswith("42 ")
        # The SDK rejects a call whose Mcp-Param-Region header is missing or disagrees.
        region = await session.call_tool("sdk_region", {"region": "eu-wést", "query": "q"})
        assert text_of(region) == "ran q in eu-wést"
        held = await session.call_tool("sdk_write_note", {"text": "hello"})
        assert text_of(held).startswith("PENDING_APPROVAL: "), text_of(held)
        setup.approve_latest()
        ran = await session.call_tool("sdk_write_note", {"text": "hello"})
        assert text_of(ran) == "wrote hello"
        again = await session.call_tool("sdk_write_note", {"text": "hello"})
        assert text_of(again).startswith("DUPLICATE: ")
    with open_store(setup.database, create=False) as store:
        assert store.verify_chain().ok
