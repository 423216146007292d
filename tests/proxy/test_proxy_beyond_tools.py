"""Prompts, resources, completion, logging and a server's own requests through the proxy.

One proxy for the module, over streamable HTTP, in front of the conformance
server (a real MCP server over stdio, tests/proxy/servers/conformance_server.py);
each test connects its own host, the official Python SDK's ClientSession.
The conformance server notes each prompts/get, resources/read, subscribe and
logging/setLevel it receives in a log, so a test sees what reached it.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from proxy_helpers import CONFORMANCE, serving_http, text_of, write_private

from agentrt.canonical import canonical_json
from agentrt.mcp import Manifest, OperatorFileError, Server, pin
from agentrt.mcp._connection import connect
from agentrt.mcp._offers import load_offers
from agentrt.proxy.config import ConfigError, load_config
from agentrt.store import Event, open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

# A second server, asking in its results as the 2026-07-28 revision does.
INPUT_REQUIRED = Path(__file__).parent / "servers" / "input_required_server.py"


def conformance_server(log: Path, name: str = "conf") -> Server:
    return Server(
        name=name,
        command=[sys.executable, str(CONFORMANCE)],
        env=[f"CONFORMANCE_LOG={log}"],
        connect_timeout=20.0,
    )


@dataclass
class Running:
    url: str
    root: Path
    database: Path
    upstream_log: Path
    stderr: Path
    manifest: Manifest
    asking_log: Path

    def asking_lines(self) -> list[str]:
        return self.asking_log.read_text().splitlines() if self.asking_log.exists() else []

    def upstream_lines(self) -> list[str]:
        if not self.upstream_log.exists():
            return []
        return self.upstream_log.read_text().splitlines()

    def events(self) -> list[Event]:
        with open_store(self.database, create=False) as store:
            return store.events_after(0, limit=100_000)

    def run_events(self, run_id: str) -> list[Event]:
        return [event for event in self.events() if event.run_id == run_id]

    def last_run_of(self, tool: str) -> str:
        runs = [
            event.run_id
            for event in self.events()
            if event.type == "step_recorded" and event.payload.get("tool") == tool
        ]
        assert runs, f"no run of {tool}"
        return runs[-1]


def _rules(manifest: Manifest) -> dict[str, Any]:
    # Every tool read-only under its own name, as the issue's check configures it.
    return {
        name: {"side_effect": "read_only", "rename": name, "allow_hint_mismatch": True}
        for name in manifest.tools
    }


def proxy_document(manifest: Manifest, log: Path, **server: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": "conf",
        "command": [sys.executable, str(CONFORMANCE)],
        "env": [f"CONFORMANCE_LOG={log}"],
        "default_timeout": "20s",
        "manifest": "conf.manifest.json",
        "rules": _rules(manifest),
    }
    entry.update(server)
    return {"database": "proxy.db", "session": "beyond", "hold": "300ms", "servers": [entry]}


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    root = tmp_path_factory.mktemp("beyond")
    conf = root / "conf"
    log = root / "upstream.log"
    manifest = anyio.run(pin, conformance_server(root / "pin.log"))
    write_private(conf / "conf.manifest.json", manifest.to_json())
    document = proxy_document(
        manifest,
        log,
        prompts=[name for name in manifest.prompts or {} if name != "test_prompt_with_image"],
        resource_rules=[{"uri": "test://secret-*", "outcome": "deny"}],
        max_result_bytes=2048,
        client_requests={"elicitation": "forward", "sampling": "forward"},
    )
    # A short bound for one asking tool, so a suspended call's state can be seen to expire.
    document["servers"][0]["rules"]["test_elicitation_sep1330_enums"]["timeout"] = "2s"
    asking_log = root / "asking.log"
    asking = Server(name="asking", command=[sys.executable, str(INPUT_REQUIRED)])
    write_private(conf / "asking.manifest.json", anyio.run(pin, asking).to_json())
    document["servers"].append(
        {
            "name": "asking",
            "command": [sys.executable, str(INPUT_REQUIRED)],
            "env": [f"INPUT_REQUIRED_LOG={asking_log}"],
            "default_timeout": "20s",
            "manifest": "asking.manifest.json",
            "rules": {"ask_name": {"side_effect": "read_only", "rename": "ask_name"}},
            "client_requests": {"elicitation": "forward"},
        }
    )
    write_private(conf / "proxy.json", json.dumps(document))
    with serving_http(conf / "proxy.json", root) as (url, stderr):
        yield Running(url, root, conf / "proxy.db", log, stderr, manifest, asking_log)


@asynccontextmanager
async def host(url: str, **callbacks: Any) -> AsyncIterator[ClientSession]:
    async with (
        streamable_http_client(url) as (read_stream, write_stream),
        ClientSession(read_stream, write_stream, **callbacks) as session,
    ):
        await session.initialize()
        yield session


def _sha256(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def _as_received(result: Any) -> dict[str, Any]:
    """A result as the host got it on the wire, without the defaults its model fills in."""
    dumped: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_unset=True)
    return dumped


# -- prompts -----------------------------------------------------------------


async def test_prompts_are_listed_as_pinned_and_limited_to_the_operators_list(
    running: Running,
) -> None:
    async with host(running.url) as session:
        listed = await session.list_prompts()
    pinned = set(running.manifest.prompts or {})
    assert "test_prompt_with_image" in pinned
    assert {prompt.name for prompt in listed.prompts} == pinned - {"test_prompt_with_image"}


async def test_a_prompt_get_is_forwarded_and_recorded_with_its_arguments_size_and_hash(
    running: Running,
) -> None:
    async with host(running.url) as session:
        result = await session.get_prompt(
            "test_prompt_with_arguments", {"arg1": "hello", "arg2": "world"}
        )
    text = result.messages[0].content
    assert isinstance(text, types.TextContent)
    assert text.text == "Prompt with arguments: arg1='hello', arg2='world'"
    run_id = running.last_run_of("prompt--conf")
    events = running.run_events(run_id)
    step = next(event for event in events if event.type == "step_recorded")
    assert json.loads(step.payload["args"]) == {
        "name": "test_prompt_with_arguments",
        "arguments": {"arg1": "hello", "arg2": "world"},
    }
    finished = next(event for event in events if event.type == "tool_finished")
    recorded = json.loads(finished.payload["content"])
    forwarded = _as_received(result)
    assert recorded["sha256"] == _sha256(forwarded)
    assert recorded["bytes"] == len(canonical_json(forwarded).encode("utf-8"))
    assert f"sha256 {recorded['sha256']}" in finished.payload["summary"]


async def test_a_prompt_outside_the_operators_list_is_refused_and_never_reaches_the_server(
    running: Running,
) -> None:
    async with host(running.url) as session:
        with pytest.raises(MCPError, match="there is no prompt"):
            await session.get_prompt("test_prompt_with_image")
        # The refusal harmed nothing: the next prompt is served.
        simple = await session.get_prompt("test_simple_prompt")
    assert simple.messages
    assert not any("test_prompt_with_image" in line for line in running.upstream_lines())


async def test_the_proxys_own_names_for_prompts_and_resources_are_not_tools(
    running: Running,
) -> None:
    async with host(running.url) as session:
        listed = await session.list_tools()
        refused = await session.call_tool("resource--conf", {"uri": "test://static-text"})
        served = await session.call_tool("test_simple_text", {})
    assert not {"prompt--conf", "resource--conf"} & {tool.name for tool in listed.tools}
    assert refused.is_error and "no tool with this name" in text_of(refused)
    assert not served.is_error
    assert not any("resources/read test://static-text" in line for line in running.upstream_lines())


# -- resources ---------------------------------------------------------------


async def test_resources_and_templates_are_listed_as_pinned(running: Running) -> None:
    async with host(running.url) as session:
        resources = await session.list_resources()
        templates = await session.list_resource_templates()
    assert {str(item.uri) for item in resources.resources} == set(running.manifest.resources or {})
    assert [item.uri_template for item in templates.resource_templates] == [
        "test://template/{id}/data"
    ]


async def test_a_resource_read_is_recorded_as_a_read_only_call_with_its_uri_size_and_hash(
    running: Running,
) -> None:
    async with host(running.url) as session:
        result = await session.read_resource("test://template/7/data")
    content = result.contents[0]
    assert isinstance(content, types.TextResourceContents) and '"id": "7"' in content.text
    run_id = running.last_run_of("resource--conf")
    events = running.run_events(run_id)
    step = next(event for event in events if event.type == "step_recorded")
    assert json.loads(step.payload["args"]) == {"uri": "test://template/7/data"}
    decided = next(event for event in events if event.type == "policy_decided")
    assert decided.payload["outcome"] == "allow" and "read_only" in decided.payload["reason"]
    finished = next(event for event in events if event.type == "tool_finished")
    forwarded = _as_received(result)
    assert json.loads(finished.payload["content"])["sha256"] == _sha256(forwarded)


async def test_a_resource_rule_denies_a_uri_pattern_and_the_server_is_never_asked(
    running: Running,
) -> None:
    async with host(running.url) as session:
        with pytest.raises(MCPError, match="DENIED"):
            await session.read_resource("test://secret-resource")
        allowed = await session.read_resource("test://static-text")
    assert allowed.contents
    assert not any("secret-resource" in line for line in running.upstream_lines())
    run_id = running.last_run_of("resource--conf")
    assert any(
        event.type == "step_recorded" and "static-text" in event.payload["args"]
        for event in running.run_events(run_id)
    )
    denied = [
        event
        for event in running.events()
        if event.type == "policy_decided" and event.payload.get("outcome") == "deny"
    ]
    assert denied, "the denial is in the audit log"


async def test_a_resource_over_max_result_bytes_is_refused_whole(running: Running) -> None:
    async with host(running.url) as session:
        with pytest.raises(MCPError, match="max_result_bytes"):
            await session.read_resource("test://large-resource")
        small = await session.read_resource("test://static-binary")
    assert isinstance(small.contents[0], types.BlobResourceContents)


async def test_subscribe_is_forwarded_and_the_servers_update_reaches_the_host(
    running: Running,
) -> None:
    updates: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updates.append(str(message.params.uri))

    async with host(running.url, message_handler=on_message) as session:
        await session.subscribe_resource("test://watched-resource")
        with anyio.fail_after(10):
            while not updates:
                await anyio.sleep(0.05)
        await session.unsubscribe_resource("test://watched-resource")
    assert updates == ["test://watched-resource"]
    lines = running.upstream_lines()
    assert "resources/subscribe test://watched-resource" in lines
    assert "resources/unsubscribe test://watched-resource" in lines


# -- completion and logging --------------------------------------------------


async def test_completion_is_forwarded_to_the_server_of_the_prompt(running: Running) -> None:
    async with host(running.url) as session:
        result = await session.complete(
            types.PromptReference(type="ref/prompt", name="test_prompt_with_arguments"),
            {"name": "arg1", "value": "par"},
        )
    assert result.completion.values == ["paris", "park", "party"]


async def test_set_level_is_forwarded_to_the_upstream(running: Running) -> None:
    async with host(running.url) as session:
        await session.set_logging_level("warning")
    assert "logging/setLevel warning" in running.upstream_lines()


# -- the server's own requests -----------------------------------------------


def _client_request_events(running: Running, run_id: str) -> list[Event]:
    return [
        event for event in running.run_events(run_id) if event.type.startswith("client_request")
    ]


async def test_an_elicitation_is_forwarded_during_its_call_and_recorded_in_its_run(
    running: Running,
) -> None:
    asked: list[str] = []

    async def on_elicit(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"username": "ada", "email": "a@b"})

    async with host(running.url, elicitation_callback=on_elicit) as session:
        result = await session.call_tool("test_elicitation", {"message": "Who are you?"})
    assert asked == ["Who are you?"]
    assert not result.is_error and "ada" in text_of(result)
    run_id = running.last_run_of("test_elicitation")
    request, answer = _client_request_events(running, run_id)
    assert request.payload["method"] == "elicitation/create" and request.payload["forwarded"]
    assert request.payload["params"]["message"] == "Who are you?"
    assert answer.payload["action"] == "accept"
    assert answer.payload["content"] == {"username": "ada", "email": "a@b"}
    # An answer is data for the server, never a decision: the run asked no approval.
    assert not any(event.type.startswith("approval") for event in running.run_events(run_id))


async def test_a_sampling_request_is_forwarded_and_its_answer_recorded(running: Running) -> None:
    async def on_sample(context: Any, params: Any) -> types.CreateMessageResult:
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text="a sampled answer"),
            model="test-model",
        )

    async with host(running.url, sampling_callback=on_sample) as session:
        result = await session.call_tool("test_sampling", {"prompt": "Say something"})
    assert "a sampled answer" in text_of(result)
    request, answer = _client_request_events(running, running.last_run_of("test_sampling"))
    assert request.payload["method"] == "sampling/createMessage"
    assert answer.payload["answer"]["content"]["text"] == "a sampled answer"


async def test_roots_are_refused_by_default_and_the_refusal_recorded(running: Running) -> None:
    asked: list[bool] = []

    async def on_roots(context: Any) -> types.ListRootsResult:
        asked.append(True)
        return types.ListRootsResult(roots=[])

    async with host(running.url, list_roots_callback=on_roots) as session:
        result = await session.call_tool("test_roots", {})
        after = await session.call_tool("test_simple_text", {})
    assert asked == []
    assert result.is_error and "refuses roots requests" in text_of(result)
    assert not after.is_error
    (request,) = _client_request_events(running, running.last_run_of("test_roots"))
    assert request.payload["forwarded"] is False


async def test_a_url_elicitation_is_refused_unless_the_rule_says_forward_url(
    running: Running,
) -> None:
    asked: list[Any] = []

    async def on_elicit(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params)
        return types.ElicitResult(action="accept")

    async with host(running.url, elicitation_callback=on_elicit) as session:
        result = await session.call_tool("test_elicitation_url", {})
    assert asked == []
    assert result.is_error and "URL-mode elicitation" in text_of(result)
    (request,) = _client_request_events(running, running.last_run_of("test_elicitation_url"))
    assert request.payload["params"]["url"] == "https://example.com/sign-in"
    assert request.payload["forwarded"] is False


async def test_a_host_without_the_capability_is_never_asked(running: Running) -> None:
    async with host(running.url) as session:
        result = await session.call_tool("test_elicitation", {"message": "Anyone?"})
    assert result.is_error and "did not advertise the elicitation capability" in text_of(result)
    (request,) = _client_request_events(running, running.last_run_of("test_elicitation"))
    assert request.payload["forwarded"] is False


# -- pins at load ------------------------------------------------------------


def _changed(manifest: Manifest, **changes: str) -> Manifest:
    document = json.loads(manifest.to_json())
    for key, value in changes.items():
        document["prompts"]["test_prompt_with_arguments"][key] = value
    return Manifest.from_json(json.dumps(document))


async def test_a_prompt_whose_description_or_arguments_changed_is_refused_and_reported(
    running: Running, tmp_path: Path
) -> None:
    server = conformance_server(tmp_path / "log")
    for field, reason in (("description_hash", "description"), ("shape_hash", "arguments")):
        connection = await connect(server)
        try:
            offers = await load_offers(
                connection, _changed(running.manifest, **{field: "0" * 64}), timeout=10
            )
        finally:
            await connection.aclose()
        names = {prompt["name"] for prompt in offers.prompts}
        assert "test_prompt_with_arguments" not in names
        assert "test_simple_prompt" in names  # the others still load
        assert any(
            f"refused prompts test_prompt_with_arguments: its {reason} changed" in line
            for line in offers.lines
        ), offers.lines


async def test_a_manifest_without_prompts_loads_and_says_it_pins_none(
    running: Running, tmp_path: Path
) -> None:
    document = json.loads(running.manifest.to_json())
    for section in ("prompts", "resources", "resource_templates"):
        del document[section]
    old = Manifest.from_json(json.dumps(document))
    assert old.prompts is None and old.tools == running.manifest.tools
    connection = await connect(conformance_server(tmp_path / "log"))
    try:
        offers = await load_offers(connection, old, timeout=10)
    finally:
        await connection.aclose()
    assert offers.prompts == [] and offers.resources == []
    assert any("pins no prompts" in line for line in offers.lines)


# -- configuration refusals ----------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("prompts", "some", "prompts"),
        ("client_requests", {"elicitation": "always"}, "client_requests.elicitation"),
        ("client_requests", {"telepathy": "forward"}, "telepathy"),
        ("resource_rules", [{"uri": "test://*"}], "resource_rules[0]"),
        ("resource_rules", [{"uri": "test://*", "outcome": "maybe"}], "resource_rules[0] outcome"),
    ],
)
def test_a_bad_prompts_resource_rules_or_client_requests_field_is_refused_naming_it(
    running: Running, tmp_path: Path, field: str, value: Any, named: str
) -> None:
    write_private(tmp_path / "conf.manifest.json", running.manifest.to_json())
    document = proxy_document(running.manifest, tmp_path / "log", **{field: value})
    path = write_private(tmp_path / "proxy.json", json.dumps(document))
    with pytest.raises(ConfigError) as refused:
        load_config(str(path))
    message = str(refused.value)
    assert named in message and "\n" not in message
    # The same file with the field left out loads.
    del document["servers"][0][field]
    write_private(path, json.dumps(document))
    assert load_config(str(path)).servers[0].forwards("elicitation") == "refuse"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda pins: pins.update({"extra": 1}), 'the unknown field "extra"'),
        (lambda pins: pins.update({"key": "another"}), "pinned under another key"),
        (lambda pins: pins.pop("shape_hash"), 'has no "shape_hash"'),
    ],
)
def test_a_hand_edited_prompt_pin_is_refused_naming_it(
    running: Running, change: Any, named: str
) -> None:
    document = json.loads(running.manifest.to_json())
    change(document["prompts"]["test_simple_prompt"])
    with pytest.raises(OperatorFileError) as refused:
        Manifest.from_json(json.dumps(document), source="conf.manifest.json")
    assert named in str(refused.value) and "test_simple_prompt" in str(refused.value)
    # The untouched manifest still reads, prompts and all.
    assert Manifest.from_json(running.manifest.to_json()).prompts == running.manifest.prompts


async def test_a_request_after_the_host_stopped_waiting_is_refused_and_recorded(
    running: Running,
) -> None:
    asked: list[str] = []

    async def on_elicit(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={})

    async with host(running.url, elicitation_callback=on_elicit) as session:
        with anyio.move_on_after(0.5):
            await session.call_tool("test_elicitation_later", {"seconds": 1.5})
        # The call goes on upstream; its server asks once the host has gone.
        with anyio.fail_after(20):
            while True:
                runs = [
                    event
                    for event in running.events()
                    if event.type == "client_request"
                    and (event.payload.get("params") or {}).get("message") == "Still there?"
                ]
                if runs:
                    break
                await anyio.sleep(0.1)
        served = await session.call_tool("test_simple_text", {})
    assert asked == []
    assert runs[-1].payload["forwarded"] is False
    assert "no longer waited for" in runs[-1].payload["reason"]
    assert not served.is_error


async def test_a_request_during_two_calls_to_one_stdio_server_is_refused(
    running: Running,
) -> None:
    asked: list[str] = []

    async def on_elicit(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={})

    results: dict[str, Any] = {}
    async with host(running.url, elicitation_callback=on_elicit) as session:

        async def call(label: str, arguments: dict[str, Any]) -> None:
            results[label] = await session.call_tool("test_elicitation_later", arguments)

        async with anyio.create_task_group() as group:
            # The quiet call is still in flight when the other one's server asks.
            group.start_soon(call, "quiet", {"seconds": 3, "ask": False})
            group.start_soon(call, "asking", {"seconds": 1})
    # Nothing on a stdio wire says which call asked, so the question never reaches the host.
    assert asked == []
    assert results["asking"].is_error
    assert "does not answer elicitation/create" in text_of(results["asking"])
    assert not results["quiet"].is_error


# -- a host on the 2026-07-28 revision: input-required results ---------------


@asynccontextmanager
async def stateless_host(url: str, **callbacks: Any) -> AsyncIterator[Client]:
    async with Client(url, mode="2026-07-28", cache=None, **callbacks) as client:
        yield client


def _runs_of(running: Running, tool: str) -> list[str]:
    return [
        event.run_id
        for event in running.events()
        if event.type == "step_recorded" and event.payload.get("tool") == tool
    ]


async def test_a_stateless_host_answers_an_elicitation_through_an_input_required_result(
    running: Running,
) -> None:
    asked: list[str] = []

    async def on_elicit(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"username": "ada", "email": "a@b"})

    before = running.upstream_lines().count("tools/call test_elicitation")
    runs_before = len(_runs_of(running, "test_elicitation"))
    async with stateless_host(running.url, elicitation_callback=on_elicit) as client:
        result = await client.call_tool("test_elicitation", {"message": "Who, statelessly?"})
        assert client.protocol_version == "2026-07-28"
    assert asked == ["Who, statelessly?"]
    assert not result.is_error and "ada" in text_of(result)
    # The retry resumed the suspended call: one upstream call, one run.
    assert running.upstream_lines().count("tools/call test_elicitation") == before + 1
    assert len(_runs_of(running, "test_elicitation")) == runs_before + 1
    run_id = running.last_run_of("test_elicitation")
    request, answer = _client_request_events(running, run_id)
    assert request.payload["forwarded"] and request.payload["params"]["message"] == (
        "Who, statelessly?"
    )
    assert answer.payload["action"] == "accept"
    assert answer.payload["content"] == {"username": "ada", "email": "a@b"}
    assert not any(event.type.startswith("approval") for event in running.run_events(run_id))


async def _suspended(client: Client, tool: str, arguments: dict[str, Any]) -> Any:
    """The input-required result a stateless host's call gets, left unanswered."""
    result = await client.session.call_tool(tool, arguments, allow_input_required=True)
    assert isinstance(result, types.InputRequiredResult), result
    assert result.request_state and result.input_requests
    return result


