"""Notifications that are never lost: the outbox row in the event's transaction, delivery
to a real receiver taken down and brought back, the slack shape, the day's limit."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from approver_support import SECRET, secret_file, waiting_run
from notify_receiver import Receiver

from agentrt import approve
from agentrt.approver import approval_path
from agentrt.proxy._notify import TOPICS, NotifyTarget, delivering
from agentrt.proxy.config import ConfigError, load_config
from agentrt.store import RunStatus, Store, ledger, open_store
from agentrt.store._outbox import enable_outbox, outbox_rows

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


def _target(receiver: Receiver, tmp_path: Path, shape: str = "json") -> NotifyTarget:
    return NotifyTarget(
        receiver.url, secret_file(tmp_path), frozenset(TOPICS), shape, receiver.secret
    )


def _seqs(store: Store, *types: str) -> list[int]:
    return [event.seq for event in store.events_after(0, limit=10_000) if event.type in types]


async def _until(condition: Any, seconds: float = 30.0) -> None:
    with anyio.fail_after(seconds):
        while not condition():
            await anyio.sleep(0.05)


def _config(tmp_path: Path, notify: Any) -> Path:
    document = {
        "database": "proxy.db",
        "session": "s",
        "notify": notify,
        "servers": [{"name": "a", "command": ["true"], "manifest": "a.json", "rules": {}}],
    }
    path = tmp_path / "proxy.json"
    path.write_text(json.dumps(document))
    path.chmod(0o600)
    return path


def test_notify_targets_are_read_with_their_defaults_and_their_secret_protected(
    tmp_path: Path,
) -> None:
    secret = secret_file(tmp_path)
    config = load_config(
        _config(tmp_path, [{"url": "https://chat.example/hook", "secret_file": secret.name}])
    )
    (target,) = config.notify
    assert (target.url, target.events, target.format, target.secret) == (
        "https://chat.example/hook", frozenset(TOPICS), "json", SECRET,
    )  # fmt: skip
    assert secret in config.protected_paths()
    assert SECRET.decode() not in repr(config)


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"url": "ftp://x/hook", "secret_file": "s"}, "notify[0].url must be an http"),
        ({"url": "https://x/hook"}, "notify[0].secret_file is required"),
        ({"url": "https://x/h", "secret_file": "s", "events": ["run_started"]}, "events must be"),
        ({"url": "https://x/h", "secret_file": "s", "format": "xml"}, "must be json or slack"),
        ({"url": "https://x/h", "secret_file": "s", "retry": 3}, "notify[0].retry is not a field"),
        ({"url": "https://x/h", "secret_file": "shared"}, "can be read or written by others"),
    ],
)
def test_a_bad_notify_target_is_refused_naming_it(
    tmp_path: Path, entry: dict[str, Any], problem: str
) -> None:
    secret_file(tmp_path, name="s")
    secret_file(tmp_path, mode=0o644, name="shared")
    with pytest.raises(ConfigError, match=problem.replace(".", r"\.").replace("[", r"\[")):
        load_config(_config(tmp_path, [entry]))


async def test_the_outbox_row_is_written_in_the_transaction_of_its_event(
    database: str | Path, tmp_path: Path
) -> None:
    with open_store(database) as store:
        routes = {"approval_requested": "approval_requested", "approver_refused": "refused"}
        enable_outbox(
            store,
            lambda type_, payload: [("r", routes[type_])] if type_ in routes else [],
            lambda: 1.0,
            ["r"],
        )
        waiting = await waiting_run(store)
        (row,) = outbox_rows(store)
        assert row.event_seq == _seqs(store, "approval_requested")[0]
        assert (row.topic, row.run_id, row.state) == ("approval_requested", waiting.run_id,
                                                      "pending")  # fmt: skip

        def refused_then_failed(connection: Any) -> None:
            ledger.record_approver_refusal(store, connection, "", {"code": "x"})
            raise RuntimeError("the unit fails after its event")

        head = store.head()
        with pytest.raises(RuntimeError):
            await store.write(refused_then_failed)
        # The event rolled back, and its announcement with it.
        assert store.head() == head and len(outbox_rows(store)) == 1
        await store.write(functools.partial(ledger.record_approver_refusal, store), "", {})
        assert [row.topic for row in outbox_rows(store)] == ["approval_requested", "refused"]


async def test_a_receiver_down_for_a_while_gets_every_notification_when_it_comes_back(
    database: str | Path, tmp_path: Path
) -> None:
    receiver = Receiver(b"r" * 40)
    with open_store(database) as store, open_store(database) as elsewhere:
        async with delivering(store, [_target(receiver, tmp_path)], None) as notifier:
            assert notifier is not None
            notifier.poll, notifier.first_retry, notifier.max_retry = 0.1, 0.2, 0.5
            first = await waiting_run(store, content="\u202ehidden")
            decided = await waiting_run(store)
            expiring = await waiting_run(store, approval_ttl=0.3)
            # Decided by another process that knows nothing of notifications (as `agentrt
            # approve` or the approver channel would): found by the sweep.
            approve(elsewhere, decided.run_id, approval_hash=decided.approval_hash, by="alice")
            await anyio.sleep(0.5)
            with pytest.raises(Exception, match="expired"):
                approve(elsewhere, expiring.run_id, approval_hash=expiring.approval_hash)
            run_id = await _unknown_outcome_run(store)
            await anyio.sleep(1.0)
            assert receiver.received == []
            rows = outbox_rows(store)
            assert rows and all(row.state == "pending" for row in rows)
            assert any(row.attempts >= 1 and row.last_error for row in rows)
            async with receiver.serving():
                expected = _seqs(
                    store, "approval_requested", "approval_granted", "approval_expired"
                )
                await _until(lambda: receiver.delivered_keys() >= {str(seq) for seq in expected})
    assert receiver.delivered_keys() == {str(seq) for seq in expected}
    assert receiver.bad_signatures == 0
    for key, bodies in receiver.by_key().items():
        assert all(body == bodies[0] for body in bodies), key  # a duplicate is the same message
        assert bodies[0]["seq"] == int(key)
    messages = {body["seq"]: body for _, body in receiver.received}
    topics = sorted(body["event"] for body in messages.values())
    assert topics == sorted(["approval_requested"] * 3 + ["unknown_outcome", "approval_decided",
                                                          "approval_expired"])  # fmt: skip
    requested = next(body for body in messages.values() if body["run_id"] == first.run_id)
    assert requested["path"] == approval_path(first.run_id, first.approval_id)
    assert requested["hash"] == first.approval_hash and "\u202e" not in requested["text"]
    granted = next(body for body in messages.values() if body["event"] == "approval_decided")
    assert (granted["decision"], granted["by"], granted["run_id"]) == (
        "approved", "alice", decided.run_id,
    )  # fmt: skip
    unknown = next(body for body in messages.values() if body["event"] == "unknown_outcome")
    assert unknown["run_id"] == run_id
    with open_store(database) as store:
        assert {row.state for row in outbox_rows(store)} == {"delivered"}
        assert store.verify_chain().ok


async def _unknown_outcome_run(store: Store) -> str:
    """A run held on an `unknown_outcome` approval, as the proxy holds one."""
    from agentrt import Gate

    gate = Gate(store, [], owner="test")
    run_id = await gate.start("a call whose outcome is unknown")
    request = ledger.ApprovalRequest(
        run_id, 1, "files_write", "{}", "unknown_outcome", {}, {}, "outcome unknown", None
    )
    await store.write(lambda connection: ledger.request_approval(store, connection, request, 0))
    assert store.get_run(run_id).status is RunStatus.WAITING_FOR_APPROVAL
    return run_id


async def test_a_slack_target_gets_an_incoming_webhook_body_with_markup_escaped(
    tmp_path: Path,
) -> None:
    receiver = Receiver(b"s" * 40)
    with open_store(tmp_path / "runs.db") as store:
        async with (
            receiver.serving(),
            delivering(store, [_target(receiver, tmp_path, "slack")], None) as notifier,
        ):
            assert notifier is not None
            notifier.poll = 0.1
            await waiting_run(store, content="<!channel> & <http://evil|click>")
            await _until(lambda: len(receiver.received) == 1)
    ((_key, body),) = receiver.received
    assert set(body) == {"text"}
    assert "<!channel>" not in body["text"] and "&lt;!channel&gt;" in body["text"]
    assert "/runs/" in body["text"]


async def test_a_notification_undelivered_for_its_whole_window_is_recorded_undelivered(
    tmp_path: Path,
) -> None:
    receiver = Receiver(b"u" * 40)
    with open_store(tmp_path / "runs.db") as store:
        async with delivering(store, [_target(receiver, tmp_path)], None) as notifier:
            assert notifier is not None
            notifier.poll, notifier.first_retry, notifier.max_age = 0.1, 0.1, 0.6
            await waiting_run(store)
            await _until(lambda: outbox_rows(store)[0].state == "undelivered", 20)
        (row,) = outbox_rows(store)
        assert row.attempts >= 2 and "ConnectError" in row.last_error
        assert row.delivered_at is None


async def test_each_target_is_swept_from_its_own_cursor(database: str | Path) -> None:
    from agentrt.store._outbox import sweep

    everything = ("approval_requested", "approval_granted")

    def route_to(target: str) -> Any:
        return lambda type_, payload: [(target, type_)] if type_ in everything else []

    with (
        open_store(database) as first,
        open_store(database) as second,
        open_store(database) as deciding,
    ):
        enable_outbox(first, route_to("a"), lambda: 1.0, ["a"])
        waiting = await waiting_run(deciding)  # written by a process that knows no route
        enable_outbox(second, route_to("b"), lambda: 1.0, ["b"])  # configured after it
        approve(deciding, waiting.run_id, approval_hash=waiting.approval_hash, by="x")
        assert first.outbox is not None and second.outbox is not None
        assert sweep(first, first.outbox) > 0
        assert sweep(second, second.outbox) > 0
        assert sweep(first, first.outbox) == 0  # nothing new, nothing written
        rows = {(row.target, row.topic) for row in outbox_rows(first)}
        # "a" was configured before the request: both events; "b" only the decision.
        assert rows == {("a", "approval_requested"), ("a", "approval_granted"),
                        ("b", "approval_granted")}  # fmt: skip


async def test_a_notifier_that_cannot_deliver_says_so_once_a_minute(tmp_path: Path) -> None:
    import io

    from agentrt.proxy._notify import Notifier

    receiver = Receiver(b"l" * 40)
    log = io.StringIO()
    with open_store(tmp_path / "runs.db") as store:
        # No outbox tables: every round fails on the database.
        notifier = Notifier(store, [_target(receiver, tmp_path)], log, poll=0.05)
        with anyio.move_on_after(0.5):
            await notifier.run()
    lines = [line for line in log.getvalue().splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("agentrt proxy: notifications: "), lines
    assert "notify_outbox" in lines[0]
