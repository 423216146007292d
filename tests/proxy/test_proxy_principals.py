"""Principals everywhere (issue 35): two people drive one HTTP proxy with the official SDK
client, each with their own signed access token; each call is recorded as theirs, and
neither learns of, collects, repeats or is crowded out by the other's calls.  Refused
tokens change nothing, and the other principal still works."""

from __future__ import annotations

import re
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from jwt_issuer import Issuer
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from proxy_helpers import ProxySetup, build_setup, free_port, text_of, until

from agentrt import open_store
from agentrt.approvals import approve

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(90)]

_APPROVAL = re.compile(r"\(approval (\S+)\)")


class Principals:
    """One proxy over HTTP with `"principals"`, and its authorization server."""

    def __init__(self, setup: ProxySetup, issuer: Issuer, port: int) -> None:
        self.setup = setup
        self.issuer = issuer
        self.port = port
        self.url = f"http://127.0.0.1:{port}/mcp"

    async def token(self, client_id: str) -> str:
        """An access token from the issuer's token endpoint, for this proxy."""
        async with httpx2.AsyncClient() as client:
            answer = await client.post(
                f"{self.issuer.origin}/token",
                data={"grant_type": "client_credentials", "client_id": client_id,
                      "client_secret": f"{client_id.split('-')[0]}-secret",
                      "resource": self.url, "scope": "mcp:tools"},
            )  # fmt: skip
        assert answer.status_code == 200, answer.text
        token: str = answer.json()["access_token"]
        return token

    @asynccontextmanager
    async def host(self, client_id: str) -> AsyncIterator[ClientSession]:
        """The official SDK client, sending the person's bearer token."""
        headers = {"Authorization": f"Bearer {await self.token(client_id)}"}
        async with (
            httpx2.AsyncClient(headers=headers) as client,
            streamable_http_client(self.url, http_client=client) as (read_stream, write_stream),
            ClientSession(read_stream, write_stream) as session,
        ):
            await session.initialize()
            yield session

    def snapshot(self) -> tuple[int, int]:
        with open_store(self.setup.database, create=False) as store:
            return store.head_seq(), store.count_runs()

    def verifies(self) -> bool:
        with open_store(self.setup.database, create=False) as store:
            return store.verify_chain().ok and store.verify_state().ok


@asynccontextmanager
async def principals_proxy(
    setup: ProxySetup, issuer: Issuer, *extra: str, **overrides: Any
) -> AsyncIterator[Principals]:
    port = free_port()
    setup.rewrite(
        principals={
            "issuer": issuer.origin,
            "audience": f"http://127.0.0.1:{port}/mcp",
            "required_scopes": ["mcp:tools"],
        },
        **overrides,
    )
    with setup.stderr_path.open("a") as errlog:
        process = await anyio.open_process(
            [*setup.command(), "--http", f"127.0.0.1:{port}", *extra],
            stderr=errlog, env=setup.environment(), cwd=str(setup.root),
        )  # fmt: skip
        try:
            await until(lambda: "serving streamable HTTP" in setup.stderr())
            yield Principals(setup, issuer, port)
        finally:
            process.terminate()
            with anyio.fail_after(20):
                await process.wait()


@asynccontextmanager
async def alice_and_bob(
    setup: ProxySetup, issuer: Issuer
) -> AsyncIterator[tuple[ClientSession, ClientSession]]:
    """The proxy with `"principals"`, and alice's and bob's hosts on it, each sending a
    token of their own."""
    async with (
        principals_proxy(setup, issuer) as proxy,
        proxy.host("alice-laptop") as alice,
        proxy.host("bob-laptop") as bob,
    ):
        yield alice, bob


def _approval_id(answer: Any) -> str:
    found = _APPROVAL.search(text_of(answer))
    assert found is not None, text_of(answer)
    return found.group(1)


