"""Notifications that are never lost: `"notify"` in proxy.json, and their delivery.

Each target (`{url, secret_file, events, format}`) gets a signed JSON POST for the
events it names: `approval_requested`, `approval_decided`, `approval_expired`,
`unknown_outcome`.  The promise to send it is an outbox row written in the transaction
of the event (`store/_outbox.py`); this module routes events to targets, and delivers
due rows from a task of the proxy's own (`delivering`), never on a call's path: a
failed attempt is retried with backoff for up to a day, then the row is recorded
`undelivered`.  Delivery is at least once: a receiver deduplicates on the
`Idempotency-Key` header (the event's seq, also in the body).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

import anyio

from ..sanitize import sanitize

if TYPE_CHECKING:
    import httpx2

    from ..store import Store
    from ..store._outbox import OutboxRow

__all__ = [
    "TOPICS",
    "Notifier",
    "NotifyTarget",
    "delivering",
    "message_for",
    "parse_notify",
    "route_for",
]

TOPICS: Final = ("approval_requested", "approval_decided", "approval_expired", "unknown_outcome")
FORMATS: Final = ("json", "slack")
_FIELDS: Final = frozenset({"url", "secret_file", "events", "format"})
MAX_AGE: Final = 24 * 3600.0
"""Seconds a notification is retried before it is recorded `undelivered`."""
_UNKNOWN_OUTCOME_KIND: Final = "unknown_outcome"
_SWEEP_BATCH: Final = 500
_SAY_AGAIN_AFTER: Final = 60.0


@dataclass(frozen=True, slots=True)
class NotifyTarget:
    """One receiver: where, with which secret (read at load; never shown), for which topics."""

    url: str
    secret_file: Path
    events: frozenset[str]
    format: str = "json"
    secret: bytes = field(default=b"", repr=False)


def parse_notify(raw: Any, config_path: Path) -> tuple[NotifyTarget, ...]:
    """`"notify"` checked: a list of targets, each sentence naming the file and the field."""
    from ..approver import SecretError, read_secret
    from .config import ConfigError

    def fail(where: str, problem: str) -> ConfigError:
        return ConfigError(f"{config_path}: {where} {problem}")

    if not isinstance(raw, list) or not raw:
        raise fail("notify", "must be a non-empty list of {url, secret_file, events, format}")
    targets: list[NotifyTarget] = []
    for index, entry in enumerate(raw):
        where = f"notify[{index}]"
        if not isinstance(entry, dict):
            raise fail(where, "must be a JSON object")
        for name in entry:
            if name not in _FIELDS:
                raise fail(f"{where}.{sanitize(name)}", "is not a field this file may have")
        url = entry.get("url")
        if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https"):
            raise fail(f"{where}.url", "must be an http:// or https:// URL")
        if not urlsplit(url).hostname:
            raise fail(f"{where}.url", "must name a host")
        if any(target.url == url for target in targets):
            raise fail(f"{where}.url", "names a URL an earlier target names")
        secret_text = entry.get("secret_file")
        if not isinstance(secret_text, str) or not secret_text:
            raise fail(f"{where}.secret_file", "is required: the file of the signing secret")
        secret_path = Path(secret_text).expanduser()
        if not secret_path.is_absolute():
            secret_path = config_path.parent / secret_path
        try:
            secret = read_secret(secret_path)
        except SecretError as exc:
            raise fail(f"{where}.secret_file", f"is refused: {exc}") from None
        events = entry.get("events", list(TOPICS))
        if (
            not isinstance(events, list)
            or not events
            or not all(isinstance(name, str) and name in TOPICS for name in events)
        ):
            raise fail(f"{where}.events", f"must be a non-empty list of {', '.join(TOPICS)}")
        shape = entry.get("format", "json")
        if shape not in FORMATS:
            raise fail(f"{where}.format", "must be json or slack")
        targets.append(NotifyTarget(url, secret_path, frozenset(events), shape, secret))
    return tuple(targets)


def topic_of(event_type: str, payload: Mapping[str, Any]) -> str | None:
    """The notification topic an event is, if any."""
    if event_type == "approval_requested":
        kind = payload.get("kind")
        return "unknown_outcome" if kind == _UNKNOWN_OUTCOME_KIND else "approval_requested"
    if event_type in ("approval_granted", "approval_rejected"):
        return "approval_decided"
    if event_type == "approval_expired":
        return "approval_expired"
    return None


def route_for(targets: Sequence[NotifyTarget]) -> Any:
    """The outbox's route: (event type, payload) → the (target url, topic) pairs."""

    def route(event_type: str, payload: Mapping[str, Any]) -> list[tuple[str, str]]:
        topic = topic_of(event_type, payload)
        if topic is None:
            return []
        return [(target.url, topic) for target in targets if topic in target.events]

    return route


