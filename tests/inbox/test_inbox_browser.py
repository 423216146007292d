"""The inbox in a real browser: headless Chromium through Selenium, against a real proxy.

A real MCP host (the SDK's client) starts `agentrt proxy` over stdio with
`"inbox"` in its configuration; the proxy's call waits for an approval, the
page shows it without a reload, a click decides it, and the host's next
identical call runs.  Screenshots for docs/inbox.md are taken here when
AGENTRT_INBOX_SCREENSHOTS names a directory.
"""

from __future__ import annotations

import getpass
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from cli_support import Produced
from inbox_support import HOSTILE, Browser, Inbox, inbox_page, notes_setup
from proxy_helpers import host, text_of
from selenium.webdriver.common.by import By

from agentrt.store import ApprovalStatus, open_store

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(180)]


async def in_thread(function: Any, *args: Any) -> Any:
    return await anyio.to_thread.run_sync(function, *args)


def cards(where: Any) -> list[Any]:
    """The approval cards on the page (`where` is a Browser or its WebDriver)."""
    driver = getattr(where, "driver", where)
    return list(driver.find_elements(By.CSS_SELECTOR, "#waiting .approval"))


def open_page(browser: Browser, address: str) -> None:
    browser.driver.get(address)
    browser.wait_for(
        lambda driver: driver.find_element(By.ID, "connection").text == "live",
        message="the page to connect its event stream",
    )


def rows_of(block: Any) -> list[tuple[str, str]]:
    return [
        (row.find_element(By.CSS_SELECTOR, "td.number").text,
         row.find_element(By.CSS_SELECTOR, "td.text").get_attribute("textContent"))
        for row in block.find_elements(By.CSS_SELECTOR, "tr")
    ]  # fmt: skip


NOTE = "".join(f"line {number}: the inbox shows every line\n" for number in range(1, 41))


async def test_a_waiting_approval_appears_live_and_approve_lets_the_next_call_run(
    tmp_path: Path, browser: Browser
) -> None:
    setup, notes = await notes_setup(tmp_path)
    arguments = {"path": "todo.md", "content": NOTE}
    async with host(setup) as session:
        address, page = await inbox_page(setup)
        await in_thread(open_page, browser, page)
        assert "#token=" not in browser.driver.current_url  # out of the address bar
        assert browser.driver.find_element(By.ID, "waiting-empty").is_displayed()
        browser.driver.execute_script("window.sameDocument = 'not reloaded';")

        pending = await session.call_tool("notes_write_note", arguments)
        assert text_of(pending).startswith("PENDING_APPROVAL: ")
        waiting_line = next(line for line in setup.stderr().splitlines() if " waits for " in line)
        assert waiting_line.endswith(f"  |  inbox: {address}")
        token = (setup.root / "conf" / "inbox.token").read_text().strip()
        assert token not in setup.stderr()

        card = (await in_thread(browser.wait_for, cards, 30.0, "the approval to appear"))[0]
        assert browser.driver.execute_script("return window.sameDocument;") == "not reloaded"
        assert card.find_element(By.CSS_SELECTOR, '[data-field="tool"]').text == "notes_write_note"
        assert card.find_element(By.CSS_SELECTOR, '[data-field="server"]').text == "notes"
        kind = card.find_element(By.CSS_SELECTOR, '[data-field="kind"]').text
        assert kind == "tool:local_mutation"
        writes = card.find_element(By.CSS_SELECTOR, '[data-block="writes"]')
        assert "content of todo.md — 40 lines" in writes.find_element(By.TAG_NAME, "h4").text
        rows = rows_of(writes)
        assert rows == [
            (str(number), f"line {number}: the inbox shows every line") for number in range(1, 41)
        ]
        shown_hash = card.find_element(By.CSS_SELECTOR, '[data-field="approval_hash"]').text
        browser.screenshot("inbox-waiting.png")

        run_id, approval_id = setup.waiting_commands()[-1]
        assert setup.approval(approval_id).approval_hash == shown_hash
        card.find_element(By.CSS_SELECTOR, 'input[name="note"]').send_keys("fine")
        card.find_element(By.CSS_SELECTOR, "button.approve").click()
        # Found again by its approval id each time: a refresh may redraw the card.
        decided_card = f'#waiting .approval[data-approval="{approval_id}"] [data-field="outcome"]'

        def answered(driver: Any) -> str:
            text = str(driver.find_element(By.CSS_SELECTOR, decided_card).text)
            return "" if text in ("", "approving…") else text

        outcome = await in_thread(
            browser.wait_for,
            answered,
            30.0,
            "the page to say it was decided",
        )
        assert outcome.startswith(f"approved by {getpass.getuser()}; "), outcome
        browser.screenshot("inbox-approved.png")

        with open_store(setup.database, read_only=True, create=False) as store:
            approval = store.get_approval(approval_id)
            granted = [
                event for event in store.list_events(run_id) if event.type == "approval_granted"
            ]
        assert approval.status is ApprovalStatus.APPROVED
        assert (approval.decided_by, approval.note) == (getpass.getuser(), "fine")
        assert [event.payload["approval_hash"] for event in granted] == [shown_hash]
        assert not (notes / "todo.md").exists()

        ran = await session.call_tool("notes_write_note", arguments)
        assert ran.is_error is False, text_of(ran)
        assert (notes / "todo.md").read_text() == NOTE
        assert setup.executions() == ["write_note todo.md"]
        await in_thread(browser.wait_for, lambda driver: not cards(browser), 30.0, "the card to go")


