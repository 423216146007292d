"""Pin, load and call the stock servers: @modelcontextprotocol/server-filesystem,
server-everything (both over real stdio under node) and the PyPI mcp-server-time."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from agentrt import SideEffect, ToolCall
from agentrt.mcp import LoadError, Manifest, PinError, Report, Rule, Server, load, pin

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

NODE_MODULES = (
    Path(__file__).resolve().parents[1] / "npm" / "node_modules" / "@modelcontextprotocol"
)
FILESYSTEM = NODE_MODULES / "server-filesystem" / "dist" / "index.js"
EVERYTHING = NODE_MODULES / "server-everything" / "dist" / "index.js"

READ = Rule(side_effect=SideEffect.READ_ONLY)
FS_RULES = {
    "read_text_file": READ,
    "list_directory": READ,
    "get_file_info": READ,
    "list_allowed_directories": READ,
    "write_file": Rule(side_effect=SideEffect.LOCAL_MUTATION, allow_hint_mismatch=True),
}


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    root = tmp_path / "sandbox"
    root.mkdir()
    (root / "README.md").write_text("# Sandbox\nline two\n")
    return root.resolve()


@pytest.fixture
def filesystem(sandbox: Path) -> Server:
    return Server(name="fs", command=["node", str(FILESYSTEM), str(sandbox)], default_timeout=20.0)


@pytest.fixture
async def closing() -> Any:
    reports: list[Report] = []
    yield reports
    for report in reports:
        if report.connection is not None:
            await report.connection.aclose()


async def test_filesystem_server_pins_fourteen_tools_with_the_hints_it_claims(
    filesystem: Server,
) -> None:
    manifest = await pin(filesystem)
    assert len(manifest.tools) == 14
    for name in ("read_text_file", "list_directory", "get_file_info", "search_files"):
        assert manifest.tools[name].annotations["readOnlyHint"] is True  # type: ignore[index]
    for name in ("write_file", "edit_file", "move_file"):
        assert manifest.tools[name].annotations["destructiveHint"] is True  # type: ignore[index]
    create = manifest.tools["create_directory"].annotations or {}
    assert create.get("readOnlyHint") is not True and create.get("destructiveHint") is not True
    assert Manifest.from_json(manifest.to_json()) == manifest


async def test_two_pins_of_the_filesystem_server_differ_only_in_pinned_at(
    filesystem: Server,
) -> None:
    first = (await pin(filesystem)).to_json().splitlines()
    second = (await pin(filesystem)).to_json().splitlines()
    assert [a for a, b in zip(first, second, strict=True) if a != b] in ([], [first[1]])


async def test_filesystem_server_loads_five_rules_and_reads_and_writes_through_the_tools(
    filesystem: Server, sandbox: Path, closing: list[Report]
) -> None:
    manifest = await pin(filesystem)
    tools, report = await load(filesystem, manifest, FS_RULES)
    closing.append(report)
    assert sorted(r.name for r in report.registered) == [
        "fs_get_file_info",
        "fs_list_allowed_directories",
        "fs_list_directory",
        "fs_read_text_file",
        "fs_write_file",
    ]
    (write,) = [r for r in report.registered if r.tool == "write_file"]
    assert write.hint_mismatch == "classified local_mutation, but the server claims destructiveHint"
    assert len(report.unclassified) == 9
    assert report.refused == [] and report.unpinned == []

    by_name = {t.spec.name: t for t in tools}
    read = await by_name["fs_read_text_file"].call(
        ToolCall(args=json.dumps({"path": str(sandbox / "README.md")}))
    )
    assert "line two" in read.content
    assert read.summary.startswith("fs/read_text_file: ")
    written = await by_name["fs_write_file"].call(
        ToolCall(args=json.dumps({"path": str(sandbox / "out.txt"), "content": "a\nb\n"}))
    )
    assert "out.txt" in written.content
    assert (sandbox / "out.txt").read_text() == "a\nb\n"


async def test_filesystem_write_without_allow_hint_mismatch_is_refused(
    filesystem: Server, closing: list[Report]
) -> None:
    manifest = await pin(filesystem)
    rules = dict(FS_RULES, write_file=Rule(side_effect=SideEffect.LOCAL_MUTATION))
    tools, report = await load(filesystem, manifest, rules)
    closing.append(report)
    assert [(r.tool, r.reason) for r in report.refused] == [
        (
            "write_file",
            "classified local_mutation, but the server claims destructiveHint; if the "
            'classification is right, set "allow_hint_mismatch": true in its rule',
        )
    ]
    assert "fs_write_file" not in [t.spec.name for t in tools]


async def test_filesystem_outside_the_sandbox_is_the_servers_tool_error(
    filesystem: Server, closing: list[Report]
) -> None:
    manifest = await pin(filesystem)
    tools, report = await load(filesystem, manifest, {"read_text_file": READ})
    closing.append(report)
    with pytest.raises(Exception, match='server "fs" tool "read_text_file"'):
        await tools[0].call(ToolCall(args='{"path": "/etc/passwd"}'))


async def test_everything_server_pins_loads_and_maps_text_images_links_and_structure(
    closing: list[Report],
) -> None:
    server = Server(name="ev", command=["node", str(EVERYTHING)], default_timeout=20.0)
    manifest = await pin(server)
    names = ["echo", "get-sum", "get-tiny-image", "get-resource-links", "get-structured-content"]
    tools, report = await load(server, manifest, {name: READ for name in names})
    closing.append(report)
    by_name = {t.spec.name: t for t in tools}
    assert sorted(by_name) == sorted(f"ev_{name}" for name in names)

    echo = await by_name["ev_echo"].call(ToolCall(args='{"message": "hi"}'))
    assert json.loads(echo.content) == "Echo: hi"
    image = await by_name["ev_get-tiny-image"].call(ToolCall(args="{}"))
    assert "[image omitted]" in json.loads(image.content)
    links = await by_name["ev_get-resource-links"].call(ToolCall(args='{"count": 2}'))
    assert json.loads(links.content).count("[resource link omitted]") == 2
    weather = await by_name["ev_get-structured-content"].call(
        ToolCall(args='{"location": "Chicago"}')
    )
    assert set(json.loads(weather.content)) >= {"temperature", "humidity"}


async def test_time_server_pins_loads_and_calls(closing: list[Report]) -> None:
    server = Server(
        name="time", command=[sys.executable, "-m", "mcp_server_time"], default_timeout=20.0
    )
    manifest = await pin(server)
    assert sorted(manifest.tools) == ["convert_time", "get_current_time"]
    tools, report = await load(server, manifest, {"get_current_time": READ})
    closing.append(report)
    result = await tools[0].call(ToolCall(args='{"timezone": "Etc/UTC"}'))
    assert json.loads(result.content)["timezone"] == "Etc/UTC"
    assert report.unclassified == ["convert_time"]


async def test_a_server_that_cannot_start_fails_the_pin_and_the_load_naming_it(
    sandbox: Path,
) -> None:
    server = Server(name="fs", command=["node", str(sandbox / "absent.js")], connect_timeout=10)
    manifest = Manifest.from_json(
        '{"pinned_at":"2026-01-01T00:00:00.000000Z","server":"fs","tools":{}}'
    )
    with pytest.raises(LoadError, match='server "fs"'):
        await load(server, manifest, {})
    with pytest.raises(PinError, match='pinning server "fs" failed'):
        await pin(server)
