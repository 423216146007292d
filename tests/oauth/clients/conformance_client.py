"""The conformance suite's client command: agentrt's upstream client, as an operator uses it.

`conformance client --command "python conformance_client.py" --scenario auth/...` runs
this with the scenario's server URL as the last argument and, for pre-registration,
client credentials and cross-app access, the client's credentials (a secret, a private
key, an ID token from the scenario's identity provider) in MCP_CONFORMANCE_CONTEXT.  It connects as
`agentrt pin`/`check` do (the proxy's OAuth-carrying HTTP client), lists the tools and
calls the first; when the connection says the server needs `agentrt login NAME` (a 401,
or a 403 asking for a scope not granted), it does what the operator would: runs the
login (the person's browser played by following the authorization server's redirect to
the loopback listener) and tries again, at most three logins in all.

For the other client scenarios (initialize, tools_call, elicitation, sse-retry) it is the
proxy's upstream client with a test host behind it: it advertises form elicitation, and
a server's elicitation during the call is answered by `_host`, which accepts with the
defaults the requested schema names, as a host's form shows them pre-filled (SEP-1034).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
import httpx2

from agentrt.mcp import Server
from agentrt.mcp._connection import connect
from agentrt.mcp._context import CallContext
from agentrt.mcp._login import login
from agentrt.mcp._oauth import oauth_client_factory
from agentrt.mcp._tokens import AuthSettings

CIMD_URL = "https://conformance-test.local/client-metadata.json"
MAX_LOGINS = 3


def _owner_only(directory: Path, name: str, content: str) -> Path:
    path = directory / name
    path.write_text(content)
    path.chmod(0o600)
    return path


def _settings(context: dict[str, Any], directory: Path) -> AuthSettings:
    """The server entry's `auth` an operator would write for the scenario, its secrets
    (a client secret, a private key, the person's ID token) in owner-only files."""
    secret_file = None
    if context.get("client_secret"):
        secret_file = _owner_only(directory, "client.secret", str(context["client_secret"]))
    name = str(context.get("name", ""))
    if name == "auth/cross-app-access-complete-flow":
        return AuthSettings(
            grant="identity_assertion",
            client_id=context.get("client_id"),
            client_secret_file=secret_file,
            idp_token_endpoint=context.get("idp_token_endpoint"),
            idp_client_id=context.get("idp_client_id"),
            id_token_file=_owner_only(directory, "id.token", str(context["idp_id_token"])),
        )
    if name.startswith("auth/client-credentials"):
        key_file = None
        if context.get("private_key_pem"):
            key_file = _owner_only(directory, "client.key", str(context["private_key_pem"]))
        return AuthSettings(
            grant="client_credentials",
            client_id=context.get("client_id"),
            client_secret_file=secret_file,
            private_key_file=key_file,
            alg=context.get("signing_algorithm"),
        )
    return AuthSettings(
        client_id=context.get("client_id"),
        client_secret_file=secret_file,
        client_metadata_url=CIMD_URL,
    )


async def _browser(url: str) -> None:
    """The person's browser: the authorization server approves at once and redirects."""
    async with httpx2.AsyncClient(follow_redirects=False, timeout=10) as browser:
        response = await browser.get(url)
        for _ in range(5):
            location = response.headers.get("location")
            if response.status_code not in (301, 302, 303, 307, 308) or location is None:
                return
            response = await browser.get(location)


async def _host(method: str, params: Any) -> dict[str, Any]:
    """The test host: accept an elicitation with every default its form would show."""
    if method != "elicitation/create" or not isinstance(params, dict):
        raise ValueError(f"the test host does not answer {method}")
    schema = params.get("requestedSchema") or {}
    properties = schema.get("properties") or {}
    content = {
        name: field["default"]
        for name, field in properties.items()
        if isinstance(field, dict) and "default" in field
    }
    return {"action": "accept", "content": content}


async def main(url: str) -> int:
    # The tokens and registrations of this one run, removed with it.
    with tempfile.TemporaryDirectory(prefix="agentrt-conformance-") as directory:
        return await _connect_and_call(url, Path(directory))


async def _connect_and_call(url: str, directory: Path) -> int:
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT", "{}") or "{}")
    os.environ["XDG_STATE_HOME"] = str(directory / "state")
    settings = _settings(context, directory)
    logins = 0
    while True:
        try:
            connection = await connect(
                Server(
                    name="conformance",
                    endpoint=url,
                    http_client_factory=oauth_client_factory("conformance", url),
                    client_capabilities={"elicitation": {"form": {}}},
                )
            )
            try:
                tools = await connection.list_tools()
                if tools:
                    await connection.call_tool(
                        tools[0].name, "{}", timeout=10, context=CallContext(ask=_host)
                    )
            finally:
                await connection.aclose()
            print(f"listed {len(tools)} tools and called the first after {logins} login(s)")
            return 0
        except Exception as exc:
            text = str(exc)
            if "agentrt login" not in text:
                print(f"failed: {text}", file=sys.stderr)
                return 1
            if logins >= MAX_LOGINS:
                print(f"gave up after {logins} logins: {text}", file=sys.stderr)
                return 1
            print(f"login needed: {text}", file=sys.stderr)
        logins += 1
        async with anyio.create_task_group() as group:

            def show(address: str) -> None:
                group.start_soon(_browser, address)

            await login("conformance", url, settings, show_url=show, timeout=20)


if __name__ == "__main__":
    sys.exit(anyio.run(main, sys.argv[-1]))
