"""JSON Schema's validators are imported only by a schema or a value that needs them
(issue 36): a 2020-12 schema the fast proof shows valid compiles without them, a value
its plan proves valid is checked without them, and `prepare_for` imports them ahead,
while a proxy's servers start, when a pinned manifest names an older draft."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

_HEAVY = ("jsonschema", "referencing", "regex")


def _run(code: str, tmp_path: Path) -> dict[str, object]:
    script = tmp_path / "probe.py"
    script.write_text(
        "import json, sys\n"
        + code
        + f"\nprint(json.dumps({{'result': result, 'loaded': sorted(n for n in {_HEAVY!r} "
        "if n in sys.modules)}))\n"
    )
    finished = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(finished.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def test_a_common_2020_12_schema_compiles_and_checks_without_jsonschema(tmp_path: Path) -> None:
    out = _run(
        "from agentrt.schema import compile_schema\n"
        "compiled = compile_schema({'type': 'object', 'properties': {'text': {'type': 'string',"
        " 'maxLength': 10}}, 'required': ['text'], 'additionalProperties': False})\n"
        "result = compiled.first_error({'text': 'hello'})\n",
        tmp_path,
    )
    assert out == {"result": None, "loaded": []}


def test_a_refused_value_still_gets_jsonschemas_sentence(tmp_path: Path) -> None:
    out = _run(
        "from agentrt.schema import compile_schema\n"
        "compiled = compile_schema({'type': 'object', 'properties': {'n': {'type': 'integer'}}})\n"
        "result = compiled.first_error({'n': 'seven'})\n",
        tmp_path,
    )
    assert out["result"] == "'seven' is not of type 'integer' at /n"
    assert "jsonschema" in out["loaded"]  # type: ignore[operator]


def test_a_draft_07_schema_is_checked_by_jsonschema(tmp_path: Path) -> None:
    out = _run(
        "from agentrt.schema import compile_schema\n"
        "from agentrt.errors import SchemaError\n"
        "try:\n"
        "    compile_schema({'$schema': 'http://json-schema.org/draft-07/schema#',"
        " 'type': 'object', 'properties': {'n': {'type': 'integer', 'minimum': 'zero'}}})\n"
        "    result = 'compiled'\n"
        "except SchemaError as exc:\n"
        "    result = str(exc)\n",
        tmp_path,
    )
    assert out["result"] == "the schema does not compile: 'zero' is not of type 'number'"
    assert "jsonschema" in out["loaded"]  # type: ignore[operator]


def _manifest(*schemas: dict[str, object], description: str = "Reads.") -> bytes:
    tools = {
        f"t{index}": {"name": f"t{index}", "description": description, "input_schema": schema}
        for index, schema in enumerate(schemas)
    }
    return json.dumps({"server": "s", "tools": tools}, indent=2, sort_keys=True).encode()


def test_prepare_for_imports_the_validators_a_manifest_of_an_older_draft_needs(
    tmp_path: Path,
) -> None:
    draft_07 = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"}
    (tmp_path / "m.json").write_bytes(_manifest({"type": "object"}, draft_07))
    out = _run(
        "from agentrt.schema import prepare_for\n"
        f"result = prepare_for(open({str(tmp_path / 'm.json')!r}, 'rb').read())\n",
        tmp_path,
    )
    assert out == {"result": ["http://json-schema.org/draft-07/schema"], "loaded": [
        "jsonschema", "referencing"]}  # fmt: skip


def test_prepare_for_leaves_a_2020_12_manifest_and_a_description_that_quotes_a_draft(
    tmp_path: Path,
) -> None:
    quoting = 'Pass "$schema": "http://json-schema.org/draft-04/schema#" and "pattern": "x".'
    dialect = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"}
    (tmp_path / "m.json").write_bytes(_manifest({"type": "object"}, dialect, description=quoting))
    out = _run(
        "from agentrt.schema import prepare_for\n"
        f"result = prepare_for(open({str(tmp_path / 'm.json')!r}, 'rb').read())\n",
        tmp_path,
    )
    assert out == {"result": [], "loaded": []}


def test_prepare_for_imports_the_pattern_engine_for_a_manifest_with_patterns(
    tmp_path: Path,
) -> None:
    patterned = {"type": "object", "properties": {"id": {"type": "string", "pattern": "^a$"}}}
    (tmp_path / "m.json").write_bytes(_manifest(patterned))
    out = _run(
        "from agentrt.schema import prepare_for\n"
        f"result = prepare_for(open({str(tmp_path / 'm.json')!r}, 'rb').read())\n",
        tmp_path,
    )
    assert out == {"result": [], "loaded": ["regex"]}
