"""A stdio MCP server that asks in its result, as the 2026-07-28 revision does.

Its one tool, `ask_name`, answers a first `tools/call` with an
input-required result (an elicitation keyed `who`, and a request state);
retried with `inputResponses.who` and that state it greets the name given.
Any other state gets an error result.  With $INPUT_REQUIRED_LOG set, each
`tools/call` it receives is noted there (its name and whether it carried
answers), so a test sees how many rounds reached it.  With $INPUT_REQUIRED_MODERN set
it also answers `server/discover` naming 2026-07-28, and a `tools/call` without the
revision's `_meta` envelope (its protocol version) gets an error result.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

STATE = "server-state-7"


def _note(line: str) -> None:
    path = os.environ.get("INPUT_REQUIRED_LOG")
    if path:
        with open(path, "a") as log:
            log.write(line + "\n")


def _call(params: dict[str, Any]) -> dict[str, Any]:
    responses = params.get("inputResponses")
    _note(f"tools/call {params.get('name')} {'answered' if responses else 'first'}")
    if not responses:
        return {
            "resultType": "input_required",
            "inputRequests": {
                "who": {
                    "method": "elicitation/create",
                    "params": {
                        "message": "What is your name?",
                        "requestedSchema": {
                            "type": "object",
                            "properties": {"username": {"type": "string"}},
                        },
                    },
                }
            },
            "requestState": STATE,
        }
    if params.get("requestState") != STATE:
        return {"content": [{"type": "text", "text": "bad state"}], "isError": True}
    answer = responses.get("who") or {}
    name = (answer.get("content") or {}).get("username")
    return {"content": [{"type": "text", "text": f"Hello, {name} ({answer.get('action')})"}]}


def _answer(message: dict[str, Any]) -> dict[str, Any] | None:
    method = message.get("method")
    if "id" not in message:
        return None
    if method == "initialize":
        result: Any = {
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "input-required", "version": "1"},
        }
    elif method == "tools/list":
        result = {
            "tools": [
                {
                    "name": "ask_name",
                    "description": "Greets you, once it knows your name.",
                    "inputSchema": {"type": "object", "properties": {}},
                }
            ]
        }
    elif method == "server/discover" and os.environ.get("INPUT_REQUIRED_MODERN"):
        result = {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}}
    elif method == "tools/call":
        params = message.get("params") or {}
        version = (params.get("_meta") or {}).get("io.modelcontextprotocol/protocolVersion")
        if os.environ.get("INPUT_REQUIRED_MODERN") and version != "2026-07-28":
            result = {"content": [{"type": "text", "text": "no envelope"}], "isError": True}
        else:
            result = _call(params)
    elif method == "ping":
        result = {}
    else:
        return {"jsonrpc": "2.0", "id": message["id"],
                "error": {"code": -32601, "message": "Method not found"}}  # fmt: skip
    return {"jsonrpc": "2.0", "id": message["id"], "result": result}


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        if "method" not in message:
            continue  # an answer to a request this server never sends
        reply = _answer(message)
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
