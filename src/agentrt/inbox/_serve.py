"""Listening: the address, the token, TLS for a remote listener, and the server's lifetime.

Loopback only unless the operator says `--allow-remote` and gives TLS
material: the token travels in a header, and over plain HTTP on a network
anyone on the path could read it.  The token is fresh on each start, or kept
in an owner-only file the operator names.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import shutil
import socket
import ssl
import stat
import subprocess
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio
import uvicorn

from ..errors import AgentrtError
from ..sanitize import sanitize
from ..store import ApprovalRecord, Store
from ._app import InboxState, create_app
from ._views import ToolInfo

if TYPE_CHECKING:
    from ..passkeys import PasskeyMode

__all__ = [
    "DEFAULT_LISTEN",
    "InboxError",
    "Listener",
    "notify_waiting",
    "parse_listen",
    "read_or_create_token",
    "running_inbox",
]

DEFAULT_LISTEN: Final = "127.0.0.1:0"
_TOKEN_BYTES: Final = 32
# Compared with what the operator asked for, never bound by default.
_EVERY_INTERFACE: Final = frozenset({"0.0.0.0", "::"})  # noqa: S104


class InboxError(AgentrtError):
    """The inbox cannot start as asked; the message names what to change."""


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Listener:
    """Where the inbox listens, and with which TLS material (required off loopback)."""

    host: str
    port: int
    tls_cert: Path | None = None
    tls_key: Path | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert is not None else "http"

    @property
    def loopback(self) -> bool:
        return _is_loopback(self.host)


def parse_listen(
    text: str,
    *,
    allow_remote: bool = False,
    tls_cert: str | None = None,
    tls_key: str | None = None,
) -> Listener:
    """`HOST:PORT` checked: a non-loopback host needs `allow_remote` and both TLS files."""
    host, colon, port_text = text.rpartition(":")
    host = host.strip("[]")
    if not colon or not host or not port_text.isdecimal() or int(port_text) > 65535:
        raise InboxError(f"--listen {sanitize(text)} is not HOST:PORT (for example 127.0.0.1:0)")
    if (tls_cert is None) != (tls_key is None):
        raise InboxError("TLS needs both --tls-cert and --tls-key")
    if not _is_loopback(host):
        if not allow_remote:
            raise InboxError(
                f"--listen {sanitize(text)} is not a loopback address; serving other hosts "
                "needs --allow-remote with --tls-cert and --tls-key"
            )
        if tls_cert is None:
            raise InboxError(
                f"--listen {sanitize(text)} is not a loopback address; a remote inbox needs "
                "--tls-cert and --tls-key, or its token would cross the network in the clear"
            )
    return Listener(
        host,
        int(port_text),
        Path(tls_cert) if tls_cert is not None else None,
        Path(tls_key) if tls_key is not None else None,
    )


def read_or_create_token(path: str | os.PathLike[str]) -> str:
    """The token kept in `path`, created owner-only (0600) with a fresh token if missing.

    An existing file must be a regular file, the user's own, and readable by
    nobody else: whoever reads the token can decide approvals.
    """
    token_path = Path(path)
    shown = sanitize(str(token_path))
    flags = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(token_path, flags)
    except FileNotFoundError:
        token = secrets.token_urlsafe(_TOKEN_BYTES)
        create = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        try:
            descriptor = os.open(token_path, create, 0o600)
        except OSError as exc:
            raise InboxError(f"cannot create the token file {shown}: {exc.strerror}") from None
        try:
            os.fchmod(descriptor, 0o600)
            os.write(descriptor, (token + "\n").encode())
        finally:
            os.close(descriptor)
        return token
    except OSError as exc:
        if token_path.is_symlink():
            raise InboxError(f"the token file {shown} is a symbolic link; name the file") from None
        raise InboxError(f"cannot read the token file {shown}: {exc.strerror}") from None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise InboxError(f"the token file {shown} is not a regular file")
        if info.st_uid != os.geteuid():
            raise InboxError(f"the token file {shown} is owned by another user")
        if stat.S_IMODE(info.st_mode) & 0o077:
            raise InboxError(
                f"the token file {shown} can be read or written by others (mode "
                f"{stat.S_IMODE(info.st_mode):04o}); whoever reads it can decide approvals: "
                "chmod 600 it"
            )
        data = os.read(descriptor, 4096)
    finally:
        os.close(descriptor)
    token = data.decode("ascii", "replace").strip()
    if len(token) < 32 or not all(char.isalnum() or char in "-_" for char in token):
        raise InboxError(
            f"the token file {shown} does not hold a token (32 or more letters, digits, - or _)"
        )
    return token


def _allowed_hosts(listener: Listener, port: int) -> frozenset[str] | None:
    if listener.host in _EVERY_INTERFACE:
        # Every interface: the machine's names are not known here, so any Host
        # is answered; the token (over TLS) and the Origin check still hold.
        return None
    hosts = {f"{listener.host}:{port}"}
    if ":" in listener.host:
        hosts = {f"[{listener.host}]:{port}"}
    if _is_loopback(listener.host):
        hosts |= {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"}
    return frozenset(hosts)


def _bind(listener: Listener) -> socket.socket:
    family = socket.AF_INET6 if ":" in listener.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((listener.host, listener.port))
        sock.listen(64)
        sock.set_inheritable(False)
    except OSError as exc:
        sock.close()
        raise InboxError(
            f"cannot listen on {sanitize(listener.host)}:{listener.port}: {exc.strerror}"
        ) from None
    return sock


def _check_tls(cert: Path, key: Path) -> None:
    """Load the certificate and key once, so a bad pair is one sentence before listening."""
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InboxError(
            f"cannot use the TLS certificate {sanitize(str(cert))} with the key "
            f"{sanitize(str(key))}: {sanitize(reason)}"
        ) from None


@dataclass(frozen=True, slots=True)
class RunningInbox:
    """A started inbox: its address without the token, and with it (for the operator only)."""

    address: str
    token: str

    @property
    def address_with_token(self) -> str:
        return f"{self.address}#token={self.token}"


class _Server(uvicorn.Server):
    # The owner of the process handles signals (the command or the proxy);
    # uvicorn re-raising one would end it before its cleanup ran.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def running_inbox(
    store: Store,
    listener: Listener,
    *,
    token: str | None = None,
    login: str = "",
    tools: Mapping[str, ToolInfo] | None = None,
    passkeys: PasskeyMode | None = None,
) -> AsyncIterator[RunningInbox]:
    """Serve the inbox for `store` on `listener` while the block runs.

    With `passkeys`, a decision needs an approver's passkey, the database is marked so
    (the command's `approve` is refused there), and the address is http://localhost:PORT:
    a browser refuses an IP address as a WebAuthn relying party."""
    if passkeys is not None:
        if not listener.loopback or listener.tls_cert is not None:
            raise InboxError(
                "an inbox in passkey mode listens on loopback without TLS, at "
                "http://localhost:PORT (the passkeys' relying party)"
            )
        from ..store import enable_passkey_mode

        enable_passkey_mode(store)
    if listener.tls_cert is not None and listener.tls_key is not None:
        _check_tls(listener.tls_cert, listener.tls_key)
    sock = _bind(listener)
    port = sock.getsockname()[1]
    chosen = token or secrets.token_urlsafe(_TOKEN_BYTES)
    state = InboxState(
        store=store,
        token=chosen,
        allowed_hosts=_allowed_hosts(listener, port),
        scheme=listener.scheme,
        login=login,
        tools=dict(tools or {}),
        passkeys=passkeys,
    )
    options: dict[str, Any] = {}
    if listener.tls_cert is not None and listener.tls_key is not None:
        options = {"ssl_certfile": str(listener.tls_cert), "ssl_keyfile": str(listener.tls_key)}
    config = uvicorn.Config(
        create_app(state),
        log_level="warning",
        access_log=False,  # no request line is ever logged
        lifespan="off",
        server_header=False,
        timeout_graceful_shutdown=1,
        **options,
    )
    server = _Server(config)
    host = f"[{listener.host}]" if ":" in listener.host else listener.host
    if listener.host in _EVERY_INTERFACE:
        host = socket.getfqdn()
    if passkeys is not None:
        host = "localhost"
    async with anyio.create_task_group() as group:
        group.start_soon(lambda: server.serve(sockets=[sock]))
        while not server.started:
            if server.should_exit:
                break
            await anyio.sleep(0.01)
        try:
            yield RunningInbox(f"{listener.scheme}://{host}:{port}/", chosen)
        finally:
            server.should_exit = True
            server.force_exit = True
    sock.close()


def notify_waiting(approval: ApprovalRecord, address: str | None) -> None:
    """A desktop notification for a waiting approval, where `notify-send` exists; never blocks."""
    program = shutil.which("notify-send")
    if program is None:
        return
    body = f"{sanitize(approval.tool)} ({sanitize(approval.kind)})"
    if address:
        body += f"\n{address}"
    # Arguments, not a shell: a tool name is text, never a command.
    with contextlib.suppress(OSError):
        subprocess.Popen(
            [program, "--app-name=agentrt", "agentrt: an approval waits", body],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