async def _retry(
    client: Client,
    tool: str,
    arguments: dict[str, Any],
    responses: dict[str, Any],
    state: str | None = None,
) -> Any:
    """A stateless host's retry of a call with its answers (and the proxy's state)."""
    extra: dict[str, Any] = {} if state is None else {"request_state": state}
    return await client.session.call_tool(
        tool, arguments, input_responses=responses, allow_input_required=True, **extra
    )


async def _accept(context: Any, params: Any) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"username": "ada", "email": "a@b"})


async def test_a_retry_with_an_unknown_or_no_state_is_refused_and_runs_nothing(
    running: Running,
) -> None:
    calls_before = running.upstream_lines().count("tools/call test_simple_text")
    events_before = len(running.events())
    async with stateless_host(running.url, elicitation_callback=_accept) as client:
        forged = await _retry(
            client,
            "test_simple_text",
            {},
            {"elicitation-1": types.ElicitResult(action="accept", content={})},
            "a-state-this-proxy-never-issued",
        )
        stateless_answers = await _retry(
            client,
            "test_simple_text",
            {},
            {"elicitation-1": types.ElicitResult(action="accept", content={})},
        )
        served = await client.call_tool("test_simple_text", {})
    assert isinstance(forged, types.CallToolResult) and forged.is_error
    assert "unknown or has expired" in text_of(forged)
    assert isinstance(stateless_answers, types.CallToolResult) and stateless_answers.is_error
    assert "without the requestState" in text_of(stateless_answers)
    # Only the honest neighbour ran, and only its run was written.
    assert running.upstream_lines().count("tools/call test_simple_text") == calls_before + 1
    assert not served.is_error
    new_runs = {event.run_id for event in running.events()[events_before:]}
    assert new_runs == {running.last_run_of("test_simple_text")}


