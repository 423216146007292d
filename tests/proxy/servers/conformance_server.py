"""A server written for the official MCP conformance suite's server scenarios.

It offers the tools, prompts and resources the suite's scenarios name
(`test_simple_text`, `test_prompt_with_arguments`, `test://static-text`, ...),
with the SDK's low-level server, so the suite can be run against it directly
and through `agentrt proxy`, and the proxy tests use it as a real upstream
for prompts, resources, completion, logging, sampling and elicitation.

Run: `python conformance_server.py` serves stdio; `--http` binds a free port
on 127.0.0.1, prints it on stdout and serves `/mcp` until killed.  With
$CONFORMANCE_LOG set, each prompts/get, resources/read, subscribe and
unsubscribe appends one line to that file, so a test sees what arrived.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server

# A 1x1 red PNG and a tiny WAV header, as the scenarios ask for "a minimal test image/audio".
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8"
    "z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
WAV = "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQAAAAA="
_EMPTY: dict[str, Any] = {"type": "object", "properties": {}}


def _note(line: str) -> None:
    path = os.environ.get("CONFORMANCE_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(line + "\n")


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


_TOOLS = [
    types.Tool(name="test_simple_text", description="Returns simple text.", input_schema=_EMPTY),
    types.Tool(name="test_image_content", description="Returns an image.", input_schema=_EMPTY),
    types.Tool(name="test_audio_content", description="Returns audio.", input_schema=_EMPTY),
    types.Tool(
        name="test_embedded_resource", description="Returns a resource.", input_schema=_EMPTY
    ),
    types.Tool(
        name="test_multiple_content_types",
        description="Returns mixed content.",
        input_schema=_EMPTY,
    ),
    types.Tool(
        name="test_tool_with_logging", description="Logs while it runs.", input_schema=_EMPTY
    ),
    types.Tool(
        name="test_tool_with_progress", description="Reports progress.", input_schema=_EMPTY
    ),
    types.Tool(name="test_error_handling", description="Always fails.", input_schema=_EMPTY),
    types.Tool(
        name="test_sampling",
        description="Asks the client for a model completion.",
        input_schema={
            "type": "object",
            "properties": {"prompt": {"type": "string"}},
            "required": ["prompt"],
        },
    ),
    types.Tool(
        name="test_elicitation",
        description="Asks the user for input.",
        input_schema={
            "type": "object",
            "properties": {"message": {"type": "string"}},
            "required": ["message"],
        },
    ),
    types.Tool(
        name="test_elicitation_sep1034_defaults",
        description="Asks the user with defaults.",
        input_schema=_EMPTY,
    ),
    types.Tool(
        name="test_elicitation_sep1330_enums",
        description="Asks the user with enums.",
        input_schema=_EMPTY,
    ),
    types.Tool(
        name="test_elicitation_url",
        description="Asks the user to visit a URL.",
        input_schema=_EMPTY,
    ),
    types.Tool(
        name="test_roots", description="Asks the client for its roots.", input_schema=_EMPTY
    ),
    types.Tool(
        name="test_elicitation_later",
        description="Waits, then asks the user for input (not a suite scenario).",
        input_schema={
            "type": "object",
            "properties": {"seconds": {"type": "number"}, "ask": {"type": "boolean"}},
        },
    ),
    types.Tool(
        name="json_schema_2020_12_tool",
        description="Tool with JSON Schema 2020-12 features",
        input_schema={
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "$defs": {
                "address": {
                    "type": "object",
                    "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
                }
            },
            "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
            "additionalProperties": False,
        },
    ),
    types.Tool(
        name="test_reconnection", description="Closes its stream mid-call.", input_schema=_EMPTY
    ),
]

_SEP1034: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "default": "John Doe"},
        "age": {"type": "integer", "default": 30},
        "score": {"type": "number", "default": 95.5},
        "status": {
            "type": "string",
            "enum": ["active", "inactive", "pending"],
            "default": "active",
        },
        "verified": {"type": "boolean", "default": True},
    },
}
_SEP1330: dict[str, Any] = {
    "type": "object",
    "properties": {
        "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
        "titledSingle": {
            "type": "string",
            "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"},
            ],
        },
        "legacyEnum": {
            "type": "string",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {
            "type": "array",
            "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
        },
        "titledMulti": {
            "type": "array",
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                    {"const": "value3", "title": "Third Choice"},
                ]
            },
        },
    },
}


async def _ask(ctx: Any, method: str, params: dict[str, Any]) -> dict[str, Any]:
    # Raw, on this call's own channel: the suite checks fields the typed models would drop.
    return await ctx.session._request_outbound.send_raw_request(method, params, None)


async def _list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=_TOOLS)


async def _call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    arguments = params.arguments or {}
    name = params.name
    _note(f"tools/call {name}")
    if name == "test_simple_text":
        return types.CallToolResult(content=[_text("This is a simple text response for testing.")])
    if name == "test_image_content":
        return types.CallToolResult(
            content=[types.ImageContent(type="image", data=PNG, mime_type="image/png")]
        )
    if name == "test_audio_content":
        return types.CallToolResult(
            content=[types.AudioContent(type="audio", data=WAV, mime_type="audio/wav")]
        )
    if name == "test_embedded_resource":
        return types.CallToolResult(
            content=[_embedded("test://embedded-resource", "This is an embedded resource content.")]
        )
    if name == "test_multiple_content_types":
        return types.CallToolResult(
            content=[
                _text("Multiple content types test:"),
                types.ImageContent(type="image", data=PNG, mime_type="image/png"),
                _embedded(
                    "test://mixed-content-resource",
                    '{"test":"data","value":123}',
                    "application/json",
                ),
            ]
        )
    if name == "test_tool_with_logging":
        for message in (
            "Tool execution started",
            "Tool processing data",
            "Tool execution completed",
        ):
            await ctx.session.send_log_message(
                "info", message, logger="conformance", related_request_id=ctx.request_id
            )
            await anyio.sleep(0.05)
        return types.CallToolResult(content=[_text("Tool with logging executed successfully")])
    if name == "test_tool_with_progress":
        for value in (0, 50, 100):
            await ctx.session.report_progress(value, 100, f"step {value}")
            await anyio.sleep(0.05)
        return types.CallToolResult(content=[_text("Tool with progress executed successfully")])
    if name == "test_error_handling":
        return types.CallToolResult(
            content=[_text("This tool intentionally returns an error for testing")], is_error=True
        )
    try:
        if name == "test_sampling":
            answer = await _ask(
                ctx,
                "sampling/createMessage",
                {
                    "messages": [
                        {
                            "role": "user",
                            "content": {"type": "text", "text": str(arguments.get("prompt"))},
                        }
                    ],
                    "maxTokens": 100,
                    # "context:allServers" asks for a deprecated includeContext value.
                    **(
                        {"includeContext": str(arguments["prompt"])[len("context:") :]}
                        if str(arguments.get("prompt")).startswith("context:")
                        else {}
                    ),
                },
            )
            content = answer.get("content") or {}
            return types.CallToolResult(content=[_text(f"LLM response: {content.get('text')}")])
        if name in ("test_elicitation", "test_elicitation_sep1034_defaults"):
            schema = (
                _SEP1034
                if name.endswith("defaults")
                else {
                    "type": "object",
                    "properties": {
                        "username": {"type": "string", "description": "User's response"},
                        "email": {"type": "string", "description": "User's email address"},
                    },
                    "required": ["username", "email"],
                }
            )
            message = str(arguments.get("message", "Please review the defaults"))
            answer = await _ask(
                ctx, "elicitation/create", {"message": message, "requestedSchema": schema}
            )
            return types.CallToolResult(content=[_text(f"User response: {json.dumps(answer)}")])
        if name == "test_elicitation_sep1330_enums":
            answer = await _ask(
                ctx, "elicitation/create", {"message": "Pick", "requestedSchema": _SEP1330}
            )
            return types.CallToolResult(
                content=[_text(f"Elicitation completed: {json.dumps(answer)}")]
            )
        if name == "test_elicitation_url":
            answer = await _ask(
                ctx,
                "elicitation/create",
                {
                    "mode": "url",
                    "message": "Sign in, please",
                    "url": "https://example.com/sign-in",
                    "elicitationId": "e-1",
                },
            )
            return types.CallToolResult(content=[_text(f"URL elicitation: {json.dumps(answer)}")])
        if name == "test_elicitation_later":
            await anyio.sleep(float(arguments.get("seconds", 1)))
            if arguments.get("ask") is False:
                return types.CallToolResult(content=[_text("Later: asked nothing")])
            answer = await _ask(
                ctx,
                "elicitation/create",
                {
                    "message": "Still there?",
                    "requestedSchema": {"type": "object", "properties": {}},
                },
            )
            return types.CallToolResult(content=[_text(f"Later: {json.dumps(answer)}")])
        if name == "test_roots":
            answer = await _ask(ctx, "roots/list", {})
            return types.CallToolResult(content=[_text(f"Roots: {json.dumps(answer)}")])
    except Exception as exc:  # the client refused: said in the result, as the scenarios ask
        return types.CallToolResult(content=[_text(f"refused: {exc}")], is_error=True)
    if name == "json_schema_2020_12_tool":
        return types.CallToolResult(content=[_text(f"got {json.dumps(arguments)}")])
    if name == "test_reconnection":
        if ctx.close_sse_stream is not None:
            await ctx.close_sse_stream()
        await anyio.sleep(0.2)
        return types.CallToolResult(content=[_text("Reconnection test completed")])
    return types.CallToolResult(content=[_text(f"unknown tool {name}")], is_error=True)


def _embedded(uri: str, text: str, mime_type: str = "text/plain") -> types.EmbeddedResource:
    return types.EmbeddedResource(
        type="resource",
        resource=types.TextResourceContents(uri=uri, mime_type=mime_type, text=text),
    )


_PROMPTS = [
    types.Prompt(name="test_simple_prompt", description="A simple prompt without arguments"),
    types.Prompt(
        name="test_prompt_with_arguments",
        description="A prompt with arguments",
        arguments=[
            types.PromptArgument(name="arg1", description="First test argument", required=True),
            types.PromptArgument(name="arg2", description="Second test argument", required=True),
        ],
    ),
    types.Prompt(
        name="test_prompt_with_embedded_resource",
        description="A prompt with an embedded resource",
        arguments=[
            types.PromptArgument(name="resourceUri", description="URI to embed", required=True)
        ],
    ),
    types.Prompt(name="test_prompt_with_image", description="A prompt with an image"),
]


async def _list_prompts(ctx: Any, params: Any) -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=_PROMPTS)


async def _get_prompt(ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
    arguments = params.arguments or {}
    _note(f"prompts/get {params.name} {json.dumps(arguments, sort_keys=True)}")
    if params.name == "test_simple_prompt":
        messages = [
            types.PromptMessage(role="user", content=_text("This is a simple prompt for testing."))
        ]
    elif params.name == "test_prompt_with_arguments":
        text = (
            f"Prompt with arguments: arg1='{arguments.get('arg1')}', arg2='{arguments.get('arg2')}'"
        )
        messages = [types.PromptMessage(role="user", content=_text(text))]
    elif params.name == "test_prompt_with_embedded_resource":
        uri = str(arguments.get("resourceUri", "test://example-resource"))
        messages = [
            types.PromptMessage(
                role="user", content=_embedded(uri, "Embedded resource content for testing.")
            ),
            types.PromptMessage(
                role="user", content=_text("Please process the embedded resource above.")
            ),
        ]
    elif params.name == "test_prompt_with_image":
        messages = [
            types.PromptMessage(
                role="user",
                content=types.ImageContent(type="image", data=PNG, mime_type="image/png"),
            ),
            types.PromptMessage(role="user", content=_text("Please analyze the image above.")),
        ]
    else:
        raise ValueError(f"no prompt {params.name}")
    return types.GetPromptResult(messages=messages)


_RESOURCES = [
    types.Resource(
        uri="test://static-text",
        name="static-text",
        description="A static text resource",
        mime_type="text/plain",
    ),
    types.Resource(
        uri="test://static-binary",
        name="static-binary",
        description="A static binary resource",
        mime_type="image/png",
    ),
    types.Resource(
        uri="test://watched-resource",
        name="watched-resource",
        description="A resource to subscribe to",
        mime_type="text/plain",
    ),
    types.Resource(
        uri="test://secret-resource",
        name="secret-resource",
        description="A resource an operator may deny",
        mime_type="text/plain",
    ),
    types.Resource(
        uri="test://large-resource",
        name="large-resource",
        description="A resource larger than a small max_result_bytes",
        mime_type="text/plain",
    ),
]


async def _list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=_RESOURCES)


async def _list_templates(ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
    return types.ListResourceTemplatesResult(
        resource_templates=[
            types.ResourceTemplate(
                uri_template="test://template/{id}/data",
                name="template",
                description="A resource template with an id",
                mime_type="application/json",
            )
        ]
    )


async def _read_resource(
    ctx: Any, params: types.ReadResourceRequestParams
) -> types.ReadResourceResult:
    uri = str(params.uri)
    _note(f"resources/read {uri}")
    contents: list[types.TextResourceContents | types.BlobResourceContents]
    if uri == "test://static-binary":
        contents = [types.BlobResourceContents(uri=uri, mime_type="image/png", blob=PNG)]
    elif uri.startswith("test://template/") and uri.endswith("/data"):
        item = uri.removeprefix("test://template/").removesuffix("/data")
        text = json.dumps({"id": item, "templateTest": True, "data": f"Data for ID: {item}"})
        contents = [types.TextResourceContents(uri=uri, mime_type="application/json", text=text)]
    elif uri == "test://large-resource":
        contents = [types.TextResourceContents(uri=uri, mime_type="text/plain", text="x" * 4096)]
    else:
        text = {
            "test://static-text": "This is the content of the static text resource.",
            "test://watched-resource": "Watched content.",
            "test://secret-resource": "The secret.",
        }.get(uri)
        if text is None:
            raise ValueError(f"no resource {uri}")
        contents = [types.TextResourceContents(uri=uri, mime_type="text/plain", text=text)]
    return types.ReadResourceResult(contents=contents)


async def _subscribe(ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
    _note(f"resources/subscribe {params.uri}")
    # Told at once, on this request's stream, so a client sees an update arrive.
    await ctx.session.send_notification(
        types.ResourceUpdatedNotification(
            params=types.ResourceUpdatedNotificationParams(uri=str(params.uri))
        ),
        related_request_id=ctx.request_id,
    )
    return types.EmptyResult()


async def _unsubscribe(ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    _note(f"resources/unsubscribe {params.uri}")
    return types.EmptyResult()


async def _complete(ctx: Any, params: types.CompleteRequestParams) -> types.CompleteResult:
    value = params.argument.value
    values = [word for word in ("paris", "park", "party") if word.startswith(value)]
    return types.CompleteResult(
        completion=types.Completion(values=values, total=len(values), has_more=False)
    )


async def _set_level(ctx: Any, params: types.SetLevelRequestParams) -> types.EmptyResult:
    _note(f"logging/setLevel {params.level}")
    return types.EmptyResult()


def build() -> Server[Any]:
    return Server(
        "conformance-server",
        version="1.0.0",
        on_list_tools=_list_tools,
        on_call_tool=_call_tool,
        on_list_prompts=_list_prompts,
        on_get_prompt=_get_prompt,
        on_list_resources=_list_resources,
        on_list_resource_templates=_list_templates,
        on_read_resource=_read_resource,
        on_subscribe_resource=_subscribe,
        on_unsubscribe_resource=_unsubscribe,
        on_completion=_complete,
        on_set_logging_level=_set_level,
    )


async def _stdio() -> None:
    from mcp.server.stdio import stdio_server

    server = build()
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def _http() -> None:
    import uvicorn

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    print(port, flush=True)
    app = build().streamable_http_app()
    config = uvicorn.Config(app, log_level="warning")
    uvicorn.Server(config).run(sockets=[listener])


if __name__ == "__main__":
    if "--http" in sys.argv:
        _http()
    else:
        anyio.run(_stdio)
