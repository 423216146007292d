"""The guard on the operator's files resolves every path a server is handed, however spelled.

A real directory layout in a temporary directory: the configuration and a
manifest in `conf/`, the database in `state/`, and a sibling `sandbox/` a
server may be given.  Each spelling that once passed the string comparison
is refused; ordinary arguments still pass.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import unicodedata
from pathlib import Path
from typing import Literal

import pytest

from agentrt.mcp import Server, find_operator_file_reach
from agentrt.proxy.config import ConfigError, load_config


class Layout:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "conf"
        self.state = root / "state"
        self.sandbox = root / "sandbox"
        for directory in (self.conf, self.state, self.sandbox):
            directory.mkdir()
        self.config = self.conf / "proxy.json"
        self.manifest = self.conf / "fs.manifest.json"
        self.database = self.state / "proxy.db"
        self.protected = [self.config, self.manifest, self.database]

    def reach(self, *arguments: str, env: list[str] | None = None) -> str | None:
        server = Server(name="fs", command=["node", "server.js", *arguments], env=env or [])
        found = find_operator_file_reach(server, self.protected, cwd=str(self.root))
        return None if found is None else found.protected


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return Layout(tmp_path)


def test_a_file_url_naming_the_configurations_directory_is_refused(layout: Layout) -> None:
    assert layout.reach(f"file://{layout.conf}") == str(layout.config)


def test_a_percent_encoded_file_url_with_a_host_is_refused(layout: Layout) -> None:
    encoded = str(layout.conf).replace("conf", "co%6Ef")
    assert layout.reach(f"file://localhost{encoded}") == str(layout.config)


def test_a_comma_list_in_an_option_value_is_refused(layout: Layout) -> None:
    assert layout.reach(f"--dirs=/etc,{layout.conf}") == str(layout.config)


def test_a_colon_list_is_refused(layout: Layout) -> None:
    assert layout.reach(f"/etc:{layout.conf}") == str(layout.config)


def test_a_semicolon_list_is_refused(layout: Layout) -> None:
    assert layout.reach(f"/etc;{layout.state}") == str(layout.database)


def test_a_short_option_with_its_value_attached_is_refused(layout: Layout) -> None:
    assert layout.reach(f"-r{layout.conf}") == str(layout.config)


def test_a_glob_whose_directory_holds_the_configuration_is_refused(layout: Layout) -> None:
    assert layout.reach("conf/*") == str(layout.config)
    assert layout.reach(f"{layout.root}/co*/x") == str(layout.config)


def test_a_glob_next_to_the_configuration_is_refused(layout: Layout) -> None:
    server = Server(name="fs", command=["node", "server.js", "*.json"])
    found = find_operator_file_reach(server, layout.protected, cwd=str(layout.conf))
    assert found is not None and found.protected == str(layout.config)


def test_a_brace_list_naming_the_configurations_directory_is_refused(layout: Layout) -> None:
    assert layout.reach(f"{layout.root}/{{sandbox,conf}}") == str(layout.config)


def test_code_with_brackets_and_globs_that_match_nothing_protected_still_passes(
    layout: Layout,
) -> None:
    assert layout.reach("-c", "import sys; sys.stderr.write('boom\x1b[2J'); exit(3)") is None
    assert layout.reach("-c", "print({1: sys.argv[1:]})") is None
    assert layout.reach("sand*/x", "*.txt", "s?ate-backup") is None


def test_a_colon_list_in_the_environment_is_refused(layout: Layout) -> None:
    assert layout.reach(env=[f"ROOTS=/etc:{layout.conf}"]) == str(layout.config)


def test_a_file_url_to_the_database_in_the_environment_is_refused(layout: Layout) -> None:
    assert layout.reach(env=[f"X=file://{layout.database}"]) == str(layout.database)


def test_a_path_inside_a_shell_command_is_refused(layout: Layout) -> None:
    assert layout.reach("-c", f"exec serve '{layout.conf}'") == str(layout.config)


def test_a_relative_path_with_dots_and_a_symlink_is_refused(layout: Layout) -> None:
    (layout.sandbox / "innocent").symlink_to(layout.state, target_is_directory=True)
    assert layout.reach("sandbox/innocent") == str(layout.database)
    assert layout.reach("sandbox/../conf") == str(layout.config)


@pytest.mark.parametrize(
    "argument",
    [
        "-y",
        "@modelcontextprotocol/server-filesystem",
        "/usr/bin",
        "--port=8080",
        "-p8080",
        "https://example.com/api?x=1",
        "sandbox",
        "sandbox/*.txt",
        "--roots=/etc,/usr/share",
    ],
)
def test_ordinary_arguments_still_pass(layout: Layout, argument: str) -> None:
    assert layout.reach(argument.replace("sandbox", str(layout.sandbox))) is None
    assert layout.reach(env=[f"ARG={argument}"]) is None


def _write_config(layout: Layout, command: list[str], env: list[str]) -> Path:
    document = {
        "database": str(layout.database),
        "session": "s1",
        "servers": [
            {
                "name": "fs",
                "command": command,
                "env": env,
                "manifest": str(layout.manifest),
                "rules": {},
            }
        ],
    }
    layout.config.write_text(json.dumps(document))
    layout.config.chmod(0o600)
    return layout.config


@pytest.mark.parametrize(
    ("argument", "env"),
    [
        ("file://{conf}", ""),
        ("--dirs=/etc,{conf}", ""),
        ("/etc:{conf}", ""),
        ("-r{conf}", ""),
        ("{conf}/*", ""),
        ("", "ROOTS=/etc:{conf}"),
        ("", "X=file://{db}"),
    ],
)
def test_the_proxy_refuses_each_spelling_that_once_passed(
    layout: Layout, argument: str, env: str
) -> None:
    values = {"conf": layout.conf, "db": layout.database}
    command = [sys.executable, "server.py"] + ([argument.format(**values)] if argument else [])
    environment = [env.format(**values)] if env else []
    with pytest.raises(ConfigError, match="forge an approval"):
        load_config(_write_config(layout, command, environment))


def test_the_proxy_still_starts_a_server_over_a_sibling_directory(layout: Layout) -> None:
    command = ["npx", "-y", "@modelcontextprotocol/server-filesystem", str(layout.sandbox)]
    config = load_config(_write_config(layout, command, [f"ROOTS=/etc:{layout.sandbox}"]))
    assert config.servers[0].server.command == command
    assert os.path.isdir(layout.sandbox)


# The directory holding the operator's files, as people name them: a space
# (macOS's `Application Support`), quotes, separators, and letters outside ASCII.
AWKWARD_NAMES = [
    "Application Support",
    "it's mine",
    'the "best" one',
    "données partagées ☃",
    "a,b;c:d (1)",
]

# Each way an argument or an environment entry hands a server a directory.
SPELLINGS: list[tuple[str, str]] = [
    ("{conf}", ""),
    ("{conf}/", ""),
    ("{conf}/proxy.json", ""),
    ("--root={conf}", ""),
    ("--dirs=/etc,{conf}", ""),
    ("/etc:{conf}", ""),
    ("/etc;{state}", ""),
    ("-r{conf}", ""),
    ("file://{conf}", ""),
    ("{conf}/*", ""),
    ("ls {conf}", ""),
    ("{root}/{{sandbox,conf}}", ""),
    ("", "ROOTS=/etc:{conf}"),
    ("", "X=--root={conf}"),
    ("", "X=file://{db}"),
    ("", "ALLOWED_ROOT={state}"),
]


@pytest.fixture(params=AWKWARD_NAMES)
def awkward(request: pytest.FixtureRequest, tmp_path: Path) -> Layout:
    root = tmp_path / request.param
    root.mkdir()
    return Layout(root)


def _spelled(layout: Layout, template: str) -> str:
    return template.format(
        conf=layout.conf, state=layout.state, db=layout.database, root=layout.root
    )


@pytest.mark.parametrize(("argument", "env"), SPELLINGS)
def test_every_spelling_is_refused_when_the_path_holds_a_space_a_quote_or_unicode(
    awkward: Layout, argument: str, env: str
) -> None:
    arguments = [_spelled(awkward, argument)] if argument else []
    environment = [_spelled(awkward, env)] if env else []
    server = Server(name="fs", command=["node", "server.js", *arguments], env=environment)
    # From `/`, so that no token is refused only for being relative to the layout.
    found = find_operator_file_reach(server, awkward.protected, cwd="/")
    assert found is not None, f"{argument or env} passed"
    assert found.protected in {str(path) for path in awkward.protected}


@pytest.mark.parametrize(
    "command",
    [
        "ls {quoted}",  # a shell's single quotes, 'it'\''s mine' for a quote inside
        "ls {escaped}",  # a shell's backslashes: Application\ Support
        'exec serve "{conf}" --verbose',
        "cd /tmp && ls {conf}/fs.manifest.json",
    ],
)
def test_a_shell_string_quoting_the_path_is_refused(awkward: Layout, command: str) -> None:
    text = command.format(
        conf=awkward.conf,
        quoted=shlex.quote(str(awkward.conf)),
        escaped=re.sub(r"([\s'\"\\(),;:])", r"\\\1", str(awkward.conf)),
    )
    assert awkward.reach("-c", text) is not None


@pytest.mark.parametrize(("on_disk", "written"), [("NFD", "NFC"), ("NFC", "NFD")])
def test_a_path_written_in_the_other_unicode_normalization_is_refused(
    tmp_path: Path, on_disk: Literal["NFC", "NFD"], written: Literal["NFC", "NFD"]
) -> None:
    # macOS opens `données` composed or decomposed as one directory; the guard must too.
    root = tmp_path / unicodedata.normalize(on_disk, "Données partagées")
    root.mkdir()
    layout = Layout(root)
    spelled = unicodedata.normalize(written, f"--root={layout.conf}")
    assert spelled != f"--root={layout.conf}"
    assert layout.reach(spelled) == unicodedata.normalize(written, str(layout.config))


def test_a_link_whose_name_holds_a_space_is_followed(awkward: Layout) -> None:
    # `innocent files` is no component of a protected path: the guard joins the two
    # words because an entry so named exists, then resolves the link.
    (awkward.sandbox / "innocent files").symlink_to(awkward.state, target_is_directory=True)
    assert awkward.reach(f"--root={awkward.sandbox}/innocent files") == str(awkward.database)


@pytest.mark.parametrize(
    "argument",
    [
        "{sandbox}",
        "--root={sandbox}",
        "--dirs={sandbox},/usr/share",
        "/etc:{sandbox}",
        "ls {sandbox} /usr/bin",
        "{root}/conf-backup",
    ],
)
def test_siblings_of_an_awkward_directory_still_pass(awkward: Layout, argument: str) -> None:
    spelled = argument.format(sandbox=awkward.sandbox, root=awkward.root)
    assert awkward.reach(spelled) is None
    assert awkward.reach(env=[f"ARG={spelled}"]) is None


@pytest.mark.parametrize(("argument", "env"), [s for s in SPELLINGS if "{root}" not in s[0]])
def test_the_proxy_refuses_each_spelling_under_application_support(
    tmp_path: Path, argument: str, env: str
) -> None:
    root = tmp_path / "Library" / "Application Support" / "agentrt"
    root.mkdir(parents=True)
    layout = Layout(root)
    command = [sys.executable, "server.py"] + ([_spelled(layout, argument)] if argument else [])
    environment = [_spelled(layout, env)] if env else []
    with pytest.raises(ConfigError, match="forge an approval"):
        load_config(_write_config(layout, command, environment))
