"""RFC 3161 timestamps on checkpoints: `agentrt checkpoint --tsa URL` and `agentrt verify
--tsa-ca FILE`, against a real local timestamp authority — a small HTTP server in the
test that answers each query with `openssl ts -reply`, its root and signing certificates
made here with `openssl`."""

from __future__ import annotations

import base64
import json
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cli_support import produce
from retention_support import World

_CONFIG = """
[ tsa ]
default_tsa = tsa_config1
[ tsa_config1 ]
dir = {directory}
serial = {directory}/serial
crypto_device = builtin
signer_cert = {directory}/tsa.crt
certs = {directory}/ca.crt
signer_key = {directory}/tsa.key
signer_digest = sha256
default_policy = 1.2.3.4.1
digests = sha256, sha384, sha512
accuracy = secs:1
ordering = yes
tsa_name = no
ess_cert_id_chain = no
ess_cert_id_alg = sha256
[ tsa_ext ]
extendedKeyUsage = critical,timeStamping
"""


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_authority(directory: Path, name: str) -> Path:
    """A root certificate and a timestamping certificate it signed, with their config."""
    directory.mkdir()
    (directory / "ts.cnf").write_text(_CONFIG.format(directory=directory))
    (directory / "serial").write_text("01\n")
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(directory / "ca.key"),
        "-out", str(directory / "ca.crt"), "-days", "2", "-subj", f"/CN={name} root",
    )  # fmt: skip
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(directory / "tsa.key"),
        "-out", str(directory / "tsa.csr"), "-subj", f"/CN={name} TSA",
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(directory / "tsa.csr"), "-CA", str(directory / "ca.crt"),
        "-CAkey", str(directory / "ca.key"), "-CAcreateserial", "-out",
        str(directory / "tsa.crt"), "-days", "2", "-extfile", str(directory / "ts.cnf"),
        "-extensions", "tsa_ext",
    )  # fmt: skip
    return directory


class _Authority(BaseHTTPRequestHandler):
    directory: Path

    def do_POST(self) -> None:
        query = self.rfile.read(int(self.headers["Content-Length"]))
        with tempfile.TemporaryDirectory() as work:
            (Path(work) / "q.tsq").write_bytes(query)
            subprocess.run(
                ["openssl", "ts", "-reply", "-config", str(self.directory / "ts.cnf"),
                 "-queryfile", f"{work}/q.tsq", "-out", f"{work}/r.tsr"],
                check=True, capture_output=True,
            )  # fmt: skip
            reply = (Path(work) / "r.tsr").read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "application/timestamp-reply")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def authority(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A running local authority: its URL and its root certificate."""
    directory = make_authority(tmp_path / "tsa", "Test")
    handler = type("Handler", (_Authority,), {"directory": directory})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", directory / "ca.crt"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(produce(tmp_path / "runs.db", tmp_path / "sandbox"), tmp_path)


def test_a_checkpoint_timestamped_by_an_authority_verifies_with_its_certificate(
    world: World, authority: tuple[str, Path]
) -> None:
    url, root = authority
    result = world.run("checkpoint", "--key", str(world.key), "--log", str(world.log), "--tsa", url)
    assert result.exit_code == 0, result.output
    assert "timestamped by the authority" in result.output
    (entry,) = [json.loads(line) for line in world.log.read_text().splitlines()]
    assert set(entry) == {"signature", "statement", "timestamp"}
    # The event in the chain is the signed entry without the timestamp.
    assert json.loads(world.events()[-1][3]) == {
        "signature": entry["signature"],
        "statement": entry["statement"],
    }
    verified = world.verify("--tsa-ca", str(root))
    assert verified.exit_code == 0, verified.output
    assert "1 timestamped by the authority, the last at" in verified.output
    assert "GMT" in verified.output


def test_a_timestamp_from_another_authority_or_over_another_checkpoint_is_refused(
    world: World, authority: tuple[str, Path], tmp_path: Path
) -> None:
    url, root = authority
    for _ in range(2):
        result = world.run(
            "checkpoint", "--key", str(world.key), "--log", str(world.log), "--tsa", url
        )
        assert result.exit_code == 0, result.output
    other = make_authority(tmp_path / "other", "Other")
    untrusted = world.verify("--tsa-ca", str(other / "ca.crt"))
    assert untrusted.exit_code == 1
    assert "line 1 (checkpoint 1): the timestamp does not verify" in untrusted.output
    # Checkpoint 2's timestamp moved onto checkpoint 1: over another signature.
    lines = [json.loads(line) for line in world.log.read_text().splitlines()]
    lines[0]["timestamp"] = lines[1]["timestamp"]
    world.log.write_text(
        "".join(json.dumps(line, sort_keys=True, separators=(",", ":")) + "\n" for line in lines)
    )
    swapped = world.verify("--tsa-ca", str(root))
    assert swapped.exit_code == 1
    assert "over another checkpoint" in swapped.output
    # A reply altered byte for byte.
    data = bytearray(base64.b64decode(lines[1]["timestamp"]))
    data[-20] ^= 0xFF
    lines[0]["timestamp"] = lines[1]["timestamp"]
    lines[1]["timestamp"] = base64.b64encode(bytes(data)).decode()
    del lines[0]["timestamp"]
    world.log.write_text(
        "".join(json.dumps(line, sort_keys=True, separators=(",", ":")) + "\n" for line in lines)
    )
    altered = world.verify("--tsa-ca", str(root))
    assert altered.exit_code == 1 and "line 2 (checkpoint 2)" in altered.output


def test_an_authority_that_does_not_answer_leaves_the_checkpoint_logged_without_it(
    world: World,
) -> None:
    result = world.run(
        "checkpoint", "--key", str(world.key), "--log", str(world.log),
        "--tsa", "http://127.0.0.1:9/",
    )  # fmt: skip
    assert result.exit_code == 1
    assert "was signed and logged without a timestamp" in result.output
    assert "did not answer" in result.output
    assert world.verify().exit_code == 0