async def test_two_principals_calls_are_theirs_and_invisible_to_each_other(
    tmp_path: Path, issuer: Issuer, on_backend: dict[str, Any]
) -> None:
    setup = await build_setup(tmp_path, **on_backend)
    mail = {"to": "team@example.com", "body": "release notes"}
    async with alice_and_bob(setup, issuer) as (alice, bob):
        echoed = await alice.call_tool("up_echo", {"text": "hello"})
        alice_waits = await alice.call_tool("up_send_mail", mail)
        # The very same request from bob is his own call: it does not collect alice's.
        bob_waits = await bob.call_tool("up_send_mail", mail)
        alice_id, bob_id = _approval_id(alice_waits), _approval_id(bob_waits)
        assert alice_id != bob_id
        alice_list = text_of(await alice.call_tool("gate_status", {}))
        bob_list = text_of(await bob.call_tool("gate_status", {}))
        bob_asks = text_of(await bob.call_tool("gate_status", {"approval_id": alice_id}))
        # alice's approval is given; bob's identical call still waits on his own.
        with open_store(setup.database, create=False) as store:
            shown = store.get_approval(alice_id)
            approve(store, shown.run_id, approval_hash=shown.approval_hash,
                    approval_id=alice_id, by="operator")  # fmt: skip
        bob_again = await bob.call_tool("up_send_mail", mail)
        alice_again = await alice.call_tool("up_send_mail", mail)
    assert text_of(echoed) == "hello"
    assert alice_id in alice_list and bob_id not in alice_list
    assert bob_id in bob_list and alice_id not in bob_list
    assert bob_asks.startswith(f"There is no approval {alice_id}")
    assert text_of(bob_again).startswith("PENDING_APPROVAL") and bob_id in text_of(bob_again)
    assert not text_of(alice_again).startswith("PENDING_APPROVAL")
    assert len(setup.executions("send_mail")) == 1  # alice's, once
    with open_store(setup.database, create=False) as store:
        alice_run = store.get_approval(alice_id).run_id
        bob_run = store.get_approval(bob_id).run_id
        alice_principal = store.principal_of_run(alice_run)
        bob_principal = store.principal_of_run(bob_run)
        started = store.list_events(alice_run)[0].payload
        runs = store.list_runs(100)
        assert store.verify_chain().ok and store.verify_state().ok
    assert alice_principal is not None and bob_principal is not None
    assert (alice_principal.subject, alice_principal.client_id) == ("alice", "alice-laptop")
    assert alice_principal.groups == ("release",) and alice_principal.issuer == issuer.origin
    assert (bob_principal.subject, bob_principal.client_id) == ("bob", "bob-laptop")
    assert alice_principal.jti and alice_principal.jti != bob_principal.jti
    # The token itself is recorded nowhere: only what it proved.
    assert set(started["principal"]) == {"issuer", "subject", "client_id", "jti", "scopes",
                                         "groups"}  # fmt: skip
    with open_store(setup.database, create=False) as store:
        subjects = sorted(
            principal.subject
            for run in runs
            if (principal := store.principal_of_run(run.run_id)) is not None
        )
    assert subjects == ["alice", "alice", "bob"]  # echo and mail for alice, mail for bob


async def test_max_pending_is_counted_per_principal(tmp_path: Path, issuer: Issuer) -> None:
    setup = await build_setup(tmp_path, max_pending=1)
    async with alice_and_bob(setup, issuer) as (alice, bob):
        first = await alice.call_tool("up_send_mail", {"to": "a@example.com", "body": "1"})
        crowded = await alice.call_tool("up_send_mail", {"to": "b@example.com", "body": "2"})
        bobs = await bob.call_tool("up_send_mail", {"to": "c@example.com", "body": "3"})
    assert text_of(first).startswith("PENDING_APPROVAL")
    assert "the most this gate lets wait at once" in text_of(crowded)
    # alice's one waiting call does not use up bob's room.
    assert text_of(bobs).startswith("PENDING_APPROVAL")


