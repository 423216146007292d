"""Rules: the operator's classification, and the rules file that carries it."""

from __future__ import annotations

import pytest

from agentrt import SideEffect
from agentrt.mcp import FileRule, OperatorFileError, Rule
from agentrt.mcp._rules import parse_duration, rules_from_json


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5s", 5.0), ("1m30s", 90.0), ("250ms", 0.25), ("1h", 3600.0), ("1.5s", 1.5), ("90us", 9e-5)],
)
def test_go_durations_parse_to_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "-5s", "0s", "5 s", "1d", "s", "5s ", "1e3s"])
def test_a_duration_that_is_not_go_style_or_not_positive_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_rules_file_converts_to_rules_with_fixed_literals_kept() -> None:
    rules = rules_from_json(
        b'{"write_file": {"side_effect": "local_mutation", "timeout": "1m30s",'
        b' "allow_hint_mismatch": true, "deny": ["mode"],'
        b' "fixed": {"root": "/srv", "limit": 9007199254740993, "ratio": 1.50},'
        b' "rename": "fs_put", "terminal": false, "description": "Write one file."}}',
        source="rules.json",
    )
    rule = rules["write_file"].to_rule()
    assert rule == Rule(
        side_effect=SideEffect.LOCAL_MUTATION,
        timeout=90.0,
        terminal=False,
        description="Write one file.",
        deny=["mode"],
        fixed={"root": '"/srv"', "limit": "9007199254740993", "ratio": "1.50"},
        rename="fs_put",
        allow_hint_mismatch=True,
    )


def test_rules_file_unknown_field_is_refused_naming_it_and_the_path() -> None:
    with pytest.raises(OperatorFileError) as caught:
        rules_from_json(
            b'{"read_file": {"side_effect": "read_only", "allow_hint_mismatches": true}}',
            source="/etc/agentrt/rules.json",
        )
    message = str(caught.value)
    assert '"allow_hint_mismatches"' in message
    assert "/etc/agentrt/rules.json" in message
    assert '"read_file"' in message


def test_rules_file_repeated_key_is_refused_naming_it() -> None:
    with pytest.raises(OperatorFileError) as caught:
        rules_from_json(
            b'{"read_file": {"side_effect": "read_only"},'
            b' "read_file": {"side_effect": "destructive"}}',
            source="rules.json",
        )
    assert '"read_file"' in str(caught.value)
    assert "repeated" in str(caught.value)
    assert "rules.json" in str(caught.value)


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        (b'{"t": {"timeout": "5s"}}', '"side_effect"'),
        (b'{"t": {"side_effect": "harmless"}}', '"side_effect"'),
        (b'{"t": {"side_effect": "read_only", "timeout": 5}}', '"timeout"'),
        (b'{"t": {"side_effect": "read_only", "timeout": "5 seconds"}}', '"timeout"'),
        (b'{"t": {"side_effect": "read_only", "deny": "path"}}', '"deny"'),
        (b'{"t": {"side_effect": "read_only", "fixed": ["x"]}}', '"fixed"'),
        (b'{"t": {"side_effect": "read_only", "terminal": "yes"}}', '"terminal"'),
        (b'{"t": "read_only"}', "not a JSON object"),
        (b'["t"]', "JSON object"),
    ],
)
def test_rules_file_with_a_malformed_field_is_refused_naming_it(entry: bytes, named: str) -> None:
    with pytest.raises(OperatorFileError) as caught:
        rules_from_json(entry, source="rules.json")
    assert named in str(caught.value)


def test_rule_refuses_an_unknown_side_effect_and_a_nonpositive_timeout() -> None:
    with pytest.raises(ValueError, match="side_effect"):
        Rule(side_effect="harmless")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        Rule(side_effect=SideEffect.READ_ONLY, timeout=0)
    assert Rule(side_effect="read_only").side_effect is SideEffect.READ_ONLY  # type: ignore[arg-type]


def test_file_rule_without_timeout_leaves_it_to_the_server_default() -> None:
    assert FileRule(side_effect="read_only").to_rule().timeout is None
