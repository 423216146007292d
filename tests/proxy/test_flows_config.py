"""Labels and flow rules in proxy.json: what loads, and every refusal naming the thing."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from test_proxy_config import base, write_config

from agentrt import Outcome
from agentrt.proxy import ConfigError, load_config
from agentrt.proxy._flows import FlowRule

TRIFECTA = {"after": ["private", "untrusted"], "call": "egress", "outcome": "require_approval"}


def _labelled(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    document = copy.deepcopy(base(tmp_path, **overrides))  # base shares its rules
    document["servers"][0]["labels"] = ["private"]
    return document


def test_labels_and_flow_rules_load(tmp_path: Path) -> None:
    document = _labelled(
        tmp_path,
        labels={"customer-data": "rows of the customer database"},
        policy={"read_only": "allow", "flows": [TRIFECTA]},
    )
    document["servers"][0]["rules"] = {
        "read_file": {"side_effect": "read_only", "labels": ["customer-data"]}
    }
    config = load_config(write_config(tmp_path, document))
    assert config.labelled
    assert config.servers[0].labels == ("private",)
    assert config.servers[0].tool_rules["read_file"].labels == ("customer-data",)
    assert config.flows.rules == (
        FlowRule(("private", "untrusted"), "egress", Outcome.REQUIRE_APPROVAL),
    )
    assert config.flows.labels["customer-data"] == "rows of the customer database"
    # The flows are taken out of the class policy, which is still read as before.
    assert dict(config.policy.outcomes) == {"read_only": Outcome.ALLOW}


def test_a_configuration_without_labels_is_not_labelled(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, base(tmp_path, policy={"flows": [TRIFECTA]})))
    assert not config.labelled


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda d: d["servers"][0].update(labels=["secret"]), 'names the label "secret"'),
        (lambda d: d["servers"][0].update(labels=["egres"]), 'names the label "egres"'),
        (lambda d: d["servers"][0].update(labels="private"), "must be a list of strings"),
        (lambda d: d["servers"][0].update(labels=["private", "private"]), "names a label twice"),
        (
            lambda d: d["servers"][0]["rules"]["read_file"].update(labels=["nope"]),
            'rule "read_file" labels names the label "nope"',
        ),
        (lambda d: d.update(labels={"private": "mine"}), "is a built-in label"),
        (lambda d: d.update(labels={"Bad Name": "x"}), "must be 1 to 32 lowercase"),
        (lambda d: d.update(labels={"mine": ""}), "must say in words what the label means"),
        (lambda d: d.update(labels=["mine"]), "must be an object of label name"),
        (
            lambda d: d.update(policy={"flows": [{**TRIFECTA, "after": ["privat"]}]}),
            'policy.flows[0].after names the label "privat"',
        ),
        (
            lambda d: d.update(policy={"flows": [{**TRIFECTA, "call": "exfil"}]}),
            'policy.flows[0].call names the label "exfil"',
        ),
        (
            lambda d: d.update(policy={"flows": [{**TRIFECTA, "outcome": "allow"}]}),
            "would loosen a decision",
        ),
        (
            lambda d: d.update(policy={"flows": [{**TRIFECTA, "outcome": "abort"}]}),
            "must be require_approval or deny",
        ),
        (
            lambda d: d.update(policy={"flows": [{**TRIFECTA, "after": []}]}),
            "must name at least one label",
        ),
        (
            lambda d: d.update(policy={"flows": [{**TRIFECTA, "unless": "x"}]}),
            "policy.flows[0].unless is not a field",
        ),
        (lambda d: d.update(policy={"flows": {"after": []}}), "must be a list of flow rules"),
        (lambda d: d.update(stateless_session="a b"), "stateless_session must be 1 to 128"),
    ],
)
def test_a_wrong_label_or_flow_rule_is_refused_at_load_naming_it(
    tmp_path: Path, change: Any, named: str
) -> None:
    document = _labelled(tmp_path)
    change(document)
    with pytest.raises(ConfigError) as refused:
        load_config(write_config(tmp_path, document))
    message = str(refused.value)
    assert named in message, message
    assert "\n" not in message


def test_a_label_name_from_the_file_is_escaped_in_the_refusal(tmp_path: Path) -> None:
    document = _labelled(tmp_path)
    document["servers"][0]["labels"] = ["\x1b[31mred"]
    with pytest.raises(ConfigError) as refused:
        load_config(write_config(tmp_path, document))
    assert "\x1b" not in str(refused.value)
