"""Where spans go: the telemetry settings from a configuration and the standard variables.

Apart from the exporter, so a program that reads its settings and finds telemetry off
(the proxy, by default) imports neither the exporter nor what it follows the store with.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["TelemetrySettings", "settings_from"]

_TRACES_PATH: Final = "/v1/traces"


@dataclass(frozen=True, slots=True)
class TelemetrySettings:
    """Where spans go (`traces_url`, the full OTLP/HTTP traces URL), under which service name,
    and whether arguments and results go with them (`content`, off unless the operator opts in)."""

    traces_url: str
    service_name: str = "agentrt"
    content: bool = False


def settings_from(
    config: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    default_service: str = "agentrt",
) -> TelemetrySettings | None:
    """Telemetry settings from a configuration's `telemetry` object and the standard variables.

    The configuration's `otlp_endpoint` (a base URL, like
    `OTEL_EXPORTER_OTLP_ENDPOINT`) wins; else `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
    (a full URL) or `OTEL_EXPORTER_OTLP_ENDPOINT` (a base URL, `/v1/traces`
    appended).  `OTEL_SERVICE_NAME` names the service.  None when no
    endpoint is set anywhere: telemetry is off.
    """
    env = os.environ if environ is None else environ
    config = config or {}
    base = config.get("otlp_endpoint")
    if isinstance(base, str) and base:
        url = base.rstrip("/") + _TRACES_PATH
    elif env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        url = env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    elif env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        url = env["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + _TRACES_PATH
    else:
        return None
    service = env.get("OTEL_SERVICE_NAME") or default_service
    return TelemetrySettings(url, service, bool(config.get("content", False)))
