"""The operator's files are read only when this user owns them and nobody else can write them."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agentrt import SideEffect
from agentrt.mcp import (
    Manifest,
    OperatorFileError,
    owned_privately,
    read_manifest,
    read_owned,
    read_rules,
)
from agentrt.mcp._manifest import pin_raw_tool


def _private_file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def test_read_owned_returns_a_private_file_owned_by_this_user(tmp_path: Path) -> None:
    path = _private_file(tmp_path / "rules.json", b'{"a": 1}')
    assert read_owned(path) == b'{"a": 1}'


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_a_file_group_or_others_can_write_is_refused_naming_path_and_mode(
    tmp_path: Path, mode: int
) -> None:
    path = _private_file(tmp_path / "rules.json", b"{}")
    path.chmod(mode)
    with pytest.raises(OperatorFileError) as caught:
        read_owned(path)
    assert str(path) in str(caught.value)
    assert f"{mode:04o}" in str(caught.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_a_file_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    path = _private_file(tmp_path / "rules.json", b"{}")
    os.chown(path, 54321, -1)
    with pytest.raises(OperatorFileError, match="owned by uid 54321"):
        read_owned(path)


def test_a_symbolic_link_is_refused_even_to_a_private_file(tmp_path: Path) -> None:
    target = _private_file(tmp_path / "real.json", b"{}")
    link = tmp_path / "rules.json"
    link.symlink_to(target)
    with pytest.raises(OperatorFileError, match="symbolic link"):
        read_owned(link)


@pytest.mark.timeout(10)
def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "rules.json"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(OperatorFileError, match="not a regular file"):
        read_owned(fifo)


def test_a_directory_and_a_missing_file_are_refused(tmp_path: Path) -> None:
    directory = tmp_path / "rules.d"
    directory.mkdir(mode=0o700)
    with pytest.raises(OperatorFileError, match="not a regular file"):
        read_owned(directory)
    with pytest.raises(OperatorFileError, match="cannot read"):
        read_owned(tmp_path / "absent.json")


@pytest.mark.parametrize("swap", ["just_before_open", "just_after_open"])
def test_the_file_read_is_the_file_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swap: str
) -> None:
    # The name holds a private file on one side of the open and a
    # world-writable one on the other.  A check by path (before or after the
    # open) would pass on the private file and read the hostile bytes; the
    # check on the open descriptor refuses them either way.
    path = tmp_path / "rules.json"
    private = tmp_path / "private.json"
    hostile = tmp_path / "hostile.json"
    hostile.write_bytes(b'"hostile"')
    hostile.chmod(0o666)
    if swap == "just_before_open":
        _private_file(path, b'"private"')
    else:
        os.replace(hostile, path)
        _private_file(private, b'"private"')
    real_open = os.open

    def open_with_swap(name: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if os.fspath(name) != str(path):
            return real_open(name, flags, *args, **kwargs)
        if swap == "just_before_open":
            os.replace(hostile, path)
            return real_open(name, flags, *args, **kwargs)
        descriptor = real_open(name, flags, *args, **kwargs)
        os.replace(private, path)
        return descriptor

    monkeypatch.setattr(os, "open", open_with_swap)
    with pytest.raises(OperatorFileError, match="0666"):
        read_owned(path)


def test_owned_privately_checks_a_given_stat_result(tmp_path: Path) -> None:
    path = _private_file(tmp_path / "m.json", b"{}")
    owned_privately(path, os.stat(path))
    path.chmod(0o622)
    with pytest.raises(OperatorFileError, match="0622"):
        owned_privately(path, os.stat(path))


def test_read_rules_refuses_an_unknown_field_naming_it_and_the_path(tmp_path: Path) -> None:
    path = _private_file(
        tmp_path / "rules.json", b'{"read_file": {"side_effect": "read_only", "sideeffect": 1}}'
    )
    with pytest.raises(OperatorFileError) as caught:
        read_rules(path)
    assert '"sideeffect"' in str(caught.value)
    assert str(path) in str(caught.value)


def test_read_rules_refuses_a_repeated_key_naming_it(tmp_path: Path) -> None:
    path = _private_file(
        tmp_path / "rules.json",
        b'{"read_file": {"side_effect": "read_only", "side_effect": "destructive"}}',
    )
    with pytest.raises(OperatorFileError) as caught:
        read_rules(path)
    assert '"side_effect"' in str(caught.value)
    assert str(path) in str(caught.value)


def test_read_rules_returns_file_rules_that_convert(tmp_path: Path) -> None:
    path = _private_file(
        tmp_path / "rules.json", b'{"read_file": {"side_effect": "read_only", "timeout": "250ms"}}'
    )
    rule = read_rules(path)["read_file"].to_rule()
    assert rule.side_effect is SideEffect.READ_ONLY
    assert rule.timeout == 0.25


def test_read_manifest_round_trips_and_refuses_a_writable_manifest(tmp_path: Path) -> None:
    manifest = Manifest(
        server="fs",
        pinned_at=datetime(2026, 1, 1, tzinfo=UTC),
        tools={"t": pin_raw_tool("t", {"inputSchema": {"type": "object"}})},
    )
    path = _private_file(tmp_path / "fs.json", manifest.to_json().encode())
    assert read_manifest(path) == manifest
    path.chmod(0o646)
    with pytest.raises(OperatorFileError, match="0646"):
        read_manifest(path)
