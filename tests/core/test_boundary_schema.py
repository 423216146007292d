"""Self-contained schemas: a server's schema can make the runtime read or fetch nothing.

The proofs here are real: a local HTTP server on 127.0.0.1 that records every
request, a real file holding a valid schema, a FIFO that would block any
reader, and recorders on `open`, `os.open`, `urlopen` and socket connects.  A
refused schema must leave all of them untouched.
"""

from __future__ import annotations

import builtins
import io
import os
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import agentrt.schema
from agentrt.canonical import parse_json
from agentrt.errors import SchemaError
from agentrt.schema import WELL_KNOWN_DRAFTS, check_self_contained, compile_schema

VALID_REMOTE_SCHEMA = b'{"type": "string"}'


class RecordingServer:
    """An HTTP server on 127.0.0.1 that serves a valid schema and records every hit."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        hits = self.hits

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "application/schema+json")
                self.send_header("Content-Length", str(len(VALID_REMOTE_SCHEMA)))
                self.end_headers()
                self.wfile.write(VALID_REMOTE_SCHEMA)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def recording_server() -> Iterator[RecordingServer]:
    server = RecordingServer()
    # The server answers: a fetch, had one happened, would have succeeded.
    with urllib.request.urlopen(server.url + "/probe", timeout=5) as response:
        assert response.read() == VALID_REMOTE_SCHEMA
    server.hits.clear()
    yield server
    server.close()


@pytest.fixture
def schema_files(tmp_path: Path) -> dict[str, Path]:
    """A real file with a valid schema, and a FIFO that would block whoever opens it."""
    real = tmp_path / "defs.json"
    real.write_bytes(b'{"$defs": {"name": {"type": "string"}}}')
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    return {"file": real, "fifo": fifo}


class AccessLog:
    def __init__(self) -> None:
        self.calls: list[str] = []


@pytest.fixture
def access_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[AccessLog]:
    """Record (and refuse) every file open, URL open and socket connect while active."""
    # Let jsonschema and referencing finish their lazy imports first, so the
    # recorder sees only what the schema under test causes.
    compile_schema({"$defs": {"a": {"type": "string"}}, "$ref": "#/$defs/a"}).first_error("x")
    log = AccessLog()

    def recorder(name: str) -> Callable[..., Any]:
        def record(*args: Any, **kwargs: Any) -> Any:
            log.calls.append(f"{name}{args!r}")
            raise PermissionError(f"{name} is not allowed in this test")

        return record

    with monkeypatch.context() as patch:
        patch.setattr(builtins, "open", recorder("open"))
        patch.setattr(io, "open", recorder("io.open"))
        patch.setattr(os, "open", recorder("os.open"))
        patch.setattr(urllib.request, "urlopen", recorder("urlopen"))
        patch.setattr(socket.socket, "connect", recorder("socket.connect"))
        patch.setattr(socket, "create_connection", recorder("create_connection"))
        patch.setattr(socket, "getaddrinfo", recorder("getaddrinfo"))
        yield log


@pytest.fixture
def compiler_calls(
    access_log: AccessLog, monkeypatch: pytest.MonkeyPatch
) -> list[Mapping[str, Any]]:
    """Record every schema that reaches the jsonschema compiler (after the warm-up)."""
    calls: list[Mapping[str, Any]] = []
    choose_validator = agentrt.schema._validator_class

    def recording(schema: Mapping[str, Any]) -> type[Any]:
        calls.append(schema)
        return choose_validator(schema)

    monkeypatch.setattr(agentrt.schema, "_validator_class", recording)
    return calls


def external_schemas(url: str, files: dict[str, Path]) -> dict[str, dict[str, Any]]:
    host = url.removeprefix("http:")
    return {
        "ref-file-passwd": {"$ref": "file:///etc/passwd"},
        "ref-real-file": {"$ref": files["file"].as_uri() + "#/$defs/name"},
        "ref-fifo": {"$ref": files["fifo"].as_uri()},
        "ref-http": {"$ref": f"{url}/schema.json"},
        "ref-metadata-address": {"$ref": "http://169.254.169.254/latest/meta-data/"},
        "ref-network-path": {"$ref": f"{host}/schema.json"},
        "ref-relative-path": {"$ref": "defs.json#/$defs/name"},
        "ref-urn": {"$ref": "urn:uuid:6e8bc430-9c3a-11d9-9669-0800200c9a66"},
        "ref-nested-in-properties": {
            "type": "object",
            "properties": {"path": {"allOf": [{"prefixItems": [{"$ref": f"{url}/deep.json"}]}]}},
        },
        "ref-inside-defs": {"$defs": {"x": {"$ref": files["file"].as_uri()}}},
        "dynamic-ref": {"$dynamicRef": f"{url}/meta#node"},
        "recursive-ref": {
            "$schema": "https://json-schema.org/draft/2019-09/schema",
            "$recursiveRef": f"{url}/tree",
        },
        "id-with-host": {"$id": f"{url}/root.json", "$ref": "other.json"},
        "id-network-path": {"$id": f"{host}/root.json"},
        "id-urn": {"$id": "urn:example:root"},
        "id-relative": {"properties": {"a": {"$id": "sub/other.json"}}},
        "schema-unknown-dialect": {"$schema": f"{url}/meta"},
        "schema-not-a-string": {"$schema": 4},
        "schema-near-miss": {"$schema": "https://json-schema.org/draft/2020-12/schema/"},
        "draft04-id-with-scheme": {
            "$schema": "http://json-schema.org/draft-04/schema#",
            "properties": {"a": {"id": f"{url}/a.json"}},
        },
        "draft04-id-network-path": {
            "$schema": "http://json-schema.org/draft-04/schema#",
            "id": f"{host}/root.json",
        },
        "draft03-id-with-scheme": {
            "$schema": "http://json-schema.org/draft-03/schema#",
            "properties": {"a": {"id": files["file"].as_uri()}},
        },
    }


def test_the_access_recorder_sees_what_it_is_meant_to_see(
    recording_server: RecordingServer, schema_files: dict[str, Path], access_log: AccessLog
) -> None:
    # The instrument the tests below rely on: a read or a fetch is recorded.
    with pytest.raises(PermissionError):
        schema_files["file"].read_bytes()
    with pytest.raises(PermissionError):
        open(schema_files["fifo"], "rb")  # noqa: SIM115
    with pytest.raises(PermissionError):
        urllib.request.urlopen(recording_server.url)
    with pytest.raises(PermissionError):
        socket.create_connection(("127.0.0.1", 9))
    assert len(access_log.calls) == 4


EXTERNAL_CASES = list(external_schemas("http://h", {"file": Path("/f"), "fifo": Path("/p")}))


@pytest.mark.timeout(20)
@pytest.mark.parametrize("case", EXTERNAL_CASES)
def test_a_schema_reaching_outside_is_refused_before_the_compiler_sees_it(
    case: str,
    recording_server: RecordingServer,
    schema_files: dict[str, Path],
    compiler_calls: list[Mapping[str, Any]],
    access_log: AccessLog,
) -> None:
    schema = external_schemas(recording_server.url, schema_files)[case]
    with pytest.raises(SchemaError, match="is not self-contained") as caught:
        check_self_contained(schema)
    with pytest.raises(SchemaError, match="is not self-contained"):
        compile_schema(schema)
    message = str(caught.value)
    assert "\n" not in message
    assert compiler_calls == []
    assert access_log.calls == []
    assert recording_server.hits == []


BYPASS_CASES = {
    "ref-real-file": "does not resolve",
    "ref-fifo": "does not resolve",
    "ref-http": "does not resolve",
    "ref-network-path": "does not resolve",
    "ref-relative-path": "does not resolve",
    "ref-nested-in-properties": "does not resolve",
    "ref-inside-defs": "does not resolve",
    "id-with-host": "does not resolve",
}


@pytest.mark.timeout(20)
@pytest.mark.parametrize("case", sorted(BYPASS_CASES))
def test_the_compiler_itself_reads_and_fetches_nothing(
    case: str,
    recording_server: RecordingServer,
    schema_files: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    access_log: AccessLog,
) -> None:
    # Defence in depth: with the self-contained check switched off, the
    # compiler's registry (standard metaschemas only, retrieval refused) must
    # still refuse, without touching the file, the FIFO or the server.
    monkeypatch.setattr(agentrt.schema, "check_self_contained", lambda schema: None)
    schema = external_schemas(recording_server.url, schema_files)[case]
    with pytest.raises(SchemaError, match=BYPASS_CASES[case]):
        compile_schema(schema)
    assert access_log.calls == []
    assert recording_server.hits == []


@pytest.mark.timeout(20)
def test_a_dynamic_ref_past_the_check_fails_validation_without_a_fetch(
    recording_server: RecordingServer,
    schema_files: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    access_log: AccessLog,
) -> None:
    # compile_schema resolves only $ref eagerly; a $dynamicRef that got past
    # the check is resolved at the first validation, which must fail closed.
    monkeypatch.setattr(agentrt.schema, "check_self_contained", lambda schema: None)
    compiled = compile_schema(external_schemas(recording_server.url, schema_files)["dynamic-ref"])
    error = compiled.first_error({"anything": 1})
    assert error is not None
    assert error.startswith("the arguments could not be checked against the schema")
    assert access_log.calls == []
    assert recording_server.hits == []


def test_the_refusal_escapes_the_servers_reference_text() -> None:
    with pytest.raises(SchemaError) as caught:
        compile_schema({"properties": {"a\nb": {"$ref": "http://x/\u202e\x1b[2J"}}})
    message = str(caught.value)
    assert "\n" not in message
    assert "\x1b" not in message
    assert "\u202e" not in message


@pytest.mark.parametrize("uri", sorted(WELL_KNOWN_DRAFTS))
def test_every_well_known_draft_compiles_as_schema_and_as_id(uri: str) -> None:
    compiled = compile_schema({"$schema": uri, "type": "object"})
    assert compiled.first_error({}) is None
    assert compiled.first_error([]) is not None


# --- what a self-contained schema may do ----------------------------------------


def test_a_fragment_ref_into_defs_compiles_and_validates() -> None:
    compiled = compile_schema(
        {
            "type": "object",
            "$defs": {"positive": {"type": "integer", "minimum": 1}},
            "properties": {"count": {"$ref": "#/$defs/positive"}},
            "required": ["count"],
        }
    )
    assert compiled.first_error({"count": 3}) is None
    error = compiled.first_error({"count": 0})
    assert error is not None
    assert "minimum" in error and "/count" in error


def test_a_draft07_definitions_ref_compiles_and_validates() -> None:
    compiled = compile_schema(
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "definitions": {"name": {"type": "string", "maxLength": 3}},
            "properties": {"name": {"$ref": "#/definitions/name"}},
        }
    )
    assert compiled.first_error({"name": "abc"}) is None
    assert compiled.first_error({"name": "abcd"}) is not None


def test_an_anchor_ref_and_a_recursive_root_ref_validate() -> None:
    compiled = compile_schema(
        {
            "$defs": {"leaf": {"$anchor": "leaf", "type": "string"}},
            "type": "object",
            "properties": {
                "value": {"$ref": "#leaf"},
                "children": {"type": "array", "items": {"$ref": "#"}},
            },
        }
    )
    tree = {"value": "root", "children": [{"value": "a", "children": [{"value": "b"}]}]}
    assert compiled.first_error(tree) is None
    error = compiled.first_error({"children": [{"children": [{"value": 1}]}]})
    assert error is not None
    assert "/children/0/children/0/value" in error


@pytest.mark.parametrize(
    "reference",
    ["#/$defs/missing", "#missing-anchor", "#/properties/nope", "#/$defs/positive/0"],
)
def test_a_dangling_fragment_ref_is_refused_at_compile(reference: str) -> None:
    schema = {
        "$defs": {"positive": {"type": "integer"}},
        "properties": {"count": {"$ref": reference}},
    }
    with pytest.raises(SchemaError, match="does not resolve inside the document"):
        compile_schema(schema)


# --- numbers as parse_json gives them ----------------------------------------------


@pytest.mark.parametrize(
    ("literal", "valid"),
    [("1", True), ("1.0", True), ("1e2", True), ("-0", True), ("1.00", True),
     ("1.5", False), ("1e-1", False), ("true", False), ('"1"', False)],
)  # fmt: skip
def test_integer_accepts_integral_decimals_and_nothing_else(literal: str, valid: bool) -> None:
    compiled = compile_schema({"type": "integer"})
    assert (compiled.first_error(parse_json(literal)) is None) is valid


def test_a_bound_past_2_53_is_compared_exactly() -> None:
    compiled = compile_schema(parse_json(b'{"type": "integer", "maximum": 9007199254740992}'))
    assert compiled.first_error(parse_json(b"9007199254740992")) is None
    error = compiled.first_error(parse_json(b"9007199254740993"))
    assert error is not None
    assert "9007199254740993" in error and "maximum" in error
    # As float64 both are 9007199254740992.0: the bound would wrongly pass.
    assert float(9007199254740993) <= float(9007199254740992)


def test_an_exclusive_bound_past_2_53_is_compared_exactly() -> None:
    compiled = compile_schema(parse_json(b'{"exclusiveMinimum": 9007199254740992}'))
    assert compiled.first_error(parse_json(b"9007199254740993")) is None
    assert compiled.first_error(parse_json(b"9007199254740992")) is not None


def test_a_5000_digit_bound_is_compared_exactly() -> None:
    bound = "7" * 5_000
    compiled = compile_schema(parse_json(f'{{"maximum": {bound}}}'))
    assert compiled.first_error(parse_json(bound)) is None
    assert compiled.first_error(parse_json("7" * 4_999 + "8")) is not None


def test_a_decimal_bound_keeps_its_precision() -> None:
    compiled = compile_schema(parse_json(b'{"maximum": 0.30000000000000000001}'))
    assert compiled.first_error(parse_json(b"0.3")) is None
    assert compiled.first_error(parse_json(b"0.30000000000000000002")) is not None


def test_multiple_of_a_decimal_step_is_exact() -> None:
    # In float64, 0.3 / 0.1 is 2.9999999999999996, and 0.3 would be refused.
    compiled = compile_schema(parse_json(b'{"multipleOf": 0.1}'))
    assert compiled.first_error(parse_json(b"0.3")) is None
    assert compiled.first_error(parse_json(b"0.35")) is not None


def test_multiple_of_never_passes_a_huge_non_multiple() -> None:
    compiled = compile_schema(parse_json(b'{"multipleOf": 3}'))
    assert compiled.first_error(parse_json(b"1e10000")) is not None
    assert compiled.first_error(parse_json(b"1" + b"0" * 40 + b".0")) is not None


def test_multiple_of_is_exact_for_huge_values() -> None:
    compiled = compile_schema(parse_json(b'{"multipleOf": 3}'))
    assert compiled.first_error(parse_json(b"3e10000")) is None
    assert compiled.first_error(parse_json(b"3" + b"0" * 40 + b".0")) is None


def test_a_float_step_in_a_python_schema_checks_decimal_arguments() -> None:
    compiled = compile_schema({"type": "number", "multipleOf": 0.5})
    assert compiled.first_error(parse_json(b"1.5")) is None
    assert compiled.first_error(parse_json(b"1.25")) is not None
    assert compiled.first_error(parse_json(b"1" + b"0" * 400)) is None


def test_a_float_bound_in_a_python_schema_compares_decimal_arguments_exactly() -> None:
    compiled = compile_schema({"type": "number", "maximum": 0.5})
    assert compiled.first_error(parse_json(b"0.5")) is None
    assert compiled.first_error(parse_json(b"0.50000000000000000001")) is not None


# --- model-chosen text in the validation error ---------------------------------------


def test_a_validation_error_escapes_a_key_the_model_chose() -> None:
    compiled = compile_schema({"additionalProperties": {"type": "string"}})
    error = compiled.first_error({"x\n\u202eregistered\x1b[2J": 1})
    assert error is not None
    assert "\n" not in error
    assert "\u202e" not in error
    assert "\x1b" not in error


# --- regular expressions ---------------------------------------------------------------


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param({"pattern": "("}, id="pattern-2020-12"),
        pytest.param({"patternProperties": {"(": {}}}, id="pattern-properties-2020-12"),
        pytest.param(
            {"$schema": "http://json-schema.org/draft-07/schema#", "pattern": "[z-a]"},
            id="pattern-draft-07",
        ),
        pytest.param(
            {"$schema": "http://json-schema.org/draft-04/schema#", "pattern": "(?P<"},
            id="pattern-draft-04",
        ),
    ],
)
def test_an_invalid_regex_is_refused_at_compile(schema: dict[str, Any]) -> None:
    with pytest.raises(SchemaError, match=r"the schema does not compile: .* is not a 'regex'"):
        compile_schema(schema)


def test_an_invalid_draft04_pattern_property_is_refused_at_compile() -> None:
    with pytest.raises(SchemaError, match="the schema does not compile"):
        compile_schema(
            {"$schema": "http://json-schema.org/draft-04/schema#", "patternProperties": {"(": {}}}
        )


def test_an_invalid_draft04_pattern_property_never_lets_a_value_through() -> None:
    try:
        compiled = compile_schema(
            {"$schema": "http://json-schema.org/draft-04/schema#", "patternProperties": {"(": {}}}
        )
    except SchemaError:
        return  # refused at compile: the better of the two outcomes
    # Compiled: the first validation must fail closed, in one sentence.
    error = compiled.first_error({"a": 1})
    assert error == "the arguments could not be checked against the schema: error"


CATASTROPHIC_PROBE = """
import sys
from agentrt.schema import compile_schema
from agentrt.errors import SchemaError
try:
    compiled = compile_schema({"type": "string", "pattern": "^(a+)+$"})