async def test_a_condition_reads_the_principals_groups(tmp_path: Path, issuer: Issuer) -> None:
    from proxy_helpers import RULES

    rules = dict(RULES)
    rules["send_mail"] = {
        "side_effect": "remote_mutation",
        "when": [
            {"if": "'release' in principal.groups", "outcome": "allow",
             "reason": "the release group sends mail"},
            {"if": "true", "outcome": "deny", "reason": "only the release group sends mail"},
        ],
    }  # fmt: skip
    setup = await build_setup(tmp_path, rules=rules)
    async with alice_and_bob(setup, issuer) as (alice, bob):
        sent = await alice.call_tool("up_send_mail", {"to": "a@example.com", "body": "x"})
        denied = await bob.call_tool("up_send_mail", {"to": "a@example.com", "body": "x"})
    assert not text_of(sent).startswith(("DENIED", "PENDING_APPROVAL")), text_of(sent)
    assert text_of(denied).startswith("DENIED") and "release group" in text_of(denied)
    assert len(setup.executions("send_mail")) == 1


async def test_refused_tokens_change_nothing_and_the_other_principal_still_works(
    tmp_path: Path, issuer: Issuer
) -> None:
    from joserfc.jwk import RSAKey

    setup = await build_setup(tmp_path)
    ping = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}}  # fmt: skip
    accept = {"accept": "application/json, text/event-stream"}
    async with principals_proxy(setup, issuer) as proxy:
        async with proxy.host("alice-laptop") as alice:
            await alice.call_tool("up_echo", {"text": "before"})
        before = proxy.snapshot()
        forger = RSAKey.generate_key(2048, parameters={"kid": "forged"}, private=True)
        good = issuer.mint("mallory", proxy.url)
        none = "eyJhbGciOiJub25lIn0." + good.split(".")[1] + "."
        tokens = {
            "another audience": issuer.mint("mallory", "https://other.example/mcp"),
            "expired": issuer.mint("mallory", proxy.url, lifetime=-3600),
            "unknown key": issuer.mint("mallory", proxy.url, key=forger),
            "alg none": none,
            "missing scope": issuer.mint("mallory", proxy.url, scope="profile"),
        }
        answers = {}
        async with httpx2.AsyncClient() as client:
            bare = await client.post(proxy.url, json=ping, headers=accept)
            metadata = await client.get(
                f"http://127.0.0.1:{proxy.port}/.well-known/oauth-protected-resource/mcp"
            )
            for case, token in tokens.items():
                answers[case] = await client.post(
                    proxy.url, json=ping, headers={**accept, "authorization": f"Bearer {token}"}
                )
            # bob may not use a session alice opened.
            alice_token = await proxy.token("alice-laptop")
            opened = await client.post(
                proxy.url, json=ping, headers={**accept, "authorization": f"Bearer {alice_token}"}
            )
            bob_token = await proxy.token("bob-laptop")
            listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
            hijack = await client.post(
                proxy.url, json=listing,
                headers={**accept, "authorization": f"Bearer {bob_token}",
                         "mcp-session-id": opened.headers["mcp-session-id"]},
            )  # fmt: skip
        after = proxy.snapshot()
        async with proxy.host("bob-laptop") as bob:
            still = await bob.call_tool("up_echo", {"text": "after"})
    assert bare.status_code == 401
    assert bare.headers["www-authenticate"].startswith("Bearer resource_metadata=")
    assert "/.well-known/oauth-protected-resource/mcp" in bare.headers["www-authenticate"]
    assert metadata.status_code == 200
    assert metadata.json()["authorization_servers"] == [issuer.origin]
    assert metadata.json()["resource"] == proxy.url
    for case in ("another audience", "expired", "unknown key", "alg none"):
        assert answers[case].status_code == 401, case
        assert 'error="invalid_token"' in answers[case].headers["www-authenticate"], case
    assert "another audience" in answers["another audience"].json()["error_description"]
    assert answers["missing scope"].status_code == 403
    assert 'error="insufficient_scope"' in answers["missing scope"].headers["www-authenticate"]
    assert opened.status_code == 200 and hijack.status_code == 404
    assert before == after  # nothing recorded for any refused request
    assert text_of(still) == "after"
    assert proxy.verifies()
    assert "refused an HTTP request: the bearer token is for another audience" in setup.stderr()


