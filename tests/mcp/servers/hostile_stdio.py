"""A scriptable, possibly hostile MCP server on stdio (newline-delimited JSON-RPC).

Run: python hostile_stdio.py SCENARIO, where SCENARIO is a path to a JSON file
or the JSON text itself.  Every member is optional:

- "log": path; every line received is appended there, byte for byte.
- "pidfile": path; {"pid", "pgid", "ppid"} is written there at start.
- "stderr": text written to stderr at start; "exit_at_start": exit code,
  right after that text (a server that dies saying why).
- "stderr_flood": n; n bytes written to stderr at start (a server that
  would block on a full pipe if nobody drained it).
- "deaf_after_handshake": true; stop reading stdin once initialized.
- "flood_after_handshake": n; once initialized, write about n bytes of
  notifications before reading stdin again (a server that writes first).
- "ignore_sigterm": true; "ignore_eof": true (stay alive after stdin closes).
- "grandchild": path; a grandchild (a sleeping Python process in the same
  process group, stdio on /dev/null) is started and its pid written there.
- "initialize": a response spec for the handshake (default: a normal answer).
- "pages": {cursor: raw result text}; "" is the first page (no cursor).
  Default: one page listing the built-in tools.
- "pages_file": path; "pages" read from that JSON file at start, so a test
  can change what a restarted server lists.
- "exit_if_exists": path; exit at start (status 3, after a stderr line)
  while that file exists: a server that cannot be started again.
- "calls": {tool name: response spec}.  Built-in tools when not scripted:
  "env" (structuredContent: the environment as exec'd), "pid" (pid, pgid),
  "echo" (text: the raw request line), anything else: text "ok".
- "methods": {method: response spec} for any other method.

A response spec is an object with any of:
  "before": [raw lines sent first; "{id}" becomes the request id],
  "before_hex": [the same, as hex, for bytes that are not UTF-8],
  "sleep": seconds before answering,
  "sleep_first": seconds before answering, the first time this spec answers only,
  "elicit": true (send an elicitation/create request, wait for its answer,
            then answer the call with text naming the answer's error code),
  "exit": code (exit at once, after "stderr" text if given),
  "never": true (never answer),
  "flood_notifications": true (never answer: write
            {"jsonrpc":"2.0","method":"notifications/message"} lines in a
            tight loop forever, so the client always finds a line waiting),
  and one of "result": raw JSON text, "error": object, "line": a raw line
  ("{id}" becomes the request id, "{pad}" "pad" x characters), "text_of_size": n (a text result of n
  "x" characters, for results too large for a command line), with
  "id_last": true to write the id after the result, as the TypeScript SDK
  does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, NoReturn

_out_lock = threading.Lock()
_answers: dict[str, Any] = {}
_answer_ready = threading.Condition()
_FLOOD_LINE = b'{"jsonrpc":"2.0","method":"notifications/message"}\n'


def _write(line: bytes) -> None:
    with _out_lock:
        sys.stdout.buffer.write(line + b"\n")
        sys.stdout.buffer.flush()


def _flood_forever() -> NoReturn:
    # Whole blocks of lines per write: the pipe refills faster than a client parses it.
    block = _FLOOD_LINE * 1024
    try:
        while True:
            with _out_lock:
                sys.stdout.buffer.write(block)
                sys.stdout.buffer.flush()
    except OSError:
        os._exit(0)  # the client closed our stdout


def _load_scenario() -> dict[str, Any]:
    if len(sys.argv) < 2:
        return {}
    text = sys.argv[1]
    if not text.lstrip().startswith("{"):
        with open(text, encoding="utf-8") as handle:
            text = handle.read()
    scenario: dict[str, Any] = json.loads(text)
    return scenario


def _builtin_tools() -> str:
    tools = [
        {"name": name, "description": f"built-in {name}", "inputSchema": {"type": "object"}}
        for name in ("env", "pid", "echo", "ok")
    ]
    return json.dumps({"tools": tools})


def _respond(spec: dict[str, Any], request_id: Any, raw_line: bytes, default: str) -> None:
    id_text = json.dumps(request_id)
    for line in spec.get("before", []):
        _write(line.replace("{id}", id_text).encode())
    for hex_line in spec.get("before_hex", []):
        _write(bytes.fromhex(hex_line).replace(b"{id}", id_text.encode()))
    if "sleep" in spec:
        time.sleep(spec["sleep"])
    if "sleep_first" in spec:
        time.sleep(spec.pop("sleep_first"))
    if "exit" in spec:
        if "stderr" in spec:
            sys.stderr.write(spec["stderr"])
            sys.stderr.flush()
        os._exit(spec["exit"])
    if spec.get("flood_notifications"):
        _flood_forever()
    if spec.get("never"):
        return
    if spec.get("elicit"):
        _write(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": "elicit-1",
                    "method": "elicitation/create",
                    "params": {"message": "Your password?", "requestedSchema": {"type": "object"}},
                }
            ).encode()
        )
        with _answer_ready:
            _answer_ready.wait_for(lambda: "elicit-1" in _answers, timeout=10)
        answer = _answers.get("elicit-1", {})
        code = answer.get("error", {}).get("code", "none")
        text = f"elicitation answered with error {code}"
        result = json.dumps({"content": [{"type": "text", "text": text}]})
        _write(f'{{"jsonrpc":"2.0","id":{id_text},"result":{result}}}'.encode())
        return
    if "text_of_size" in spec:
        result = _text_result("x" * spec["text_of_size"])
        if spec.get("id_last"):
            _write(f'{{"result":{result},"jsonrpc":"2.0","id":{id_text}}}'.encode())
        else:
            _write(f'{{"jsonrpc":"2.0","id":{id_text},"result":{result}}}'.encode())
    elif "line" in spec:
        line = spec["line"].replace("{id}", id_text).replace("{pad}", "x" * spec.get("pad", 0))
        _write(line.encode())
    elif "error" in spec:
        _write(json.dumps({"jsonrpc": "2.0", "id": request_id, "error": spec["error"]}).encode())
    else:
        result = spec.get("result", default)
        _write(f'{{"jsonrpc":"2.0","id":{id_text},"result":{result}}}'.encode())


def _text_result(text: str, structured: Any = None) -> str:
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
    if structured is not None:
        result["structuredContent"] = structured
    return json.dumps(result)


def _exec_environment() -> dict[str, str]:
    # The environment exactly as exec'd: os.environ may hold variables the
    # interpreter set itself (PEP 538 locale coercion), which we never sent.
    with open("/proc/self/environ", "rb") as handle:
        entries = handle.read().split(b"\0")
    pairs = (entry.decode().partition("=") for entry in entries if entry)
    return {name: value for name, _, value in pairs}


def _handle(scenario: dict[str, Any], message: dict[str, Any], raw_line: bytes) -> None:
    method = message.get("method")
    request_id = message.get("id")
    params = message.get("params") or {}
    if method == "initialize":
        default = json.dumps(
            {
                "protocolVersion": params.get("protocolVersion", "2025-11-25"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile", "version": "1"},
            }
        )
        _respond(scenario.get("initialize", {}), request_id, raw_line, default)
    elif method == "tools/list":
        cursor = params.get("cursor", "")
        pages = scenario.get("pages", {"": _builtin_tools()})
        page = pages.get(cursor)
        if page is None:
            unknown = {"error": {"code": -32602, "message": "unknown cursor"}}
            _respond(unknown, request_id, raw_line, "")
        else:
            _respond({"result": page}, request_id, raw_line, page)
    elif method == "tools/call":
        name = params.get("name")
        spec = scenario.get("calls", {}).get(name)
        if spec is not None:
            threading.Thread(
                target=_respond, args=(spec, request_id, raw_line, _text_result("ok")), daemon=True
            ).start()
            return
        if name == "env":
            default = _text_result("env", _exec_environment())
        elif name == "pid":
            default = _text_result("pid", {"pid": os.getpid(), "pgid": os.getpgid(0)})
        elif name == "echo":
            default = _text_result(raw_line.decode("utf-8", errors="replace"))
        else:
            default = _text_result("ok")
        _respond({}, request_id, raw_line, default)
    elif method in scenario.get("methods", {}):
        _respond(scenario["methods"][method], request_id, raw_line, "{}")
    elif request_id is not None and method is not None:
        _respond(
            {"error": {"code": -32601, "message": f"unknown method {method}"}},
            request_id,
            raw_line,
            "",
        )


def main() -> None:
    scenario = _load_scenario()
    if "pidfile" in scenario:
        with open(scenario["pidfile"], "w", encoding="utf-8") as handle:
            json.dump({"pid": os.getpid(), "pgid": os.getpgid(0), "ppid": os.getppid()}, handle)
    if scenario.get("ignore_sigterm"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if "grandchild" in scenario:
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(300)"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        with open(scenario["grandchild"], "w", encoding="utf-8") as handle:
            handle.write(str(child.pid))
    if "stderr" in scenario:
        sys.stderr.write(scenario["stderr"])
        sys.stderr.flush()
    if "stderr_flood" in scenario:
        sys.stderr.write("e" * scenario["stderr_flood"] + "\nflood over\n")
        sys.stderr.flush()
    if "exit_at_start" in scenario:
        sys.exit(scenario["exit_at_start"])
    if "exit_if_exists" in scenario and os.path.exists(scenario["exit_if_exists"]):
        sys.stderr.write("refusing to start\n")
        sys.stderr.flush()
        sys.exit(3)
    if "pages_file" in scenario:
        with open(scenario["pages_file"], encoding="utf-8") as handle:
            scenario["pages"] = json.load(handle)
    log = open(scenario["log"], "ab", buffering=0) if "log" in scenario else None  # noqa: SIM115
    while True:
        raw_line = sys.stdin.buffer.readline()
        if not raw_line:
            break
        if log is not None:
            log.write(raw_line)
        try:
            message = json.loads(raw_line)
        except ValueError:
            continue
        if not isinstance(message, dict):
            continue
        if "method" not in message and "id" in message:
            with _answer_ready:
                _answers[str(message["id"])] = message
                _answer_ready.notify_all()
            continue
        _handle(scenario, message, raw_line.rstrip(b"\n"))
        initialized = message.get("method") == "notifications/initialized"
        if initialized and "flood_after_handshake" in scenario:
            # Write first, read later: blocks on a full stdout until the client reads.
            note = '{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"%s"}}'
            for _ in range(scenario["flood_after_handshake"] // 1000):
                _write((note % ("f" * 920)).encode())
        if initialized and scenario.get("deaf_after_handshake"):
            while True:  # never reads stdin again: the client's writes fill the pipe
                time.sleep(60)
    if scenario.get("ignore_eof"):
        while True:
            time.sleep(60)


if __name__ == "__main__":
    main()
