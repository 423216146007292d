"""Learning which request an over-long message answers, from its top level alone, in chunks."""

from __future__ import annotations

import json

import pytest

from agentrt.mcp._jsonrpc import OverlongMessage


def _scan(message: bytes, chunk: int) -> int | None:
    overlong = OverlongMessage()
    for start in range(0, len(message), chunk):
        overlong.feed(message[start : start + chunk])
    return overlong.request_id()


TRICKY_TEXT = 'a "quoted" \\ back\\slash \\" } ] { [ "id": 99, \u00e9 \u2028'

ANSWERS = [
    # (message, the id it answers or None)
    (json.dumps({"jsonrpc": "2.0", "id": 7, "result": {"text": TRICKY_TEXT}}), 7),
    (json.dumps({"result": {"content": [{"text": TRICKY_TEXT}]}, "jsonrpc": "2.0", "id": 8}), 8),
    (json.dumps({"jsonrpc": "2.0", "id": 9, "error": {"code": 1, "message": TRICKY_TEXT}}), 9),
    ('{"jsonrpc":"2.0","note":"' + "\\\\" * 5 + '","id":10,"result":[[[]]]}', 10),
    (json.dumps({"jsonrpc": "2.0", "id": "7", "result": {}}), None),  # not one of our ids
    (json.dumps({"jsonrpc": "2.0", "id": 7, "method": "x", "params": {}}), None),  # a request
    ('{"jsonrpc":"2.0","id":7,"id":8,"result":{}}', None),  # a repeated key
    ('{"junk":"' + "x" * 1000 + '"}{"jsonrpc":"2.0","id":7,"result":{}}', None),  # two values
    ('{"jsonrpc":"2.0","id":7,"result":{"unclosed":', None),
]


@pytest.mark.parametrize(("message", "expected"), ANSWERS)
def test_the_id_of_an_overlong_answer_is_found_whatever_the_chunking(
    message: str, expected: int | None
) -> None:
    data = message.encode()
    for chunk in (1, 2, 3, 5, 8, 64, len(data)):
        assert _scan(data, chunk) == expected, chunk


def test_a_message_that_spends_the_scan_bound_names_no_request() -> None:
    flood = json.dumps({"result": [[0]] * 200_000, "jsonrpc": "2.0", "id": 4}).encode()
    assert _scan(flood, 65536) is None
    short = json.dumps({"result": [[0]] * 1000, "jsonrpc": "2.0", "id": 4}).encode()
    assert _scan(short, 65536) == 4
