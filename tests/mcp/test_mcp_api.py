"""The public names of agentrt.mcp, as mcp.md fixes them."""

from __future__ import annotations

import pytest

import agentrt.mcp
from agentrt import SideEffect
from agentrt.mcp import Server


def test_the_public_api_exports_every_name_the_spec_fixes() -> None:
    required = {
        "Server", "Rule", "Rules", "Manifest", "PinnedTool", "Report", "Registration",
        "Refusal", "Connection", "pin", "load", "read_owned", "owned_privately",
        "read_manifest", "read_rules", "FileRule", "MAX_TOOL_PAGES", "MAX_TOOLS",
        "DEFAULT_MAX_CONTENT_BYTES", "MAX_RESPONSE_BODY_BYTES",
    }  # fmt: skip
    assert required <= set(agentrt.mcp.__all__)
    for name in agentrt.mcp.__all__:
        assert hasattr(agentrt.mcp, name), name


def test_the_bounds_have_the_values_the_spec_gives() -> None:
    assert agentrt.mcp.MAX_TOOL_PAGES == 100
    assert agentrt.mcp.MAX_TOOLS == 1000
    assert agentrt.mcp.DEFAULT_MAX_CONTENT_BYTES == 64 * 1024
    assert agentrt.mcp.MAX_RESPONSE_BODY_BYTES == 16 * 1024 * 1024


def test_side_effects_serialize_as_snake_case() -> None:
    assert [str(effect) for effect in SideEffect] == [
        "read_only",
        "local_mutation",
        "remote_mutation",
        "destructive",
    ]


@pytest.mark.parametrize(
    ("field", "value"),
    [("inherit_env", ["TOKEN\n"]), ("env", ["TOKEN\n=x"]), ("inherit_env", ["1TOKEN"])],
)
def test_a_variable_name_with_a_final_newline_or_a_leading_digit_is_refused(
    field: str, value: list[str]
) -> None:
    with pytest.raises(ValueError, match="is not"):
        Server(name="s", command=["true"], **{field: value})
