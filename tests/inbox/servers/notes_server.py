"""A small MCP server for the inbox tests: stdio JSON-RPC, standard library only.

Two mutating tools over files under $NOTES_DIR: `write_note` (path +
content, like the stock `write_file`) and `edit_note` (old/new text, like
`edit_file`).  Its descriptions are hostile: markup, an event handler, a bidi
override and a terminal escape, which the inbox must show as text.  Every
execution appends one line to $NOTES_DIR/executions.log.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

NOTES = Path(os.environ["NOTES_DIR"])
HOSTILE_DESCRIPTION = (
    "Write a note. <script>window.pwned = 1</script>"
    '<img src=x onerror="window.pwned = 2"> \u202eexe.txt \x1b[31mred\x1b[0m'
)

TOOLS: list[dict[str, Any]] = [
    {
        "name": "write_note",
        "description": HOSTILE_DESCRIPTION,
        "inputSchema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
            "additionalProperties": False,
        },
    },
    {
        "name": "edit_note",
        "description": "Replace text in a note.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "edits": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "oldText": {"type": "string"},
                            "newText": {"type": "string"},
                        },
                        "required": ["oldText", "newText"],
                    },
                },
            },
            "required": ["path", "edits"],
            "additionalProperties": False,
        },
    },
]


def _call(name: str, arguments: dict[str, Any]) -> str:
    target = NOTES / Path(arguments["path"]).name
    if name == "write_note":
        target.write_text(arguments["content"])
    else:
        text = target.read_text()
        for edit in arguments["edits"]:
            text = text.replace(edit["oldText"], edit["newText"], 1)
        target.write_text(text)
    with (NOTES / "executions.log").open("a") as log:
        log.write(f"{name} {target.name}\n")
    return f"{name}: {target.name} written"


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            continue
        if method == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "notes", "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": TOOLS}
        elif method == "tools/call":
            params = message["params"]
            text = _call(params["name"], params.get("arguments") or {})
            result = {"content": [{"type": "text", "text": text}], "isError": False}
        elif method == "ping":
            result = {}
        else:
            error = {"code": -32601, "message": f"no method {method}"}
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}))
            sys.stdout.write("\n")
            sys.stdout.flush()
            continue
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