async def test_a_hostile_description_and_arguments_render_as_text(
    tmp_path: Path, browser: Browser
) -> None:
    setup, _notes = await notes_setup(tmp_path)
    (_notes / "plan.md").write_text("one\ntwo\nthree\n")
    async with host(setup) as session:
        _address, page = await inbox_page(setup)
        await in_thread(open_page, browser, page)
        await session.call_tool("notes_write_note", {"path": "x.md", "content": HOSTILE + "\n"})
        await session.call_tool(
            "notes_edit_note",
            {"path": "plan.md", "edits": [{"oldText": "two", "newText": HOSTILE}]},
        )
        await in_thread(
            browser.wait_for, lambda driver: len(cards(browser)) == 2, 30.0, "two approvals"
        )
        driver = browser.driver
        assert driver.execute_script("return window.pwned === undefined;") is True
        # Nothing the server or the model chose became an element.
        assert driver.find_elements(By.CSS_SELECTOR, "main script, main img") == []
        write_card = next(
            card for card in cards(browser)
            if card.find_element(By.CSS_SELECTOR, '[data-field="tool"]').text == "notes_write_note"
        )  # fmt: skip
        details = write_card.find_element(By.CSS_SELECTOR, ".description-box")
        details.find_element(By.TAG_NAME, "summary").click()
        description = details.find_element(By.CSS_SELECTOR, "td.text").text
        assert "<script>window.pwned = 1</script>" in description
        assert '<img src=x onerror="window.pwned = 2">' in description
        assert "\\u202eexe.txt" in description and "\\x1b[31mred" in description
        assert "\u202e" not in description and "\x1b" not in description
        content = write_card.find_element(By.CSS_SELECTOR, '[data-block="writes"] td.text')
        assert content.get_attribute("textContent").startswith("<script>window.pwned = 1</script>")
        edit_card = next(card for card in cards(browser) if card is not write_card)
        diff = [
            (row.get_attribute("class"), row.find_element(By.CSS_SELECTOR, "td.text").text)
            for row in edit_card.find_elements(By.CSS_SELECTOR, '[data-block="edits"] tr')
        ]
        assert ("del", "two") in diff
        assert any(kind == "add" and text.startswith("<script>") for kind, text in diff)
        browser.screenshot("inbox-hostile.png")