def _slack_escaped(text: str) -> str:
    # Slack reads &, < and > as markup (links, mentions); the text must stay text.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def message_for(store: Store, row: OutboxRow) -> dict[str, Any]:
    """The JSON message announcing `row`'s event: its seq, what happened, the approval's
    sanitized text and its approver-channel path.  Blocking: call it in `Store.run`."""
    from ..approver import ApprovalView, approval_path
    from ..inbox.review import displayed_hash

    event = store.event_at(row.event_seq)
    if event is None:
        raise LookupError(f"event {row.event_seq} is not in the database")
    approval_id = str(event.payload.get("approval_id", ""))
    approval = store.get_approval(approval_id)
    run = store.get_run(approval.run_id)
    view = ApprovalView(approval, displayed_hash(approval), run.status)
    tool = sanitize(approval.tool)
    if row.topic == "approval_decided":
        verdict = "approved" if event.type == "approval_granted" else "rejected"
        by = sanitize(str(event.payload.get("by", "")))
        note = sanitize(str(event.payload.get("note", "")))
        text = f"Approval {sanitize(approval_id)} of {tool} was {verdict} by {by or '-'}"
        text += f": {note}" if note else ""
    elif row.topic == "approval_expired":
        text = f"Approval {sanitize(approval_id)} of {tool} expired; the run is cancelled"
    else:
        text = view.text()
    message: dict[str, Any] = {
        "seq": event.seq,
        "event": row.topic,
        "type": event.type,
        "run_id": approval.run_id,
        "approval_id": approval_id,
        "tool": approval.tool,
        "kind": approval.kind,
        "hash": view.shown_hash,
        "status": str(approval.status),
        "at": event.created_at,
        "path": approval_path(approval.run_id, approval_id),
        "text": text,
    }
    if row.topic == "approval_decided":
        message["decision"] = "approved" if event.type == "approval_granted" else "rejected"
        message["by"] = str(event.payload.get("by", ""))
        message["note"] = str(event.payload.get("note", ""))
    return message


