"""The demo's stock filesystem server runs sandboxed: seen from the host, its world is small."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from sandbox_support import children_of

from agentrt.demo import DemoPaths, default_example_dir, demo_server
from agentrt.mcp._connection import connect

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


async def test_the_demo_filesystem_server_sees_only_its_package_and_sandbox(
    tmp_path: Path,
) -> None:
    paths = DemoPaths(state_dir=tmp_path / "state", example_dir=default_example_dir())
    node = shutil.which("node")
    if node is None or not paths.server_script.is_file():
        pytest.skip("needs node and the demo's server (make demo installs it)")
    paths.sandbox.mkdir(parents=True)
    (paths.sandbox / "README.md").write_text("# inside\n")
    paths.database.write_text("operator state")
    server = demo_server(paths, node)
    assert server.sandbox is not None and server.sandbox.network is False
    connection = await connect(server)
    try:
        bwrap = connection._transport.process.pid  # type: ignore[attr-defined]
        (node_pid,) = [
            pid
            for pid in children_of(bwrap)
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == node.encode()
        ]
        for namespace in ("mnt", "net", "pid", "user"):
            assert os.readlink(f"/proc/{node_pid}/ns/{namespace}") != os.readlink(
                f"/proc/self/ns/{namespace}"
            )
        # Its root, looked at from here: the sandbox is there, the database and ~ are not.
        root = Path(f"/proc/{node_pid}/root")
        assert (root / str(paths.sandbox.resolve()).lstrip("/") / "README.md").exists()
        assert not (root / str(paths.database.resolve()).lstrip("/")).exists()
        assert not (root / str(Path.home()).lstrip("/") / ".bashrc").exists()
        assert sorted(os.listdir(root / "home" / "sandbox")) == []
        arguments = json.dumps({"path": str(paths.sandbox.resolve() / "README.md")})
        result = await connection.call_tool("read_text_file", arguments, timeout=20)
        assert "# inside" in json.dumps(result)
    finally:
        await connection.aclose()