async def test_a_state_offered_with_another_call_or_without_its_answer_is_refused_and_kept(
    running: Running,
) -> None:
    async with stateless_host(running.url, elicitation_callback=_accept) as client:
        question = await _suspended(client, "test_elicitation", {"message": "Whose state?"})
        (key,) = question.input_requests
        assert question.input_requests[key].params.message == "Whose state?"
        run_id = running.last_run_of("test_elicitation")
        simple_before = running.upstream_lines().count("tools/call test_simple_text")
        answer = types.ElicitResult(action="accept", content={"username": "eve", "email": "e@v"})
        foreign = await _retry(
            client, "test_simple_text", {}, {key: answer}, question.request_state
        )
        other_arguments = await _retry(
            client,
            "test_elicitation",
            {"message": "Someone else's"},
            {key: answer},
            question.request_state,
        )
        unanswered = await _retry(
            client, "test_elicitation", {"message": "Whose state?"}, {}, question.request_state
        )
        assert running.upstream_lines().count("tools/call test_simple_text") == simple_before
        # Nothing reached the suspended call: its run holds only the server's request.
        assert [e.type for e in _client_request_events(running, run_id)] == ["client_request"]
        # The state still resumes its own call, once.
        answered = await _retry(
            client,
            "test_elicitation",
            {"message": "Whose state?"},
            {key: answer},
            question.request_state,
        )
        replayed = await _retry(
            client,
            "test_elicitation",
            {"message": "Whose state?"},
            {key: answer},
            question.request_state,
        )
    for refused in (foreign, other_arguments):
        assert isinstance(refused, types.CallToolResult) and refused.is_error
        assert "issued for another call" in text_of(refused)
    assert isinstance(unanswered, types.CallToolResult) and unanswered.is_error
    assert f"no answer to the input request '{key}'" in text_of(unanswered)
    assert isinstance(answered, types.CallToolResult) and not answered.is_error
    assert "eve" in text_of(answered)
    assert isinstance(replayed, types.CallToolResult) and replayed.is_error
    assert "unknown or has expired" in text_of(replayed)
    request, answered_event = _client_request_events(running, run_id)
    assert request.payload["forwarded"] is True
    assert answered_event.payload["content"] == {"username": "eve", "email": "e@v"}
    assert running.last_run_of("test_elicitation") == run_id