async def test_the_runs_and_a_runs_trail_with_the_chain_state(
    tmp_path: Path, browser: Browser
) -> None:
    setup, _notes = await notes_setup(tmp_path)
    async with host(setup) as session:
        _address, page = await inbox_page(setup)
        await session.call_tool("notes_write_note", {"path": "a.md", "content": "a\n"})
        await in_thread(open_page, browser, page)
        driver = browser.driver
        chain = await in_thread(
            browser.wait_for,
            lambda driver: driver.find_element(By.ID, "chain").text.startswith("chain intact"),
            30.0,
            "the chain's state",
        )
        assert chain
        with open_store(setup.database, read_only=True, create=False) as store:
            head = store.verify_chain()
        assert f"head {head.head_seq}:{head.head_hash}" in driver.find_element(By.ID, "chain").text

        def open_the_waiting_run(driver: Any) -> bool:
            # The table is redrawn on every change; a row found just before may be gone.
            first = driver.find_element(By.CSS_SELECTOR, "#runs tbody tr")
            assert "waiting_for_approval" in first.text
            first.find_element(By.TAG_NAME, "a").click()
            return True

        await in_thread(browser.wait_for, open_the_waiting_run, 30.0, "the waiting run's link")
        await in_thread(
            browser.wait_for,
            lambda driver: driver.find_element(By.ID, "run-section").is_displayed(),
            30.0,
            "the run's trail",
        )
        events = driver.find_element(By.ID, "events").text
        assert "run_started" in events and "approval_requested" in events
        assert "write_note" in driver.find_element(By.ID, "steps").text
        driver.execute_script("document.getElementById('run-section').scrollIntoView()")
        browser.screenshot("inbox-run.png")


def test_a_database_approval_is_shown_in_full_and_approved_from_the_standalone_inbox(
    produced: Produced, inbox: Inbox, browser: Browser
) -> None:
    open_page(browser, inbox.page)
    card = browser.wait_for(cards, 30.0, "the approval")[0]
    rows = rows_of(card.find_element(By.CSS_SELECTOR, '[data-block="writes"]'))
    assert len(rows) == 40 and rows[-1] == ("40", "line 40 of the note")
    assert card.find_element(By.CSS_SELECTOR, '[data-field="server"]').text == (
        "(not recorded in the database)"
    )
    by = browser.driver.find_element(By.ID, "by")
    by.clear()
    by.send_keys("carol")
    card.find_element(By.CSS_SELECTOR, "button.approve").click()
    browser.wait_for(
        lambda driver: (
            "approved by carol" in card.find_element(By.CSS_SELECTOR, '[data-field="outcome"]').text
        ),
        30.0,
        "the approval to be recorded",
    )
    with open_store(produced.database, read_only=True, create=False) as store:
        approval = store.get_approval(produced.approval_id)
    assert (approval.status, approval.decided_by) == (ApprovalStatus.APPROVED, "carol")


def test_a_changed_approval_is_refused_on_the_page_with_the_commands_message(
    produced: Produced, inbox: Inbox, browser: Browser
) -> None:
    import sqlite3

    open_page(browser, inbox.page)
    browser.wait_for(cards, 30.0, "the approval")
    # Let the refresh the stream's first event starts land: a row edited
    # after it changes nothing the page is told about, so the card stays as shown.
    time.sleep(2)
    card = cards(browser)[0]
    with sqlite3.connect(produced.database) as connection:
        connection.execute(
            "UPDATE approvals SET args = ? WHERE approval_id = ?",
            ('{"path": "../../.bashrc", "content": "evil"}', produced.approval_id),
        )
    card.find_element(By.CSS_SELECTOR, "button.approve").click()
    message = browser.wait_for(
        lambda driver: card.find_element(By.CSS_SELECTOR, '[data-field="outcome"]').text,
        30.0,
        "the refusal",
    )
    assert message.startswith("not decided: ") and "no longer matches its hash" in message
    with open_store(produced.database, read_only=True, create=False) as store:
        assert store.get_approval(produced.approval_id).status is ApprovalStatus.PENDING


def test_the_page_without_its_token_shows_how_to_get_in_and_no_data(
    produced: Produced, inbox: Inbox, browser: Browser
) -> None:
    browser.driver.get(inbox.base)
    browser.wait_for(
        lambda driver: driver.find_element(By.ID, "no-token").is_displayed(), 30.0, "the notice"
    )
    time.sleep(1)
    assert cards(browser) == []
    assert produced.approval_id not in browser.driver.page_source