except SchemaError:
    print("refused at compile")
    sys.exit(0)
print(compiled.first_error("a" * 64 + "!"))
"""


@pytest.mark.timeout(30)
def test_a_catastrophic_regex_is_refused_or_checked_in_bounded_time() -> None:
    try:
        finished = subprocess.run(
            [sys.executable, "-c", CATASTROPHIC_PROBE],
            capture_output=True,
            text=True,
            timeout=3,
            check=True,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("checking 65 characters against ^(a+)+$ did not finish in 3 seconds")
    assert finished.stdout.strip()


SLOW_PATTERN_PROBE = """
from agentrt.schema import compile_schema
compiled = compile_schema({
    "type": "object",
    "properties": {"a": {"type": "array", "items": {"type": "string", "pattern": "^(.*?,){11}P"}}},
})
print(compiled.first_error({"a": ["a," * 30] * 40}))
print(compiled.first_error({"a": ["a," * 11 + "P"]}))
"""


@pytest.mark.timeout(60)
def test_a_slow_pattern_refuses_the_value_instead_of_stalling_the_gate() -> None:
    # The regex engine's timeout fires on this pattern; forty such strings must
    # cost one budget, not forty timeouts.  The subprocess bound only catches a hang.
    try:
        finished = subprocess.run(
            [sys.executable, "-c", SLOW_PATTERN_PROBE],
            capture_output=True, text=True, timeout=20, check=True,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("forty strings against a slow pattern stalled validation")
    refusal, accepted = finished.stdout.splitlines()
    assert refusal == "the pattern '^(.*?,){11}P' took too long to check; the value is refused"
    assert accepted == "None"
