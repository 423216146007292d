"""The signature scheme as docs/approvals.md documents it, and the secret file's rules."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from approver_support import secret_file

from agentrt.approver import SecretError, read_secret, sign, signing_input
from agentrt.approver._signing import ReplayCache, TokenBucket

DOCS = Path(__file__).resolve().parents[2] / "docs" / "approvals.md"
SECRET = b"an-example-secret-of-32-bytes-or-more"
PATH = "/runs/laptop.9d2e/approvals/3f0c8a1b2c3d4e5f/approve"
BODY = (
    b'{"run_id":"laptop.9d2e","approval_id":"3f0c8a1b2c3d4e5f","hash":'
    b'"8c01783d32f87394a23791823082678c55c3ba46aeb7aa95aee61353e4952478",'
    b'"by":"alice","note":"ok"}'
)
DOCUMENTED = "v1=bc24f5310191381f7b5c3f0ea14cb4c67d86fa2a5d96b4841dd4d235f7257505"


def test_the_documented_signature_example_is_what_sign_and_openssl_compute() -> None:
    assert sign(SECRET, "1767225600", "4f1c2a9e", "POST", PATH, BODY) == DOCUMENTED
    assert DOCUMENTED in DOCS.read_text() and BODY.decode() in DOCS.read_text()
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    digest = subprocess.run(
        ["openssl", "dgst", "-sha256", "-hmac", SECRET.decode()],
        input=signing_input("1767225600", "4f1c2a9e", "POST", PATH, BODY),
        capture_output=True,
        check=True,
    ).stdout.decode()
    assert digest.strip().endswith(DOCUMENTED.removeprefix("v1="))


def test_the_secret_is_the_files_bytes_less_one_trailing_newline(tmp_path: Path) -> None:
    assert read_secret(secret_file(tmp_path, SECRET)) == SECRET
    two = tmp_path / "two"
    two.write_bytes(SECRET + b"\n\n")
    two.chmod(0o600)
    assert read_secret(two) == SECRET + b"\n"
    link = tmp_path / "link"
    link.symlink_to(two)
    with pytest.raises(SecretError, match="symbolic link"):
        read_secret(link)
    with pytest.raises(SecretError, match="mode 0640"):
        read_secret(secret_file(tmp_path, SECRET, 0o640, "group"))


def test_the_replay_cache_forgets_a_signature_only_once_its_timestamp_is_out_of_the_window() -> (
    None
):
    cache = ReplayCache(skew=300, capacity=2)
    assert cache.admit("a", 1000, 1000.0) is None
    assert cache.admit("a", 1000, 1299.0) == "replayed"
    assert cache.admit("b", 1000, 1000.0) is None
    # Full of entries still in their window: refused, never one forgotten early.
    assert cache.admit("c", 1000, 1000.0) == "replay_cache_full"
    assert cache.admit("a", 1000, 1301.0) is None  # its timestamp would now be refused


def test_the_token_bucket_allows_its_burst_then_its_rate() -> None:
    bucket = TokenBucket(rate=10, burst=20)
    assert [bucket.take(0.0) for _ in range(21)].count(True) == 20
    assert bucket.take(0.05) is False
    assert bucket.take(0.1) is True
