"""The proxy configuration: defaults, refusals, and the servers that may never start."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from agentrt import Outcome, SideEffect
from agentrt.proxy import ConfigError, load_config, parse_duration

RULES = {"read_file": {"side_effect": "read_only"}}


def write_config(directory: Path, document: Any, name: str = "proxy.json") -> Path:
    path = directory / name
    text = document if isinstance(document, str) else json.dumps(document)
    path.write_text(text)
    path.chmod(0o600)
    return path


def base(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir(exist_ok=True)
    document: dict[str, Any] = {
        "database": "state/proxy.db",
        "session": "desk-1",
        "servers": [
            {
                "name": "fs",
                "command": ["node", "server.js", str(sandbox)],
                "manifest": "fs.manifest.json",
                "rules": RULES,
            }
        ],
    }
    document.update(overrides)
    return document


def test_defaults_come_from_the_spec_table(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, base(tmp_path)))
    assert config.hold == 15.0
    assert config.repeat_window == 600.0
    assert config.max_pending == 5
    assert config.approval_ttl == config.grant_ttl == 24 * 3600.0
    assert config.lease_ttl == 30.0
    assert config.session == "desk-1"
    assert config.policy.outcomes[SideEffect.REMOTE_MUTATION] is Outcome.REQUIRE_APPROVAL
    assert config.policy.outcomes[SideEffect.DESTRUCTIVE] is Outcome.DENY


def test_relative_paths_are_relative_to_the_file_not_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_config(write_config(tmp_path, base(tmp_path)))
    assert config.database == tmp_path / "state" / "proxy.db"
    assert config.servers[0].manifest_path == tmp_path / "fs.manifest.json"
    assert config.path == tmp_path / "proxy.json"


def test_durations_are_go_style_strings(tmp_path: Path) -> None:
    config = load_config(
        write_config(
            tmp_path,
            base(tmp_path, hold="1m30s", repeat_window="250ms", lease_ttl="2s", grant_ttl="1.5h"),
        )
    )
    assert config.hold == 90.0
    assert config.repeat_window == pytest.approx(0.25)
    assert config.lease_ttl == 2.0
    assert config.grant_ttl == 5400.0
    for bad in ("15", "-1s", "0s", "1 s", "1d", "", "s", "1.s5"):
        with pytest.raises(ValueError):
            parse_duration(bad)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"holdd": "1s"}, "holdd"),
        ({"policy": {"read_only": "allow", "reed_only": "allow"}}, "reed_only"),
        ({"policy": {"read_only": "abort"}}, "policy.read_only"),
        ({"policy": {"read_only": "yes"}}, "policy.read_only"),
        ({"session": "has space"}, "session"),
        ({"session": "x" * 65}, "session"),
        ({"max_pending": 0}, "max_pending"),
        ({"max_pending": 1.5}, "max_pending"),
        ({"max_pending": True}, "max_pending"),
        ({"hold": 15}, "hold"),
        ({"servers": []}, "servers"),
        ({"session": "desk-1\n"}, "session"),
        ({"session": ""}, "session"),
    ],
)
def test_a_wrong_field_is_refused_naming_it(
    tmp_path: Path, overrides: dict[str, Any], named: str
) -> None:
    with pytest.raises(ConfigError, match=named) as raised:
        load_config(write_config(tmp_path, base(tmp_path, **overrides)))
    assert str(tmp_path / "proxy.json") in str(raised.value)


def test_an_unknown_server_field_is_refused_naming_it(tmp_path: Path) -> None:
    document = base(tmp_path)
    document["servers"][0]["comand"] = ["node"]
    with pytest.raises(ConfigError, match="comand"):
        load_config(write_config(tmp_path, document))


def test_an_unknown_rule_field_is_refused_naming_it(tmp_path: Path) -> None:
    document = base(tmp_path)
    document["servers"][0]["rules"] = {"read_file": {"side_effect": "read_only", "sid": 1}}
    with pytest.raises(ConfigError, match="sid"):
        load_config(write_config(tmp_path, document))


@pytest.mark.parametrize("missing", ["database", "session", "servers"])
def test_a_required_field_missing_is_refused(tmp_path: Path, missing: str) -> None:
    document = base(tmp_path)
    del document[missing]
    with pytest.raises(ConfigError, match=f"{missing} is required"):
        load_config(write_config(tmp_path, document))


@pytest.mark.parametrize("missing", ["name", "manifest"])
def test_a_server_without_a_required_field_is_refused(tmp_path: Path, missing: str) -> None:
    document = base(tmp_path)
    del document["servers"][0][missing]
    with pytest.raises(ConfigError, match=missing):
        load_config(write_config(tmp_path, document))


def test_a_repeated_key_is_refused(tmp_path: Path) -> None:
    text = json.dumps(base(tmp_path))[:-1] + ', "session": "other"}'
    with pytest.raises(ConfigError, match="repeated"):
        load_config(write_config(tmp_path, text))


def test_a_server_named_twice_is_refused(tmp_path: Path) -> None:
    document = base(tmp_path)
    document["servers"].append(dict(document["servers"][0]))
    with pytest.raises(ConfigError, match='server "fs" twice'):
        load_config(write_config(tmp_path, document))


def test_a_server_with_both_command_and_endpoint_is_refused(tmp_path: Path) -> None:
    document = base(tmp_path)
    document["servers"][0]["endpoint"] = "http://127.0.0.1:9/mcp"
    with pytest.raises(ConfigError, match="exactly one of command and endpoint"):
        load_config(write_config(tmp_path, document))


def test_a_configuration_others_can_write_is_refused(tmp_path: Path) -> None:
    path = write_config(tmp_path, base(tmp_path))
    path.chmod(0o620)
    with pytest.raises(ConfigError, match="group or others write"):
        load_config(path)
    path.chmod(0o602)
    with pytest.raises(ConfigError, match="group or others write"):
        load_config(path)


def test_a_configuration_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "proxy.json"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(fifo)


def test_a_rules_file_is_read_relative_to_the_configuration(tmp_path: Path) -> None:
    rules = tmp_path / "rules" / "fs.json"
    rules.parent.mkdir()
    rules.write_text(json.dumps({"write_file": {"side_effect": "local_mutation"}}))
    rules.chmod(0o600)
    document = base(tmp_path)
    document["servers"][0]["rules"] = "rules/fs.json"
    config = load_config(write_config(tmp_path, document))
    assert config.servers[0].rules_path == rules
    assert "write_file" in config.servers[0].rules


def test_a_rules_file_others_can_write_is_refused(tmp_path: Path) -> None:
    rules = tmp_path / "fs.rules.json"
    rules.write_text(json.dumps({"write_file": {"side_effect": "local_mutation"}}))
    rules.chmod(0o666)
    document = base(tmp_path)
    document["servers"][0]["rules"] = "fs.rules.json"
    with pytest.raises(ConfigError, match="group or others write"):
        load_config(write_config(tmp_path, document))


def test_a_partial_policy_denies_the_classes_it_leaves_out(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, base(tmp_path, policy={"read_only": "allow"})))
    assert config.policy.outcomes == {SideEffect.READ_ONLY: Outcome.ALLOW}


@pytest.mark.parametrize(
    "argument",
    [
        "{dir}",
        "{dir}/",
        "{dir}/state",
        "{dir}/state/proxy.db",
        "{dir}/state/proxy.db-wal",
        "{dir}/proxy.json",
        "{dir}/fs.manifest.json",
        "--root={dir}",
        "/",
        "{dir}/sandbox/..",
    ],
)
def test_a_server_whose_arguments_reach_the_operators_files_is_refused(
    tmp_path: Path, argument: str
) -> None:
    document = base(tmp_path)
    document["servers"][0]["command"] = ["node", "server.js", argument.format(dir=tmp_path)]
    with pytest.raises(ConfigError, match="forge an approval"):
        load_config(write_config(tmp_path, document))


def test_a_server_reaching_the_operators_files_through_a_symlink_is_refused(
    tmp_path: Path,
) -> None:
    document = base(tmp_path)
    (tmp_path / "state").mkdir()
    link = tmp_path / "sandbox" / "innocent"
    link.symlink_to(tmp_path / "state", target_is_directory=True)
    document["servers"][0]["command"] = ["node", "server.js", str(link)]
    with pytest.raises(ConfigError, match="forge an approval"):
        load_config(write_config(tmp_path, document))


def test_a_server_reaching_a_relative_directory_holding_the_database_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    document = base(tmp_path)
    monkeypatch.chdir(tmp_path)
    document["servers"][0]["command"] = ["node", "server.js", "."]
    with pytest.raises(ConfigError, match="forge an approval"):
        load_config(write_config(tmp_path, document))


def test_a_server_over_a_sibling_sandbox_starts(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, base(tmp_path)))
    assert config.servers[0].server.command == ["node", "server.js", str(tmp_path / "sandbox")]


def test_a_configuration_behind_a_symbolic_link_is_refused(tmp_path: Path) -> None:
    real = write_config(tmp_path, base(tmp_path), name="real.json")
    link = tmp_path / "proxy.json"
    link.symlink_to(real)
    with pytest.raises(ConfigError, match="symbolic link"):
        load_config(link)


def test_a_server_handed_the_operators_directory_in_its_environment_is_refused(
    tmp_path: Path,
) -> None:
    document = base(tmp_path)
    document["servers"][0]["env"] = [f"ALLOWED_ROOT={tmp_path}"]
    with pytest.raises(ConfigError, match="forge an approval"):
        load_config(write_config(tmp_path, document))


@pytest.mark.parametrize(
    ("standing_grants", "named"),
    [
        ({}, "standing_grants.max_for"),
        ({"max_for": 3600}, "standing_grants.max_for"),
        ({"max_for": "1h", "max_calls": 0}, "standing_grants.max_calls"),
        ({"max_for": "1h", "destructive": "yes"}, "standing_grants.destructive"),
        ({"max_for": "1h", "max_call": 3}, "standing_grants.max_call"),
    ],
)
def test_a_wrong_standing_grants_field_is_refused_naming_it(
    tmp_path: Path, standing_grants: dict[str, Any], named: str
) -> None:
    document = base(tmp_path, standing_grants=standing_grants)
    with pytest.raises(ConfigError, match=named):
        load_config(write_config(tmp_path, document))


def test_standing_grants_are_off_unless_configured_and_read_as_the_operators_maximum(
    tmp_path: Path,
) -> None:
    assert load_config(write_config(tmp_path, base(tmp_path))).standing_grants is None
    document = base(tmp_path, standing_grants={"max_for": "2h", "max_calls": 7})
    limits = load_config(write_config(tmp_path, document)).standing_grants
    assert limits is not None
    assert (limits.max_seconds, limits.max_calls, limits.destructive) == (7200.0, 7, False)


def test_a_server_keeps_a_session_unless_its_revision_says_otherwise(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, base(tmp_path)))
    assert config.servers[0].server.revision == "session"
    document = base(tmp_path)
    document["servers"][0]["revision"] = "auto"
    assert load_config(write_config(tmp_path, document)).servers[0].server.revision == "auto"
    document["servers"][0]["revision"] = "2026-07-28"
    with pytest.raises(ConfigError) as refused:
        load_config(write_config(tmp_path, document))
    assert str(refused.value).endswith('server "fs" revision must be "auto", "session" or "legacy"')
