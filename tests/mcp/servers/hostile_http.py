"""A scriptable, possibly hostile streamable HTTP MCP server on 127.0.0.1.

Run: python hostile_http.py SCENARIO (JSON text or a path); it prints its port
and serves until killed.  Any path serves MCP.  Members, all optional:

- "log": path; one JSON line per HTTP request: method, path, lowercased
  headers, body text.
- "mode": "json" (default) or "sse": how answers to requests are sent.
- "redirect": a path; every POST to "/mcp" gets 307 to that path here.
- "oversize": a method or tool name; its answer is a 17 MiB body ("declared": true adds a
  Content-Length header saying so).
- "pages": {cursor: raw result text} for tools/list ("" is the first page).
- "methods": {method: raw result text} for any other method (default "{}").
- "calls": {tool: spec}; spec "result": raw result text, "elicit": true
  (SSE only: ask the client for input mid-call, wait for its answer, then
  answer with text naming the answer's error code), "before": raw data lines
  sent as SSE events first ("{id}" becomes the request id), "before_raw":
  raw SSE text sent first (same substitution),
  "end_without_answer": true (SSE only: end the stream with no answer),
  "cut_midway": true (SSE only: declare a longer body, send half an event, drop the
  connection: a stream that breaks rather than ends),
  "never": true (never answer).
- "on_get": what a GET (a resumption) gets: "answer" (an event stream carrying an
  event id and the answer to the last call whose stream ended without one; the
  Last-Event-ID it was sent is logged), "empty" (an event stream that ends at once),
  "numbered" (an event stream with `retry: 100` and one `tools/list_changed` whose
  event id is "e" and how many GETs came before it, then its end), or anything else: 405.
- "capabilities": the capabilities `initialize` answers (default {"tools": {}}).
- "http_error": {tool or method: {"status", "body", "content_type"}}: answer
  that request with this HTTP status and body ("{id}" becomes the id).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SESSION_ID = "session-7f3a"
OVERSIZE = 17 * 1024 * 1024

_scenario: dict[str, Any] = {}
_log_lock = threading.Lock()
_answers: dict[str, Any] = {}
_answer_ready = threading.Condition()
_unanswered: list[Any] = []  # ids of calls whose stream ended without their answer
_gets: list[int] = []  # one per "numbered" GET served


def _default_tools() -> str:
    return json.dumps({"tools": [{"name": "ok", "inputSchema": {"type": "object"}}]})


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _log(self, body: str) -> None:
        if "log" not in _scenario:
            return
        entry = {
            "method": self.command,
            "path": self.path,
            "headers": {name.lower(): value for name, value in self.headers.items()},
            "body": body,
        }
        with _log_lock, open(_scenario["log"], "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")

    def _send(self, status: int, body: bytes, content_type: str, extra: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        for name, value in extra.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._log("")
        behaviour = _scenario.get("on_get")
        if behaviour not in ("answer", "empty", "numbered"):
            self._send(405, b"", "text/plain", {})
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        if behaviour == "answer" and _unanswered:
            request_id = _unanswered.pop()
            result = {"content": [{"type": "text", "text": "recovered"}]}
            line = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result})
            self.wfile.write(f"id: e2\ndata: {line}\n\n".encode())
        if behaviour == "numbered":
            _gets.append(1)
            line = json.dumps({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
            self.wfile.write(f"retry: 100\nid: e{len(_gets)}\ndata: {line}\n\n".encode())
        self.wfile.flush()
        self.close_connection = True

    def do_DELETE(self) -> None:
        self._log("")
        self._send(200, b"", "text/plain", {})

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length).decode("utf-8")
        self._log(body)
        if self.path == "/mcp" and "redirect" in _scenario:
            port = self.server.server_address[1]
            location = f"http://127.0.0.1:{port}{_scenario['redirect']}"
            self._send(307, b"", "text/plain", {"location": location})
            return
        message = json.loads(body)
        if "method" not in message:
            with _answer_ready:
                _answers[str(message.get("id"))] = message
                _answer_ready.notify_all()
            self._send(202, b"", "text/plain", {})
            return
        if "id" not in message:
            self._send(202, b"", "text/plain", {})
            return
        self._answer(message)

    def _answer(self, message: dict[str, Any]) -> None:
        method = message["method"]
        request_id = message["id"]
        params = message.get("params") or {}
        headers: dict[str, str] = {}
        spec: dict[str, Any] = {}
        if method == "initialize":
            result = json.dumps(
                {
                    "protocolVersion": params["protocolVersion"],
                    "capabilities": _scenario.get("capabilities", {"tools": {}}),
                    "serverInfo": {"name": "hostile-http", "version": "1"},
                }
            )
            headers["mcp-session-id"] = SESSION_ID
        elif method == "tools/list":
            pages = _scenario.get("pages", {"": _default_tools()})
            result = pages[params.get("cursor", "")]
        elif method == "tools/call":
            spec = _scenario.get("calls", {}).get(params["name"], {})
            default = {"content": [{"type": "text", "text": "ok"}]}
            result = spec.get("result", json.dumps(default))
        else:
            result = _scenario.get("methods", {}).get(method, "{}")
        failure = _scenario.get("http_error", {}).get(params.get("name") or method)
        if failure is not None:
            body = failure.get("body", "").replace("{id}", json.dumps(request_id))
            content_type = failure.get("content_type", "application/json")
            self._send(failure["status"], body.encode(), content_type, {})
            return
        if spec.get("never"):
            time.sleep(60)
            self.close_connection = True
            return
        if "oversize" in _scenario and _scenario["oversize"] in (method, params.get("name")):
            self._send_oversize(request_id)
            return
        line = f'{{"jsonrpc":"2.0","id":{json.dumps(request_id)},"result":{result}}}'
        if _scenario.get("mode", "json") == "json":
            self._send(200, line.encode(), "application/json", headers)
            return
        if spec.get("cut_midway"):
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", "100000")
            self.end_headers()
            for raw in spec.get("before_raw", []):
                self.wfile.write(raw.replace("{id}", json.dumps(request_id)).encode())
            self.wfile.write(b'data: {"jsonrpc":"2.0","id":')
            self.wfile.flush()
            _unanswered.append(request_id)
            self.close_connection = True
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(b": a comment the client skips\r\n\r\n")
        for before in spec.get("before", []):
            data = before.replace("{id}", json.dumps(request_id))
            self.wfile.write(f"event: message\ndata: {data}\n\n".encode())
        for raw in spec.get("before_raw", []):
            self.wfile.write(raw.replace("{id}", json.dumps(request_id)).encode())
        if spec.get("elicit"):
            self._elicit_then_answer(request_id)
            return
        if spec.get("end_without_answer"):
            _unanswered.append(request_id)
            self.close_connection = True
            return
        # One event over two data lines (joined by a newline, which JSON
        # allows between tokens), with CRLF line ends.
        first, _, rest = line.partition(',"result":')
        event = f'event: message\r\ndata: {first}\r\ndata: ,"result":{rest}\r\n\r\n'
        self.wfile.write(event.encode())
        self.wfile.flush()
        self.close_connection = True

    def _elicit_then_answer(self, request_id: Any) -> None:
        request = {
            "jsonrpc": "2.0",
            "id": "elicit-1",
            "method": "elicitation/create",
            "params": {"message": "Your password?", "requestedSchema": {"type": "object"}},
        }
        self.wfile.write(f"data: {json.dumps(request)}\n\n".encode())
        self.wfile.flush()
        with _answer_ready:
            _answer_ready.wait_for(lambda: "elicit-1" in _answers, timeout=10)
        code = _answers.get("elicit-1", {}).get("error", {}).get("code", "none")
        result = {"content": [{"type": "text", "text": f"elicitation answered with error {code}"}]}
        line = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result})
        self.wfile.write(f"data: {line}\n\n".encode())
        self.wfile.flush()
        self.close_connection = True

    def _send_oversize(self, request_id: Any) -> None:
        sse = _scenario.get("mode") == "sse"
        head = f'{{"jsonrpc":"2.0","id":{json.dumps(request_id)},"result":{{"content":'
        head = ("data: " if sse else "") + head + '[{"type":"text","text":"'
        tail = '"}]}}' + ("\n\n" if sse else "")
        filler = OVERSIZE - len(head) - len(tail) + 1
        self.send_response(200)
        self.send_header("content-type", "text/event-stream" if sse else "application/json")
        if _scenario.get("declared"):
            self.send_header("content-length", str(len(head) + filler + len(tail)))
        self.send_header("connection", "close")
        self.end_headers()
        try:
            self.wfile.write(head.encode())
            chunk = b"x" * 65536
            sent = 0
            while sent < filler:
                piece = chunk[: min(len(chunk), filler - sent)]
                self.wfile.write(piece)
                sent += len(piece)
            self.wfile.write(tail.encode())
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped reading at its cap, as it should
        self.close_connection = True


def main() -> None:
    global _scenario
    text = sys.argv[1] if len(sys.argv) > 1 else "{}"
    if not text.lstrip().startswith("{"):
        with open(text, encoding="utf-8") as handle:
            text = handle.read()
    _scenario = json.loads(text)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