async def test_a_suspended_call_that_times_out_expires_its_state(running: Running) -> None:
    async with stateless_host(running.url, elicitation_callback=_accept) as client:
        question = await _suspended(client, "test_elicitation_sep1330_enums", {})
        (key,) = question.input_requests
        run_id = running.last_run_of("test_elicitation_sep1330_enums")
        # Past the tool's 2 s bound: the upstream call ended without the host's answer.
        with anyio.fail_after(20):
            while not any(e.type == "client_request_answered" for e in running.run_events(run_id)):
                await anyio.sleep(0.1)
        late = await _retry(
            client,
            "test_elicitation_sep1330_enums",
            {},
            {key: types.ElicitResult(action="accept", content={})},
            question.request_state,
        )
    assert isinstance(late, types.CallToolResult) and late.is_error
    assert "unknown or has expired" in text_of(late)
    request, unanswered = _client_request_events(running, run_id)
    assert request.payload["forwarded"] is True
    assert unanswered.payload["error"] == "the call ended unanswered"
    assert running.upstream_lines().count("tools/call test_elicitation_sep1330_enums") == 1


async def test_a_stateless_host_is_never_handed_what_the_rule_refuses(running: Running) -> None:
    asked: list[Any] = []

    async def on_elicit(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params)
        return types.ElicitResult(action="accept", content={})

    async def on_roots(context: Any) -> types.ListRootsResult:
        asked.append("roots")
        return types.ListRootsResult(roots=[])

    async with stateless_host(
        running.url, elicitation_callback=on_elicit, list_roots_callback=on_roots
    ) as client:
        url_mode = await client.call_tool("test_elicitation_url", {})
        roots = await client.call_tool("test_roots", {})
    async with stateless_host(running.url) as without_capability:
        uncapable = await without_capability.call_tool("test_elicitation", {"message": "Hm?"})
    assert asked == []
    assert url_mode.is_error and "URL-mode elicitation" in text_of(url_mode)
    assert roots.is_error and "refuses roots requests" in text_of(roots)
    assert uncapable.is_error and "did not advertise the elicitation capability" in text_of(
        uncapable
    )