def test_a_shared_token_beside_principals_is_refused_at_start(tmp_path: Path) -> None:
    setup = anyio.run(build_setup, tmp_path)
    setup.rewrite(principals={"issuer": "https://id.example", "audience": "https://p.example/mcp"})
    finished = subprocess.run(
        [*setup.command(), "--http", f"127.0.0.1:{free_port()}", "--token", "shared"],
        capture_output=True, text=True, timeout=60, env=setup.environment(), cwd=setup.root,
    )  # fmt: skip
    assert finished.returncode != 0
    assert '--token and "principals"' in finished.stderr
    assert "use one" in finished.stderr


async def test_a_standing_grant_covers_only_the_principal_it_was_given_for(
    tmp_path: Path, issuer: Issuer
) -> None:
    from proxy_helpers import AGENTRT

    setup = await build_setup(tmp_path, standing_grants={"max_for": "1h", "max_calls": 10})
    async with alice_and_bob(setup, issuer) as (alice, bob):
        waits = await alice.call_tool("up_send_mail", {"to": "a@example.com", "body": "1"})
        approval_id = _approval_id(waits)
        with open_store(setup.database, create=False) as store:
            run_id = store.get_approval(approval_id).run_id
        approved = subprocess.run(
            [str(AGENTRT), "--db", str(setup.database), "approve", run_id, "--approval",
             approval_id, "--yes", "--grant-calls", "5"],
            capture_output=True, text=True, timeout=60, env=setup.environment(),
        )  # fmt: skip
        assert approved.returncode == 0, approved.stderr
        covered = await alice.call_tool("up_send_mail", {"to": "b@example.com", "body": "2"})
        bobs = await bob.call_tool("up_send_mail", {"to": "c@example.com", "body": "3"})
    assert covered.is_error is False and not text_of(covered).startswith("PENDING_APPROVAL")
    assert text_of(bobs).startswith("PENDING_APPROVAL")
    assert setup.executions("send_mail") == ["send_mail b@example.com"]


async def test_an_approved_call_is_decided_again_on_its_recorded_principal(
    tmp_path: Path, issuer: Issuer
) -> None:
    from proxy_helpers import RULES

    rules = dict(RULES)
    rules["send_mail"] = {
        "side_effect": "remote_mutation",
        "when": [
            {"if": "'release' in principal.groups", "outcome": "require_approval",
             "reason": "the release group sends mail, with a second pair of eyes"},
            {"if": "true", "outcome": "deny", "reason": "only the release group sends mail"},
        ],
    }  # fmt: skip
    setup = await build_setup(tmp_path, rules=rules)
    mail = {"to": "a@example.com", "body": "x"}
    async with principals_proxy(setup, issuer) as proxy, proxy.host("alice-laptop") as alice:
        approval_id = _approval_id(await alice.call_tool("up_send_mail", mail))
        with open_store(setup.database, create=False) as store:
            shown = store.get_approval(approval_id)
            approve(store, shown.run_id, approval_hash=shown.approval_hash,
                    approval_id=approval_id, by="operator")  # fmt: skip
        # The retry resumes the run; its policy decides again with the run's principal,
        # read back from the store, so the approval still matches and the mail goes.
        ran = await alice.call_tool("up_send_mail", mail)
    assert ran.is_error is False, text_of(ran)
    assert setup.executions("send_mail") == ["send_mail a@example.com"]
