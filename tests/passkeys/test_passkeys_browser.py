"""Passkeys through a real browser: headless Chromium through Selenium with WebDriver's
virtual authenticator registers an approver's passkey with `agentrt approvers add` and
decides in the real inbox (`agentrt inbox --approvers`), with user verification on and off;
`agentrt verify --approvers` proves the decision and names one forged through the library."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from inbox_support import AGENTRT, CHROMEDRIVER, CHROMIUM, Browser
from passkey_support import waiting_runs
from selenium.webdriver.common.by import By
from selenium.webdriver.common.virtual_authenticator import VirtualAuthenticatorOptions

from agentrt import approvals
from agentrt.passkeys import read_registry
from agentrt.store import ApprovalStatus, open_store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture
def browser() -> Iterator[Browser]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip("headless Chromium is not installed (/usr/bin/chromium, /usr/bin/chromedriver)")
    opened = Browser()
    opened.driver.add_virtual_authenticator(
        VirtualAuthenticatorOptions(
            protocol=VirtualAuthenticatorOptions.Protocol.CTAP2,
            transport=VirtualAuthenticatorOptions.Transport.INTERNAL,
            has_resident_key=True,
            has_user_verification=True,
            is_user_verified=True,
        )
    )
    try:
        yield opened
    finally:
        opened.close()


def started(*arguments: str) -> tuple[subprocess.Popen[str], str]:
    """A real `agentrt` process and the address on its first line of stdout."""
    process = subprocess.Popen(
        [str(AGENTRT), *arguments], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    first = process.stdout.readline().strip()
    return process, first.partition(": ")[2]


def stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.terminate()
        process.wait(timeout=10)


def register(browser: Browser, registry: Path, name: str, subject: str, wait: str = "60") -> Any:
    process, address = started(
        "approvers", "add", name, "--subject", subject, "--registry", str(registry),
        "--wait", wait,
    )  # fmt: skip
    try:
        assert address.startswith("http://localhost:"), address
        browser.driver.get(address)
        browser.driver.find_element(By.ID, "register").click()
        said = browser.wait_for(
            lambda driver: driver.find_element(By.ID, "said").get_attribute("data-done"),
            message="the registration to end",
        )
        out, err = process.communicate(timeout=30)
        return said, process.returncode, out + err
    finally:
        stop(process)


def verify(database: Path, registry: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AGENTRT), "--db", str(database), "verify", "--approvers", str(registry)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def outcome_of(browser: Browser, approval_id: str) -> str:
    card = browser.driver.find_element(By.CSS_SELECTOR, f'.approval[data-approval="{approval_id}"]')
    return str(card.find_element(By.CSS_SELECTOR, '[data-field="outcome"]').text)


def test_a_registered_passkey_decides_in_the_inbox_only_with_user_verification(
    tmp_path: Path, browser: Browser
) -> None:
    registry = tmp_path / "approvers.json"
    said, code, printed = register(browser, registry, "alice", "alice@example.com")
    assert (said, code) == ("yes", 0), printed
    (alice,) = read_registry(registry).approvers
    assert (alice.name, alice.subject) == ("alice", "alice@example.com")
    assert registry.stat().st_mode & 0o077 == 0

    database = tmp_path / "runs.db"
    first, second = waiting_runs(database, tmp_path / "notes", 2)
    inbox, page = started("--db", str(database), "inbox", "--approvers", str(registry))
    try:
        assert page.startswith("http://localhost:"), page
        browser.driver.get(page)
        browser.wait_for(
            lambda driver: driver.find_elements(
                By.CSS_SELECTOR, f'.approval[data-approval="{first.approval_id}"]'
            ),
            message="the approval to appear",
        )
        card = f'.approval[data-approval="{first.approval_id}"] button[data-verdict="approve"]'

        browser.driver.set_user_verified(False)
        browser.driver.find_element(By.CSS_SELECTOR, card).click()
        browser.wait_for(
            lambda driver: outcome_of(browser, first.approval_id).startswith("not decided"),
            message="the authenticator's refusal without user verification",
        )
        with open_store(database) as store:
            assert store.get_approval(first.approval_id).status is ApprovalStatus.PENDING
            assert not [e for e in store.list_events(first.run_id) if e.type == "approver_decided"]

        browser.driver.set_user_verified(True)
        browser.driver.find_element(By.CSS_SELECTOR, card).click()
        browser.wait_for(
            lambda driver: outcome_of(browser, first.approval_id).startswith("approved by alice"),
            message="the passkey approval",
        )
    finally:
        stop(inbox)
    with open_store(database) as store:
        approval = store.get_approval(first.approval_id)
        assert (approval.status, approval.decided_by) == (ApprovalStatus.APPROVED, "alice")
    proven = verify(database, registry)
    assert proven.returncode == 0, proven.stderr
    assert "every decision is proven by an approver's passkey" in proven.stdout

    # A shell-only attacker: same user, the database and the library — no authenticator.
    with open_store(database) as store:
        approvals.approve(store, second.run_id, approval_hash=second.approval_hash, by="alice")
        assert store.verify_chain().ok and store.verify_state().ok  # a consistent chain
    exposed = verify(database, registry)
    assert exposed.returncode == 1
    assert (
        f"approval {second.approval_id} of run {second.run_id} was granted without any "
        "approver's passkey assertion"
    ) in exposed.stderr


def test_a_passkey_made_without_user_verification_is_not_registered(
    tmp_path: Path, browser: Browser
) -> None:
    browser.driver.set_user_verified(False)
    registry = tmp_path / "approvers.json"
    said, code, printed = register(browser, registry, "alice", "alice@example.com", wait="8")
    assert said == "failed"
    assert code == 1
    assert "no passkey was registered for alice; nothing was added" in printed
    assert not registry.exists()


def use_authenticator(browser: Browser, credentials: list[Any]) -> None:
    """Hand the browser another person's authenticator: a fresh virtual one holding
    `credentials` (none: a new person's, empty)."""
    driver = browser.driver
    driver.remove_virtual_authenticator()
    driver.add_virtual_authenticator(
        VirtualAuthenticatorOptions(
            protocol=VirtualAuthenticatorOptions.Protocol.CTAP2,
            transport=VirtualAuthenticatorOptions.Transport.INTERNAL,
            has_resident_key=True,
            has_user_verification=True,
            is_user_verified=True,
        )
    )
    for credential in credentials:
        driver.add_credential(credential)


def test_two_people_make_a_quorum_in_the_inbox_and_neither_counts_twice_nor_approves_their_own(
    tmp_path: Path, browser: Browser
) -> None:
    registry = tmp_path / "approvers.json"
    assert register(browser, registry, "alice", "alice@example.com")[:2] == ("yes", 0)
    alices = browser.driver.get_credentials()
    use_authenticator(browser, [])
    assert register(browser, registry, "bob", "bob@example.com")[:2] == ("yes", 0)
    bobs = browser.driver.get_credentials()

    database = tmp_path / "runs.db"
    from agentrt.store import Principal

    (quorum,) = waiting_runs(database, tmp_path / "notes", 1)
    (bobs_own,) = waiting_runs(
        database, tmp_path / "notes", 1,
        principal=Principal(issuer="https://id.example.com", subject="bob@example.com"),
    )  # fmt: skip
    inbox, page = started(
        "--db", str(database), "inbox", "--approvers", str(registry),
        "--quorum", "local_mutation=2",
    )  # fmt: skip

    holding: list[Any] = []

    def approve_as(credentials: list[Any], approval_id: str, expected: str) -> str:
        if holding != [credentials]:
            # Handed over once per person: a credential put back with its old sign count
            # is a cloned authenticator, and its next assertion is refused as a replay.
            use_authenticator(browser, credentials)
            holding[:] = [credentials]
        button = f'.approval[data-approval="{approval_id}"] button[data-verdict="approve"]'
        browser.wait_for(lambda driver: driver.find_element(By.CSS_SELECTOR, button).is_enabled())
        browser.driver.find_element(By.CSS_SELECTOR, button).click()
        return str(
            browser.wait_for(
                lambda driver: (
                    (text := outcome_of(browser, approval_id)).startswith(expected) and text
                ),
                message=f"the outcome {expected!r}",
            )
        )

    try:
        browser.driver.get(page)
        browser.wait_for(
            lambda driver: len(driver.find_elements(By.CSS_SELECTOR, "#waiting .approval")) == 2,
            message="both approvals to appear",
        )
        said = approve_as(alices, quorum.approval_id, "approved by alice;")
        assert said == "approved by alice; waits for 1 more approver(s)"
        said = approve_as(alices, quorum.approval_id, "not decided")
        assert said.endswith("a quorum counts each person once")
        said = approve_as(bobs, bobs_own.approval_id, "not decided")
        assert said.endswith("a principal can never approve its own call")
        approve_as(bobs, quorum.approval_id, "approved by alice, bob")
    finally:
        stop(inbox)
    with open_store(database) as store:
        assert store.get_approval(quorum.approval_id).status is ApprovalStatus.APPROVED
        assert store.get_approval(bobs_own.approval_id).status is ApprovalStatus.PENDING
    proven = verify(database, registry)
    assert proven.returncode == 0, proven.stderr