# -- a server that asks in its result (the 2026-07-28 revision's way) ----------


async def test_a_servers_input_required_result_is_answered_by_a_2025_host(
    running: Running,
) -> None:
    asked: list[str] = []

    async def on_elicit(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"username": "ada"})

    before = len(running.asking_lines())
    async with host(running.url, elicitation_callback=on_elicit) as session:
        result = await session.call_tool("ask_name", {})
    assert asked == ["What is your name?"]
    assert not result.is_error and text_of(result) == "Hello, ada (accept)"
    # One gate run; the server saw its call and the retry carrying the answer and its state.
    assert running.asking_lines()[before:] == [
        "tools/call ask_name first",
        "tools/call ask_name answered",
    ]
    request, answer = _client_request_events(running, running.last_run_of("ask_name"))
    assert request.payload["server"] == "asking" and request.payload["forwarded"]
    assert answer.payload["content"] == {"username": "ada"}


async def test_a_servers_input_required_result_reaches_a_stateless_host_as_its_own(
    running: Running,
) -> None:
    asked: list[str] = []

    async def on_elicit(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"username": "grace"})

    before = len(running.asking_lines())
    runs_before = len(_runs_of(running, "ask_name"))
    async with stateless_host(running.url, elicitation_callback=on_elicit) as client:
        result = await client.call_tool("ask_name", {})
    assert asked == ["What is your name?"]
    assert not result.is_error and text_of(result) == "Hello, grace (accept)"
    assert running.asking_lines()[before:] == [
        "tools/call ask_name first",
        "tools/call ask_name answered",
    ]
    assert len(_runs_of(running, "ask_name")) == runs_before + 1
    request, answer = _client_request_events(running, running.last_run_of("ask_name"))
    assert request.payload["params"]["message"] == "What is your name?"
    assert answer.payload["content"] == {"username": "grace"}


