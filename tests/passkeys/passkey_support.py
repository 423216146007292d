"""What the passkey tests share: databases with approvals waiting, and a software
authenticator that makes real WebAuthn assertions (P-256, the browser's format) for the
refusals that need a made-to-measure assertion; the browser tests use Chromium's own."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import cbor2
from cli_support import POLICY, ReadNote, WriteNote
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from agentrt import Decision
from agentrt.gate import Gate
from agentrt.passkeys import Approver, Assertion, Registry, write_registry
from agentrt.passkeys._registry import b64url
from agentrt.store import Principal, open_store

ORIGIN = "http://localhost:8765"


@dataclass
class SoftAuthenticator:
    """One P-256 credential, signing assertions as an authenticator does."""

    key: ec.EllipticCurvePrivateKey = field(
        default_factory=lambda: ec.generate_private_key(ec.SECP256R1())
    )
    credential_id: bytes = field(default_factory=lambda: os.urandom(16))
    count: int = 0

    def public_key(self) -> bytes:
        numbers = self.key.public_key().public_numbers()
        return cbor2.dumps(
            {
                1: 2,
                3: -7,
                -1: 1,
                -2: numbers.x.to_bytes(32, "big"),
                -3: numbers.y.to_bytes(32, "big"),
            }
        )

    def approver(self, name: str, subject: str) -> Approver:
        return Approver(
            name, subject, self.credential_id, self.public_key(), "2026-12-02T00:00:00+00:00"
        )

    def sign(
        self, challenge: bytes, *, user_verified: bool = True, origin: str = ORIGIN
    ) -> Assertion:
        self.count += 1
        flags = 0x01 | (0x04 if user_verified else 0)
        authenticator_data = (
            hashlib.sha256(b"localhost").digest() + bytes([flags]) + self.count.to_bytes(4, "big")
        )
        client_data = json.dumps(
            {"type": "webauthn.get", "challenge": b64url(challenge), "origin": origin,
             "crossOrigin": False}
        ).encode()  # fmt: skip
        signature = self.key.sign(
            authenticator_data + hashlib.sha256(client_data).digest(), ec.ECDSA(hashes.SHA256())
        )
        return Assertion(self.credential_id, authenticator_data, client_data, signature)


def registry_of(path: Path, *approvers: Approver) -> Registry:
    registry = Registry(path, tuple(approvers))
    write_registry(registry)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    return registry


@dataclass(frozen=True)
class Waiting:
    run_id: str
    approval_id: str
    approval_hash: str


def waiting_runs(
    database: Path | str, sandbox: Path, count: int, principal: Principal | None = None
) -> list[Waiting]:
    """`count` runs through the real Gate, each waiting on a note's write (local_mutation)."""
    sandbox.mkdir(exist_ok=True)

    async def scenario() -> list[Waiting]:
        store = open_store(database)
        try:
            gate = Gate(store, [ReadNote(sandbox), WriteNote(sandbox)], policy=POLICY)
            found = []
            for number in range(count):
                run_id = await gate.start(f"write note {number}", principal=principal)
                arguments = json.dumps({"path": f"note{number}.txt", "content": "passkeys"})
                outcome = await gate.step(run_id, Decision.tool_call("write_note", arguments))
                assert outcome.approval is not None
                found.append(
                    Waiting(run_id, outcome.approval.approval_id, outcome.approval.approval_hash)
                )
            return found
        finally:
            store.close()

    return anyio.run(scenario)