def body_for(target: NotifyTarget, message: Mapping[str, Any]) -> bytes:
    """What is POSTed: the message, or for `"slack"` an incoming webhook's `{"text"}`."""
    if target.format == "slack":
        text = f"{_slack_escaped(str(message['text']))}\n(agentrt {message['path']})"
        document: Mapping[str, Any] = {"text": text}
    else:
        document = message
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass
class Notifier:
    """Delivers the outbox's due rows to their targets; one task, off every call's path."""

    store: Store
    targets: Sequence[NotifyTarget]
    log: IO[str] | None = None
    poll: float = 0.5
    first_retry: float = 1.0
    max_retry: float = 300.0
    max_age: float = MAX_AGE
    batch: int = 16
    timeout: float = 10.0
    delivered: int = 0

    def _backoff(self, attempts: int) -> float:
        return float(min(self.first_retry * (2 ** min(attempts, 30)), self.max_retry))

    async def run(self) -> None:
        """Deliver until cancelled."""
        import httpx2

        async with httpx2.AsyncClient(
            timeout=self.timeout, follow_redirects=False, trust_env=False
        ) as client:
            said_at = -_SAY_AGAIN_AFTER
            while True:
                try:
                    await self.deliver_due(client)
                except Exception as exc:  # a busy database, a vanished file: next poll
                    # Said, at most once a minute: a notifier that silently never
                    # delivers would be worse than none.
                    if self.log is not None and time.monotonic() - said_at >= _SAY_AGAIN_AFTER:
                        said_at = time.monotonic()
                        from ._log import log_line

                        log_line(
                            self.log,
                            "agentrt proxy: notifications: "
                            + sanitize(f"{type(exc).__name__}: {exc}")[:300],
                        )
                await anyio.sleep(self.poll)

    async def deliver_due(self, client: httpx2.AsyncClient) -> int:
        """One round: claim what is due and try each; how many were delivered."""
        from ..store._outbox import claim_due, sweep

        outbox = self.store.outbox
        if outbox is not None:
            # The events other processes wrote (a decision by `agentrt approve`, the
            # inbox or the approver channel), which they could not announce themselves.
            while await self.store.run(sweep, self.store, outbox) == _SWEEP_BATCH:
                pass
        now = time.time()
        urls = [target.url for target in self.targets]
        rows = await self.store.run(claim_due, self.store, urls, now, self.batch, self.timeout + 5)
        delivered = 0
        async with anyio.create_task_group() as group:
            for row in rows:

                async def attempt(row: OutboxRow = row) -> None:
                    nonlocal delivered
                    delivered += await self._attempt(client, row)

                group.start_soon(attempt)
        return delivered

    async def _attempt(self, client: httpx2.AsyncClient, row: OutboxRow) -> int:
        from ..approver._signing import signed_headers
        from ..store._outbox import mark_delivered, mark_failed, mark_undelivered

        target = next((target for target in self.targets if target.url == row.target), None)
        problem: str
        if target is None:
            problem = "no target of the configuration has this URL any more"
        else:
            try:
                message = await self.store.run(message_for, self.store, row)
                body = body_for(target, message)
                path = urlsplit(target.url).path or "/"
                headers = {
                    "Content-Type": "application/json",
                    "Idempotency-Key": str(row.event_seq),
                    **signed_headers(target.secret, "POST", path, body),
                }
                answer = await client.post(target.url, content=body, headers=headers)
                if 200 <= answer.status_code < 300:
                    await self.store.run(mark_delivered, self.store, row, time.time())
                    self.delivered += 1
                    return 1
                problem = f"the receiver answered {answer.status_code}"
            except Exception as exc:  # a refused connection, a timeout, a vanished row
                problem = sanitize(f"{type(exc).__name__}: {exc}")[:300]
        now = time.time()
        if now - row.created_at >= self.max_age:
            await self.store.run(mark_undelivered, self.store, row, problem)
            if self.log is not None:
                from ._log import log_line

                log_line(
                    self.log,
                    f"agentrt proxy: notification of event {row.event_seq} to "
                    f"{sanitize(row.target)} undelivered after {row.attempts + 1} attempts: "
                    f"{problem}",
                )
        else:
            next_at = now + self._backoff(row.attempts)
            await self.store.run(mark_failed, self.store, row, problem, next_at)
        return 0


@contextlib.asynccontextmanager
async def delivering(
    store: Store, targets: Sequence[NotifyTarget], log: IO[str] | None
) -> AsyncIterator[Notifier | None]:
    """While the block runs: the store announces what `targets` want, and a task delivers
    it (nothing at all without targets)."""
    if not targets:
        yield None
        return
    from ..store._outbox import enable_outbox

    await store.run(
        enable_outbox, store, route_for(targets), time.time, [target.url for target in targets]
    )
    notifier = Notifier(store, targets, log)
    async with anyio.create_task_group() as group:
        group.start_soon(notifier.run)
        try:
            yield notifier
        finally:
            group.cancel_scope.cancel()