async def test_a_servers_input_required_result_no_host_can_answer_stays_a_tool_error(
    running: Running,
) -> None:
    before = len(running.asking_lines())
    async with host(running.url) as session:
        result = await session.call_tool("ask_name", {})
        served = await session.call_tool("test_simple_text", {})
    assert result.is_error
    assert "asked for more input, which was refused or never given" in text_of(result)
    # Not retried: the server saw the one call.
    assert running.asking_lines()[before:] == ["tools/call ask_name first"]
    (request,) = _client_request_events(running, running.last_run_of("ask_name"))
    assert "did not advertise the elicitation capability" in request.payload["reason"]
    assert not served.is_error


async def test_a_sampling_request_for_all_servers_context_is_sent_asking_for_none(
    running: Running,
) -> None:
    # Deprecated (SEP-2596); behind the proxy the host would attach every server's context.
    received: list[Any] = []

    async def on_sample(context: Any, params: Any) -> types.CreateMessageResult:
        received.append(params.include_context)
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="ok"), model="m"
        )

    async with host(running.url, sampling_callback=on_sample) as session:
        wide = await session.call_tool("test_sampling", {"prompt": "context:allServers"})
        own = await session.call_tool("test_sampling", {"prompt": "context:thisServer"})
    assert "ok" in text_of(wide) and "ok" in text_of(own)
    assert received == ["none", "none"]
    request, _ = _client_request_events(running, running.last_run_of("test_sampling"))
    assert request.payload["include_context_asked"] == "thisServer"
    assert request.payload["params"]["includeContext"] == "none"
