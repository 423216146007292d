"""`python -m agentrt.proxy --config FILE`: the proxy without the `agentrt` command."""

from __future__ import annotations

import argparse
import os

from ._serve import exit_process, serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrt.proxy", description=__doc__)
    parser.add_argument("--config", required=True, help="the proxy configuration (JSON)")
    parser.add_argument("--http", help="serve streamable HTTP on HOST:PORT instead of stdio")
    parser.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --http")
    parser.add_argument(
        "--token", default=os.environ.get("AGENTRT_PROXY_TOKEN"), help="bearer token for --http"
    )
    options = parser.parse_args(argv)
    return serve(
        options.config, http=options.http, allow_remote=options.allow_remote, token=options.token
    )


if __name__ == "__main__":
    exit_process(main())
