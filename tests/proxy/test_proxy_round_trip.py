"""The proxy driven as a host drives it: list, call, approve, duplicate, reject, expire."""

from __future__ import annotations

import pytest
from proxy_helpers import ProxySetup, host, text_of

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


async def test_the_host_sees_only_loaded_tools_and_one_gate_status(setup: ProxySetup) -> None:
    async with host(setup) as session:
        listing = await session.list_tools()
    names = sorted(tool.name for tool in listing.tools)
    assert names == ["gate_status", "up_echo", "up_fail", "up_send_mail", "up_write_note"]
    status = next(tool for tool in listing.tools if tool.name == "gate_status")
    assert "never runs" in (status.description or "")
    assert "already taken" in setup.stderr()


async def test_a_read_only_call_runs_and_answers_the_result(setup: ProxySetup) -> None:
    async with host(setup) as session:
        result = await session.call_tool("up_echo", {"text": "hello"})
    assert text_of(result) == "hello"
    assert result.is_error is False
