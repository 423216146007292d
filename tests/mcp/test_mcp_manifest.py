"""The manifest: what an operator reviewed, hashed over canonical JSON, stored stably."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from agentrt.canonical import parse_json
from agentrt.mcp import Manifest, OperatorFileError, PinnedTool
from agentrt.mcp._manifest import pin_raw_tool

# The schema as a server might send it: keys unsorted, whitespace, a bound past
# 2^53 and a literal 1.50 that a float64 decoding would lose.
_RAW_TOOL = (
    b'{"name": "count", "description": "Read a file.\\n<b>&\\u00e9",'
    b' "inputSchema": {"type": "object",  "properties": {"x": {"type": "number",'
    b' "minimum": 1.50}, "n": {"type": "integer", "maximum": 9007199254740993}}},'
    b' "annotations": {"readOnlyHint": true, "title": "Count"}}'
)
# Written by hand: sorted keys, no whitespace, literals as sent, no HTML escaping.
_CANONICAL_SCHEMA = (
    '{"properties":{"n":{"maximum":9007199254740993,"type":"integer"},'
    '"x":{"minimum":1.50,"type":"number"}},"type":"object"}'
)
# sha256sum of the two canonical texts above, computed outside Python.
_GOLDEN_SCHEMA_HASH = "cefda9c3de4b9c86d677e28e9be1e99f5586d3bd88a19e20f5a64c1e86912027"
_GOLDEN_DESCRIPTION_HASH = "f6b47228982cae9dc0c8e694297e25d9e62082c42c8736380647292c7cffb9e5"
_EMPTY_DESCRIPTION_HASH = "12ae32cb1ec02d01eda3581b127c1fee3b0dc53572ed6baf239721a03d82e126"


def test_golden_hashes_for_a_fixed_schema_and_description() -> None:
    pinned = pin_raw_tool("count", parse_json(_RAW_TOOL))
    assert pinned.input_schema == _CANONICAL_SCHEMA
    assert pinned.schema_hash == _GOLDEN_SCHEMA_HASH
    assert pinned.description == "Read a file.\n<b>&é"
    assert pinned.description_hash == _GOLDEN_DESCRIPTION_HASH
    assert pinned.annotations == {"readOnlyHint": True, "title": "Count"}


def test_a_bound_moved_past_float64_precision_changes_the_schema_hash() -> None:
    moved = _RAW_TOOL.replace(b"9007199254740993", b"9007199254740992")
    # A float64 decoding cannot tell the two apart.
    assert json.loads(_RAW_TOOL, parse_int=float) == json.loads(moved, parse_int=float)
    before = pin_raw_tool("count", parse_json(_RAW_TOOL))
    after = pin_raw_tool("count", parse_json(moved))
    assert before.schema_hash != after.schema_hash


def test_key_order_and_whitespace_do_not_change_the_hashes() -> None:
    reordered = (
        b'{"inputSchema":{"properties":{"n":{"maximum":9007199254740993,"type":"integer"},'
        b'"x":{"type":"number","minimum":1.50}},"type":"object"},'
        b'"description":"Read a file.\\n<b>&\\u00e9","name":"count"}'
    )
    pinned = pin_raw_tool("count", parse_json(reordered))
    assert pinned.schema_hash == _GOLDEN_SCHEMA_HASH
    assert pinned.description_hash == _GOLDEN_DESCRIPTION_HASH
    assert pinned.annotations is None


def test_an_absent_description_is_pinned_as_the_empty_string() -> None:
    pinned = pin_raw_tool("t", {"inputSchema": {"type": "object"}})
    assert pinned.description == ""
    assert pinned.description_hash == _EMPTY_DESCRIPTION_HASH


def _manifest(pinned_at: datetime) -> Manifest:
    return Manifest(
        server="fs",
        pinned_at=pinned_at,
        tools={
            "count": pin_raw_tool("count", parse_json(_RAW_TOOL)),
            "a_tool": pin_raw_tool("a_tool", {"inputSchema": {"type": "object"}}),
        },
    )


def test_manifest_round_trips_with_sorted_snake_case_keys_and_literals_kept() -> None:
    manifest = _manifest(datetime(2026, 12, 1, 6, 40, 1, 250000, tzinfo=UTC))
    text = manifest.to_json()
    assert Manifest.from_json(text) == manifest
    document = json.loads(text)
    assert list(document) == ["pinned_at", "server", "tools"]
    assert list(document["tools"]) == ["a_tool", "count"]
    assert list(document["tools"]["count"]) == [
        "annotations",
        "description",
        "description_hash",
        "input_schema",
        "name",
        "schema_hash",
    ]
    assert document["pinned_at"] == "2026-12-01T06:40:01.250000Z"
    assert "9007199254740993" in text and "1.50" in text


def test_two_pins_of_an_unchanged_server_differ_only_in_pinned_at() -> None:
    first = _manifest(datetime(2026, 1, 1, tzinfo=UTC)).to_json().splitlines()
    second = _manifest(datetime(2026, 6, 1, 12, tzinfo=UTC)).to_json().splitlines()
    differing = [(a, b) for a, b in zip(first, second, strict=True) if a != b]
    assert len(differing) == 1
    assert "pinned_at" in differing[0][0]


@pytest.mark.parametrize(
    ("mutate", "named"),
    [
        (lambda d: d.update(extra=1), '"extra"'),
        (lambda d: d.pop("server"), '"server"'),
        (lambda d: d.update(pinned_at="yesterday"), '"pinned_at"'),
        (lambda d: d["tools"]["count"].update(schema_hash="0" * 64), '"schema_hash"'),
        (lambda d: d["tools"]["count"].update(name="other"), "another name"),
        (lambda d: d["tools"]["count"].pop("annotations"), '"annotations"'),
        (lambda d: d["tools"]["count"].update(trusted=True), '"trusted"'),
    ],
)
def test_a_manifest_with_a_wrong_field_is_refused_naming_it(mutate: object, named: str) -> None:
    document = json.loads(_manifest(datetime(2026, 1, 1, tzinfo=UTC)).to_json())
    mutate(document)  # type: ignore[operator]
    with pytest.raises(OperatorFileError) as caught:
        Manifest.from_json(json.dumps(document), source="fs.manifest.json")
    assert named in str(caught.value)
    assert "fs.manifest.json" in str(caught.value)


def test_pinned_tool_keeps_annotations_as_received() -> None:
    raw = parse_json(b'{"inputSchema":{"type":"object"},"annotations":{"readOnlyHint":"yes"}}')
    assert pin_raw_tool("t", raw) == PinnedTool(
        name="t",
        description="",
        input_schema='{"type":"object"}',
        schema_hash=pin_raw_tool("t", raw).schema_hash,
        description_hash=_EMPTY_DESCRIPTION_HASH,
        annotations={"readOnlyHint": "yes"},
    )
