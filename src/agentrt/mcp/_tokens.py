"""Where a remote server's OAuth tokens live: one owner-only file per server.

Tokens are the operator's secrets.  Each server's are kept in one JSON file,
mode 0600, in `$XDG_STATE_HOME/agentrt/oauth/` (`~/.local/state/agentrt/oauth/`
without it), a directory of mode 0700; a file or directory that another user
can read, or that this user does not own, is refused rather than used.  The
file is written whole to a temporary name and renamed, so a reader sees the
old tokens or the new ones, never half of each.

A rotating refresh token may be used once: `TokenFile.locked` holds an
exclusive `flock` on the file's `.lock` companion, so of two processes that
find the access token near its end, the second waits, rereads the file and
finds the first one's new tokens instead of spending the old refresh token
again.

Nothing here prints a token: `TokenRecord`'s representation leaves the
secrets out, and every error names the file, never its content.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio

from ..errors import AgentrtError
from ..sanitize import sanitize

__all__ = [
    "AuthSettings",
    "TokenFile",
    "TokenRecord",
    "TokenStoreError",
    "token_directory",
    "token_file",
]

_UNSAFE_NAME: Final = re.compile(r"[^A-Za-z0-9_.-]+")


class TokenStoreError(AgentrtError):
    """A token file or its directory cannot be used safely."""


@dataclass(slots=True)
class TokenRecord:
    """What a login left for one server: its tokens, and how to refresh them.

    `resource` is the canonical URI the tokens were issued for (RFC 8707);
    `issuer` and `token_endpoint` are the authorization server's; the client
    is the registered (or pre-registered) one.  `expires_at` is epoch
    seconds, so a token's end survives the process that fetched it.
    `wanted_scope` is a scope a server asked for (a `403 insufficient_scope`)
    that the next login asks the person for.
    """

    server: str
    resource: str
    issuer: str | None
    token_endpoint: str
    client_id: str
    client_secret: str | None = field(default=None, repr=False)
    token_endpoint_auth_method: str | None = None
    access_token: str = field(default="", repr=False)
    refresh_token: str | None = field(default=None, repr=False)
    expires_at: float | None = None
    issued_at: float | None = None
    scope: str | None = None
    wanted_scope: str | None = None
    grant: str = "authorization_code"
    # The grants made again without a person (docs/decisions/0045): where their
    # credentials are read from each time, never the credentials themselves.
    private_key_file: str | None = None
    signing_alg: str | None = None
    idp_token_endpoint: str | None = None
    idp_client_id: str | None = None
    idp_client_secret_file: str | None = None
    id_token_file: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, value: Any, path: Path) -> TokenRecord:
        names = {item.name for item in dataclasses.fields(cls)}
        if not isinstance(value, dict) or not set(value) <= names:
            raise TokenStoreError(f"token file {sanitize(str(path))} is not a token record")
        try:
            return cls(**value)
        except TypeError:
            raise TokenStoreError(
                f"token file {sanitize(str(path))} is not a token record"
            ) from None


@dataclass(frozen=True, slots=True)
class AuthSettings:
    """A server entry's `auth`: how agentrt registers and which grant it uses."""

    grant: str = "authorization_code"
    client_id: str | None = None
    client_secret_file: Path | None = None
    scope: str | None = None
    client_metadata_url: str | None = None
    # client_credentials with private_key_jwt (RFC 7523 section 2.2) instead of a secret.
    private_key_file: Path | None = None
    alg: str | None = None
    # identity_assertion (SEP-990): the MCP authorization server's issuer (else the one the
    # server's metadata names), and the enterprise identity provider's token exchange.
    authorization_server: str | None = None
    idp_token_endpoint: str | None = None
    idp_client_id: str | None = None
    idp_client_secret_file: Path | None = None
    id_token_file: Path | None = None


def token_directory() -> Path:
    """The directory of token files (not created here)."""
    state = os.environ.get("XDG_STATE_HOME", "")
    base = Path(state) if os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / "agentrt" / "oauth"


def token_file(server: str, resource: str, directory: Path | None = None) -> TokenFile:
    """The token file of `server` reached at `resource`: the name and the resource both
    choose it, so two configurations with one server name never share tokens."""
    digest = hashlib.sha256(resource.encode()).hexdigest()[:16]
    safe = _UNSAFE_NAME.sub("_", server)[:64] or "server"
    return TokenFile((directory or token_directory()) / f"{safe}-{digest}.json")


def _refuse_if_shared(path: Path, info: os.stat_result, what: str) -> None:
    if info.st_uid != os.getuid():
        raise TokenStoreError(
            f"{what} {sanitize(str(path))} is not owned by this user, so it is not used"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise TokenStoreError(
            f"{what} {sanitize(str(path))} can be reached by other users (mode "
            f"{stat.S_IMODE(info.st_mode):04o}), so it is not used; make it owner-only "
            f"(chmod {'700' if what == 'token directory' else '600'}) or delete it and log in again"
        )


@dataclass(frozen=True, slots=True)
class TokenFile:
    """One server's token file; every method checks its owner and mode first."""

    path: Path

    def _check_directory(self) -> bool:
        try:
            info = os.stat(self.path.parent, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if not stat.S_ISDIR(info.st_mode):
            raise TokenStoreError(f"token directory {sanitize(str(self.path.parent))} is not one")
        _refuse_if_shared(self.path.parent, info, "token directory")
        return True

    def read(self) -> TokenRecord | None:
        """The stored record, or None when there is none."""
        if not self._check_directory():
            return None
        try:
            descriptor = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise TokenStoreError(
                f"token file {sanitize(str(self.path))} cannot be read: "
                f"{sanitize(exc.strerror or type(exc).__name__)}"
            ) from None
        with os.fdopen(descriptor, "rb") as handle:
            _refuse_if_shared(self.path, os.fstat(handle.fileno()), "token file")
            content = handle.read()
        try:
            value = json.loads(content)
        except ValueError:
            raise TokenStoreError(f"token file {sanitize(str(self.path))} is not JSON") from None
        return TokenRecord.from_json(value, self.path)

    def write(self, record: TokenRecord) -> None:
        """Replace the stored record (0600, in a 0700 directory made if missing)."""
        directory = self.path.parent
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._check_directory()
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                json.dump(record.to_json(), handle, sort_keys=True)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise

    def delete(self) -> bool:
        """Remove the stored record; whether there was one."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return False
        return True

    @contextlib.asynccontextmanager
    async def locked(self) -> AsyncIterator[None]:
        """Hold this server's lock (another process holding it is waited for)."""
        directory = self.path.parent
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._check_directory()
        descriptor = os.open(
            self.path.with_name(self.path.name + ".lock"),
            os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW,
            0o600,
        )
        try:
            # flock blocks: in a worker thread, so the event loop goes on meanwhile.
            await anyio.to_thread.run_sync(fcntl.flock, descriptor, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(descriptor, fcntl.LOCK_UN)
        finally:
            os.close(descriptor)
