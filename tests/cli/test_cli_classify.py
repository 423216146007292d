"""`agentrt classify`: the operator's classes written as rules, asked or set on the line.

The configuration names the real test server of `cli_mcp_server.py`: one
tool claims read-only, one claims destructive, one has a hostile description.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from agentrt.cli import cli
from agentrt.proxy.config import load_config

SERVER_SCRIPT = Path(__file__).with_name("cli_mcp_server.py")

pytestmark = pytest.mark.timeout(90)


def run(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input)


class Setup:
    """A pinned configuration with no rules yet, the way `agentrt init` leaves one."""

    def __init__(self, directory: Path, *, rules: object = None) -> None:
        marks = directory / "marks"
        marks.mkdir()
        self.config = directory / "proxy.json"
        server: dict[str, object] = {
            "name": "things",
            "command": [sys.executable, str(SERVER_SCRIPT), str(marks)],
            "manifest": "things.manifest.json",
            "note": "kept as written",
        }
        if rules is not None:
            server["rules"] = rules
        self.document = {"database": "runs.db", "session": "cls", "hold": "5s", "servers": [server]}
        self.config.write_text(json.dumps(self.document, indent=4))
        os.chmod(self.config, 0o600)
        pinned = run("pin", "--config", str(self.config))
        assert pinned.exit_code == 0, pinned.output

    def classify(self, *args: str, input: str | None = None) -> Result:
        return run("classify", "--config", str(self.config), *args, input=input)

    def rules(self) -> dict[str, object]:
        server = json.loads(self.config.read_text())["servers"][0]
        rules: dict[str, object] = server.get("rules", {})
        return rules


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return Setup(tmp_path)


def test_set_writes_the_rule_and_keeps_everything_else_in_the_file(setup: Setup) -> None:
    result = setup.classify("--set", "things.read_thing=read-only")
    assert result.exit_code == 0, result.output
    document = json.loads(setup.config.read_text())
    assert setup.rules() == {"read_thing": {"side_effect": "read_only"}}
    del document["servers"][0]["rules"]
    assert document == setup.document
    checked = run("check", "--config", str(setup.config))
    assert "things: registered read_thing as things_read_thing (read_only)" in checked.output


def test_classify_interactively_through_standard_input(setup: Setup) -> None:
    # Tools come sorted: read_thing, shout, write_thing.  shout is skipped;
    # write_thing's destructive hint contradicts local_mutation, and the
    # operator accepts the contradiction.
    result = setup.classify(input="r\ns\nl\ny\nprivate\n")
    assert result.exit_code == 0, result.output
    assert "  description: Loud \\x1b[31mred\\x1b[0m text \\u202etxt.exe" in result.output
    assert "\x1b" not in result.output and "\u202e" not in result.output
    assert "  parameters: id (string), text (string)" in result.output
    assert (
        "  the server claims (claims classify nothing): readOnlyHint=false destructiveHint=true"
    ) in result.output
    assert (
        "  the hints contradict that: classified local_mutation, but the server claims "
        "destructiveHint"
    ) in result.output
    assert setup.rules() == {
        "read_thing": {"side_effect": "read_only"},
        "write_thing": {"side_effect": "local_mutation", "allow_hint_mismatch": True},
    }
    # The server's labels are asked once, after its tools; a hint never sets one.
    assert json.loads(setup.config.read_text())["servers"][0]["labels"] == ["private"]
    again = setup.classify(input="s\n")
    assert again.exit_code == 0, again.output
    # Only the tool still without a rule is asked about, and the labels not again.
    assert "things.shout" in again.output and "things.read_thing" not in again.output
    assert "labels of server" not in again.output


def test_declining_a_hint_contradiction_asks_the_class_again(setup: Setup) -> None:
    result = setup.classify(input="s\ns\nl\nn\nd\n\n")
    assert result.exit_code == 0, result.output
    assert setup.rules() == {"write_thing": {"side_effect": "destructive"}}


def test_stopping_midway_writes_nothing(setup: Setup) -> None:
    before = setup.config.read_bytes()
    result = setup.classify(input="r\n")
    assert result.exit_code == 1
    assert "stopped; nothing was written" in result.output
    assert setup.config.read_bytes() == before


@pytest.mark.parametrize(
    ("assignment", "sentence"),
    [
        (
            "things.nope=read_only",
            'agentrt: --set things.nope=read_only: server "things" has no pinned tool "nope"\n',
        ),
        (
            "tickets.read_thing=read_only",
            "agentrt: --set tickets.read_thing=read_only names no server of this "
            "configuration (it has: things)\n",
        ),
        (
            "things.read_thing=harmless",
            "agentrt: --set things.read_thing=harmless: 'harmless' is not a class "
            "(read_only, local_mutation, remote_mutation, destructive)\n",
        ),
        (
            "things.write_thing=local_mutation",
            "agentrt: --set things.write_thing=local_mutation: classified local_mutation, but "
            "the server claims destructiveHint; pass --allow-hint-mismatch to classify it so "
            "anyway\n",
        ),
    ],
)
def test_a_wrong_set_is_refused_in_one_sentence_and_nothing_is_written(
    setup: Setup, assignment: str, sentence: str
) -> None:
    before = setup.config.read_bytes()
    # A good entry beside the bad one is not written either.
    result = setup.classify("--set", "things.read_thing=read_only", "--set", assignment)
    assert result.exit_code == 1
    assert result.output == sentence
    assert setup.config.read_bytes() == before


def test_allow_hint_mismatch_and_rename_are_recorded_and_reach_the_load(setup: Setup) -> None:
    result = setup.classify(
        "--set",
        "things.write_thing=local_mutation",
        "--allow-hint-mismatch",
        "--rename",
        "things.write_thing=save_thing",
    )
    assert result.exit_code == 0, result.output
    assert setup.rules() == {
        "write_thing": {
            "side_effect": "local_mutation",
            "allow_hint_mismatch": True,
            "rename": "save_thing",
        }
    }
    checked = run("check", "--config", str(setup.config))
    assert "registered write_thing as save_thing (local_mutation); hint mismatch" in checked.output


def test_rename_of_an_unclassified_tool_or_to_a_bad_name_is_refused(setup: Setup) -> None:
    before = setup.config.read_bytes()
    first = setup.classify("--rename", "things.shout=yell")
    assert first.output == (
        "agentrt: --rename things.shout=yell: the tool has no class yet; --set it first\n"
    )
    second = setup.classify("--set", "things.shout=read_only", "--rename", "things.shout=a b")
    assert second.output.startswith("agentrt: --rename things.shout=a b: a name must match")
    assert setup.config.read_bytes() == before


def test_rules_in_a_separate_file_are_written_there(tmp_path: Path) -> None:
    rules_file = tmp_path / "things.rules.json"
    rules_file.write_text('{"read_thing": {"side_effect": "read_only", "timeout": "5s"}}')
    os.chmod(rules_file, 0o600)
    setup = Setup(tmp_path, rules=rules_file.name)
    before = setup.config.read_bytes()
    result = setup.classify("--set", "things.shout=read_only", "--allow-hint-mismatch")
    assert result.exit_code == 0, result.output
    # shout claims no hints, so there is no contradiction to record.
    assert json.loads(rules_file.read_text()) == {
        "read_thing": {"side_effect": "read_only", "timeout": "5s"},
        "shout": {"side_effect": "read_only"},
    }
    assert setup.config.read_bytes() == before
    assert os.stat(rules_file).st_mode & 0o777 == 0o600


def test_classify_keeps_every_number_in_the_file_exactly_as_the_load_reads_it(
    tmp_path: Path,
) -> None:
    # A fixed value beyond a float's precision, and one beyond its range: the
    # load keeps each literal's digits, so a rewrite must not round them.
    setup = Setup(tmp_path, rules={"write_thing": {"side_effect": "local_mutation"}})
    text = setup.config.read_text().replace(
        '"side_effect": "local_mutation"',
        '"side_effect": "local_mutation", "allow_hint_mismatch": true, '
        '"fixed": {"id": 12345678901234567890.5, "text": 1e400}',
    )
    setup.config.write_text(text)
    before = load_config(setup.config).servers[0].rules["write_thing"]
    assert before.fixed == {"id": "12345678901234567890.5", "text": "1e400"}
    result = setup.classify("--set", "things.read_thing=read_only")
    assert result.exit_code == 0, result.output
    after = load_config(setup.config).servers[0].rules
    assert after["write_thing"] == before
    assert after["read_thing"].side_effect == "read_only"
    assert "12345678901234567890.5" in setup.config.read_text()


def test_a_rename_ending_in_a_newline_is_refused_and_nothing_is_written(setup: Setup) -> None:
    # A regular expression's "$" also matches before a final newline; the
    # name the model sees must be exactly the characters MCP allows.
    before = setup.config.read_bytes()
    result = setup.classify(
        "--set", "things.read_thing=read_only", "--rename", "things.read_thing=look\n"
    )
    assert result.exit_code != 0
    assert "a name must match" in result.output
    assert setup.config.read_bytes() == before


def test_a_hand_written_rename_ending_in_a_newline_does_not_register(tmp_path: Path) -> None:
    setup = Setup(tmp_path, rules={"read_thing": {"side_effect": "read_only", "rename": "look\n"}})
    checked = run("check", "--config", str(setup.config))
    assert "registered read_thing as look" not in checked.output, checked.output
    assert "refused read_thing" in checked.output, checked.output


def test_label_sets_a_servers_labels_and_an_unknown_one_is_refused_writing_nothing(
    setup: Setup,
) -> None:
    before = setup.config.read_bytes()
    refused = setup.classify("--label", "things=private,secret")
    assert refused.exit_code == 1
    assert "'secret' is not a label" in refused.output
    assert setup.config.read_bytes() == before
    result = setup.classify("--label", "things=untrusted")
    assert result.exit_code == 0, result.output
    assert json.loads(setup.config.read_text())["servers"][0]["labels"] == ["untrusted"]


def test_an_unknown_label_typed_at_the_prompt_is_asked_again(setup: Setup) -> None:
    result = setup.classify(input="s\ns\ns\negres\negress\n")
    assert result.exit_code == 0, result.output
    assert "'egres' is not a label" in result.output
    assert json.loads(setup.config.read_text())["servers"][0]["labels"] == ["egress"]
