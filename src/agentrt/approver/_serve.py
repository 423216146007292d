"""Serving the signed approver channel on an address (uvicorn), as the inbox is served."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio

from ..inbox._serve import Listener, _bind, _Server
from ..store import Store, in_passkey_mode
from ._app import ChannelLimits, approver_app

__all__ = ["running_approver"]


@contextlib.asynccontextmanager
async def running_approver(
    store: Store, secret: bytes, listener: Listener, limits: ChannelLimits | None = None
) -> AsyncIterator[str]:
    """Serve the channel for `store` on `listener` while the block runs; yields its base URL."""
    import uvicorn

    sock = _bind(listener)
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        # A database in passkey mode is read once, as the channel starts (docs/identity.md).
        approver_app(store, secret, limits, passkey_mode=in_passkey_mode(store)),
        log_level="warning",
        access_log=False,
        lifespan="off",
        server_header=False,
        timeout_graceful_shutdown=1,
    )
    server = _Server(config)
    host = f"[{listener.host}]" if ":" in listener.host else listener.host
    async with anyio.create_task_group() as group:
        group.start_soon(lambda: server.serve(sockets=[sock]))
        while not server.started:
            if server.should_exit:
                break
            await anyio.sleep(0.01)
        try:
            yield f"http://{host}:{port}"
        finally:
            server.should_exit = True
            server.force_exit = True
    sock.close()
