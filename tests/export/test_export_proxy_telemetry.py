"""`agentrt proxy` with `"telemetry"` in proxy.json: a host's call becomes spans at a receiver."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from otlp_receiver import otlp_receiver

sys.path.insert(0, str(Path(__file__).parents[1] / "proxy"))
from proxy_helpers import build_setup, host, text_of

from agentrt.proxy.config import ConfigError, TelemetryConfig, load_config

SECRET = "echo-text-that-stays-home"


@pytest.mark.anyio
@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("source", ["proxy.json", "OTEL_EXPORTER_OTLP_ENDPOINT"])
async def test_a_proxied_call_reaches_the_receiver_as_mcp_spans_without_its_text(
    tmp_path: Path, source: str
) -> None:
    with otlp_receiver() as receiver:
        if source == "proxy.json":
            setup = await build_setup(tmp_path, telemetry={"otlp_endpoint": receiver.url})
        else:
            setup = await build_setup(tmp_path)
            environment = {**setup.environment(), source: receiver.url}
            setup.environment = lambda: environment  # type: ignore[method-assign]
        async with host(setup) as session:
            result = await session.call_tool("up_echo", {"text": SECRET})
            assert text_of(result) == SECRET
        spans = receiver.snapshot()
    assert "Traceback" not in setup.stderr()
    (root,) = [span for span in spans if span.name == "invoke_agent agentrt"]
    assert root.attributes["mcp.session.id"] == "test-session"
    assert root.service_name == "agentrt-proxy"
    (step,) = [span for span in spans if span.name == "tools/call up_echo"]
    assert step.kind == 2 and step.parent_span_id == root.span_id  # SPAN_KIND_SERVER
    assert step.attributes["mcp.method.name"] == "tools/call"
    assert step.attributes["agentrt.side_effect"] == "read_only"
    (tool,) = [span for span in spans if span.name == "execute_tool up_echo"]
    assert tool.parent_span_id == step.span_id
    assert tool.attributes["gen_ai.tool.name"] == "up_echo"
    for span in spans:
        assert all(SECRET not in str(value) for value in span.attributes.values())


@pytest.mark.anyio
async def test_the_telemetry_object_is_checked_naming_its_field(tmp_path: Path) -> None:
    setup = await build_setup(tmp_path)
    assert load_config(setup.config_path).telemetry == TelemetryConfig()
    setup.rewrite(telemetry={"otlp_endpoint": "http://127.0.0.1:4318", "content": True})
    assert load_config(setup.config_path).telemetry == TelemetryConfig(
        "http://127.0.0.1:4318", True
    )
    for telemetry, problem in [
        ({"content": "yes"}, "telemetry.content must be true or false"),
        ({"otlp_endpoint": "file:///etc/passwd"}, "must be an http:// or https:// URL"),
        ({"endpoint": "http://x"}, "telemetry.endpoint is not a field this file may have"),
        ("http://x", "telemetry must be a JSON object"),
    ]:
        setup.rewrite(telemetry=telemetry)
        with pytest.raises(ConfigError, match=problem):
            load_config(setup.config_path)
