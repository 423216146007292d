"""`agentrt login`: authorize agentrt for a remote server, or show which servers wait for it.

`agentrt login SERVER --config FILE` runs the OAuth flow of that server's
entry (docs/oauth.md): it prints the authorization URL, opens it in the
person's browser (unless `--no-browser`), waits for the answer on a
loopback port, and stores the tokens in the server's owner-only token file.
A running proxy reads them on its next call to that server: no restart.

`agentrt login --status --config FILE` lists each remote server with
whether it has tokens, until when, and for which scope; never a token.
"""

from __future__ import annotations

import logging
import time
import webbrowser
from datetime import UTC, datetime

import anyio
import click

from ..errors import AgentrtError
from ..sanitize import sanitize
from ._app import EXIT_UNUSABLE, CommandError, Settings
from ._servers import _config_option, _load_config, _selected

__all__ = ["login"]


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "no expiry given"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@click.command(short_help="Authorize agentrt for a remote server (OAuth), or show logins.")
@_config_option
@click.argument("server_name", metavar="[SERVER]", required=False)
@click.option("--status", is_flag=True, help="Show each remote server's login; change nothing.")
@click.option("--no-browser", is_flag=True, help="Only print the URL; open no browser.")
@click.option(
    "--timeout",
    type=float,
    default=300.0,
    show_default=True,
    help="Seconds to wait for the browser's answer.",
)
@click.pass_obj
def login(
    settings: Settings,
    config_path: str,
    server_name: str | None,
    status: bool,
    no_browser: bool,
    timeout: float,
) -> None:
    """Log in to SERVER (its OAuth flow in your browser); its tokens are kept owner-only."""
    from ..mcp._login import LoginError
    from ..mcp._login import login as run_login
    from ..mcp._oauth import canonical_resource
    from ..mcp._tokens import AuthSettings, TokenStoreError, token_file

    config = _load_config(config_path)
    output = settings.output
    remote = [
        upstream
        for upstream in _selected(config, server_name)
        if upstream.server.endpoint is not None
    ]
    if status:
        for upstream in remote:
            name = upstream.server.name
            assert upstream.server.endpoint is not None
            file = token_file(name, canonical_resource(upstream.server.endpoint))
            try:
                record = file.read()
            except TokenStoreError as error:
                state, detail = "unusable", sanitize(str(error))
            else:
                if record is None:
                    state, detail = "no login", f"run: agentrt login {sanitize(name)} --config ..."
                elif record.expires_at is not None and record.expires_at < time.time():
                    refresh = "a refresh token" if record.refresh_token else "no refresh token"
                    state, detail = "expired", f"since {_when(record.expires_at)}, {refresh}"
                else:
                    state, detail = "logged in", f"until {_when(record.expires_at)}"
                if record is not None:
                    detail += f"; scope {sanitize(record.scope or '(none named)')}"
                    if record.wanted_scope:
                        detail += f"; a server asked for {sanitize(record.wanted_scope)}"
            if output.json:
                output.record({"record": "login", "server": name, "state": state})
            else:
                output.line(f'server "{sanitize(name)}": {state} ({detail})')
        if not remote:
            output.line("no server in this configuration is reached over HTTP")
        return
    if server_name is None:
        raise CommandError("name the server to log in to, or pass --status", EXIT_UNUSABLE)
    if not remote:
        raise CommandError(
            f'server "{sanitize(server_name)}" is not reached over HTTP; only a remote '
            "server has a login",
            EXIT_UNUSABLE,
        )
    upstream = remote[0]
    if "headers" in _headers_note(upstream):
        raise CommandError(
            f'server "{sanitize(server_name)}" sends static headers; remove them to use a login',
            EXIT_UNUSABLE,
        )
    endpoint = upstream.server.endpoint
    assert endpoint is not None
    auth = upstream.auth if upstream.auth is not None else AuthSettings()

    def show(url: str) -> None:
        click.echo("Open this URL in your browser to authorize agentrt:", err=True)
        click.echo(url, err=True)
        if not no_browser:
            webbrowser.open(url)

    # The SDK logs its flow's failures with their tracebacks (a state, a server's body);
    # the one sentence below says what failed.
    quiet = logging.getLogger("mcp.client.auth")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    try:
        record = anyio.run(
            lambda: run_login(server_name, endpoint, auth, show_url=show, timeout=timeout)
        )
    except (LoginError, AgentrtError) as error:
        raise CommandError(sanitize(str(error))) from None
    if output.json:
        output.record({"record": "login", "server": server_name, "state": "logged in"})
    else:
        output.line(
            f'server "{sanitize(server_name)}": logged in until {_when(record.expires_at)} '
            f"(scope {sanitize(record.scope or '(none named)')}); a running proxy uses the "
            "new tokens on its next call"
        )


def _headers_note(upstream: object) -> str:
    """'headers' when the server's client is the static-headers one (not OAuth)."""
    from ..mcp._oauth import OAuthClientFactory

    factory = getattr(getattr(upstream, "server", None), "http_client_factory", None)
    return "" if isinstance(factory, OAuthClientFactory) else "headers"
