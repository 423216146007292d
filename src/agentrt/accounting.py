"""Model accounting: what each model attempt spent, and the limits checked before the next.

Every attempt at a model call — answered, refused, or sent and never
answered — is a row in `model_attempts`, written in the same transaction as
its `model_attempt` event, so the table and the audit log cannot disagree.
What a limit counts is what was *charged*: the usage the provider reported
when it is plausible, and otherwise the attempt's whole budget (its request
bytes as input tokens, its `max_tokens` as output), because a provider that
did not say what it billed may have billed all of it.
"""

from __future__ import annotations

import enum
import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from .errors import AgentrtError
from .sanitize import sanitize
from .store import Event, RunStatus, Store, iso_to_epoch
from .store.events import EventType

if TYPE_CHECKING:
    # For the annotations only: the command's readers of spending never load the agent.
    from .agent import Decision, StepInput

__all__ = [
    "DEFAULT_PRICES",
    "MIGRATIONS",
    "AttemptOutcome",
    "AttemptReport",
    "MeteredAgent",
    "ModelAttempt",
    "ModelLimits",
    "ModelMeter",
    "Price",
    "PriceTable",
    "PriceUnknown",
    "RecordedReply",
    "RunMeter",
    "RunSpending",
    "SpendingLimitReached",
    "Usage",
    "active_seconds",
    "carried_context",
    "list_attempts",
    "recorded_replies",
    "run_spending",
    "spending_by_run",
    "spending_of",
]

_MILLION: Final = Decimal(1_000_000)

MIGRATIONS: Final[Sequence[str]] = (
    """
    CREATE TABLE model_attempts (
        run_id TEXT NOT NULL REFERENCES runs (run_id),
        step INTEGER NOT NULL,
        attempt INTEGER NOT NULL,
        provider TEXT NOT NULL,
        model TEXT NOT NULL,
        started_at TEXT NOT NULL,
        finished_at TEXT NOT NULL,
        outcome TEXT NOT NULL,
        stop_reason TEXT,
        input_tokens INTEGER,
        output_tokens INTEGER,
        cache_creation_input_tokens INTEGER,
        cache_read_input_tokens INTEGER,
        charged_tokens INTEGER NOT NULL,
        cost TEXT,
        note TEXT NOT NULL DEFAULT '',
        error TEXT NOT NULL DEFAULT '',
        event_seq INTEGER NOT NULL,
        PRIMARY KEY (run_id, step, attempt)
    )
    """,
    # What an adapter keeps of an answer for its next request in the run (Anthropic's
    # thinking blocks with their signatures), so a run resumed in another process sends it.
    """
    ALTER TABLE model_attempts ADD COLUMN carry TEXT
    """,
    # An answer's body exactly as it came, when the adapter records replies (replay).
    """
    ALTER TABLE model_attempts ADD COLUMN reply TEXT
    """,
)
"""The `models` extension's tables, applied with `Store.migrate_extension`."""


class AttemptOutcome(enum.StrEnum):
    """How one attempt ended.  AMBIGUOUS: the request was sent and no answer came back."""

    OK = "ok"
    TRANSIENT_ERROR = "transient_error"
    PERMANENT_ERROR = "permanent_error"
    AMBIGUOUS = "ambiguous"


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens of one reply.  `input_tokens` excludes cached input, as Anthropic counts it."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0

    @property
    def total(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_creation_input_tokens
            + self.cache_read_input_tokens
        )


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million tokens; a cache price left out is charged at the input price."""

    input: Decimal
    output: Decimal
    cache_write: Decimal | None = None
    cache_read: Decimal | None = None

    def cost(self, usage: Usage) -> Decimal:
        cache_write = self.input if self.cache_write is None else self.cache_write
        cache_read = self.input if self.cache_read is None else self.cache_read
        total = (
            usage.input_tokens * self.input
            + usage.output_tokens * self.output
            + usage.cache_creation_input_tokens * cache_write
            + usage.cache_read_input_tokens * cache_read
        )
        return total / _MILLION


def _price(input_: str, output: str, cache_write: str, cache_read: str) -> Price:
    return Price(Decimal(input_), Decimal(output), Decimal(cache_write), Decimal(cache_read))


DEFAULT_PRICES: Final[Mapping[str, Price]] = {
    # List prices as the providers published them in 2025 (USD per million
    # tokens). Prices change: a consumer who enforces a cost limit should pass
    # its own table.
    "anthropic:claude-opus-4-5": _price("5", "25", "6.25", "0.50"),
    "anthropic:claude-opus-4-1": _price("15", "75", "18.75", "1.50"),
    "anthropic:claude-opus-4": _price("15", "75", "18.75", "1.50"),
    "anthropic:claude-sonnet-4-5": _price("3", "15", "3.75", "0.30"),
    "anthropic:claude-sonnet-4": _price("3", "15", "3.75", "0.30"),
    "anthropic:claude-haiku-4-5": _price("1", "5", "1.25", "0.10"),
    "anthropic:claude-3-5-haiku": _price("0.80", "4", "1", "0.08"),
    "openai:gpt-4o": _price("2.50", "10", "2.50", "1.25"),
    "openai:gpt-4o-mini": _price("0.15", "0.60", "0.15", "0.075"),
    "openai:gpt-4.1": _price("2", "8", "2", "0.50"),
    "openai:gpt-4.1-mini": _price("0.40", "1.60", "0.40", "0.10"),
}


@dataclass(frozen=True, slots=True)
class PriceTable:
    """Prices keyed `provider:model` (or `provider:*` for every model of a provider).

    A key also prices dated versions of its model (`anthropic:claude-sonnet-4-5`
    prices `claude-sonnet-4-5-20250929`); the longest matching key wins.  A
    model no key prices costs zero only when `unknown_is_free` says so.
    """

    prices: Mapping[str, Price] = field(default_factory=lambda: dict(DEFAULT_PRICES))
    unknown_is_free: bool = False

    def price(self, provider: str, model: str) -> Price | None:
        key = f"{provider}:{model}"
        if key in self.prices:
            return self.prices[key]
        best: tuple[int, Price] | None = None
        for name, price in self.prices.items():
            if key.startswith(name + "-") and (best is None or len(name) > best[0]):
                best = (len(name), price)
        if best is not None:
            return best[1]
        return self.prices.get(f"{provider}:*")

    def cost(self, provider: str, model: str, usage: Usage) -> Decimal | None:
        """The cost of `usage`, or None when the price is unknown (and not declared free)."""
        if usage.total == 0:
            return Decimal(0)  # nothing charged costs nothing, whatever the price
        price = self.price(provider, model)
        if price is None:
            return Decimal(0) if self.unknown_is_free else None
        return price.cost(usage)


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """What a run may spend on its model, checked before each dispatch; None is off.

    `max_active_time` is seconds in the running state: time waiting for an
    approval does not count.
    """

    max_model_calls: int | None = None
    max_tokens: int | None = None
    max_cost: Decimal | None = None
    max_active_time: float | None = None


class SpendingLimitReached(AgentrtError):
    """A limit stops the next dispatch; the run ends with `reason`."""

    def __init__(self, reason: str, sentence: str) -> None:
        super().__init__(sentence)
        self.reason = reason


class PriceUnknown(AgentrtError):
    """A cost limit is set and the model's price is unknown: nothing is dispatched."""


@dataclass(frozen=True, slots=True)
class AttemptReport:
    """What an adapter tells the meter about one attempt.

    `usage` is what the provider reported (None when it reported nothing usable);
    `charge_in_full` asks for the whole budget to be charged (sent and not
    answered, or an answer whose usage cannot be trusted).  `budget_input` is
    the request's size in bytes — no tokenizer makes a token shorter than a byte.
    """

    provider: str
    model: str
    started_at: str
    finished_at: str
    outcome: AttemptOutcome
    stop_reason: str | None
    usage: Usage | None
    charge_in_full: bool
    budget_input: int
    budget_output: int
    note: str = ""
    error: str = ""
    carry: str | None = None
    """What the adapter keeps of this answer for its next request in the run (JSON text)."""
    reply: bytes | None = None
    """The answer's body exactly as it came, when the adapter records replies."""

    def charged(self) -> Usage:
        if self.charge_in_full:
            return Usage(self.budget_input, self.budget_output)
        return self.usage if self.usage is not None else Usage()


@dataclass(frozen=True, slots=True)
class ModelAttempt:
    """One row of `model_attempts`."""

    run_id: str
    step: int
    attempt: int
    provider: str
    model: str
    started_at: str
    finished_at: str
    outcome: AttemptOutcome
    stop_reason: str | None
    usage: Usage | None
    charged_tokens: int
    cost: Decimal | None
    note: str
    error: str
    carry: str | None = None


@dataclass(frozen=True, slots=True)
class RunSpending:
    """A run's model attempts summed: reported tokens, charged tokens, and cost."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    charged_tokens: int = 0
    cost: Decimal = Decimal(0)
    cost_unknown: bool = False
    """Some attempt had no known price, so `cost` is a lower bound."""


def _usage_of(row: Any) -> Usage | None:
    if row["input_tokens"] is None:
        return None
    return Usage(
        row["input_tokens"],
        row["output_tokens"],
        row["cache_creation_input_tokens"],
        row["cache_read_input_tokens"],
    )


def _attempt_of(row: Any) -> ModelAttempt:
    return ModelAttempt(
        run_id=row["run_id"],
        step=row["step"],
        attempt=row["attempt"],
        provider=row["provider"],
        model=row["model"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        outcome=AttemptOutcome(row["outcome"]),
        stop_reason=row["stop_reason"],
        usage=_usage_of(row),
        charged_tokens=row["charged_tokens"],
        cost=None if row["cost"] is None else Decimal(row["cost"]),
        note=row["note"],
        error=row["error"],
        carry=row["carry"],
    )


def _rows(store: Store, sql: str, parameters: Sequence[Any]) -> list[Any]:
    # A database no metered run has touched has no `models` tables: nothing was spent.
    if store.extension_version("models") == 0:
        return []
    # The store's own read path (its lock, its connection), also for read-only opens.
    return store.query(sql, parameters)


def list_attempts(store: Store, run_id: str) -> list[ModelAttempt]:
    """The run's model attempts, in the order they were made."""
    rows = _rows(
        store, "SELECT * FROM model_attempts WHERE run_id = ? ORDER BY event_seq", (run_id,)
    )
    return [_attempt_of(row) for row in rows]


def _reply_text(reply: bytes | None) -> str | None:
    """A recorded body as text (every answer the adapters take is UTF-8 JSON)."""
    if reply is None:
        return None
    try:
        return reply.decode("utf-8")
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True, slots=True)
class RecordedReply:
    """One answered attempt of a run whose adapter recorded replies, for a replay."""

    step: int
    attempt: int
    provider: str
    model: str
    body: bytes
    sha256: str | None
    """The hash the chain holds for it (None when the event has none)."""


def recorded_replies(store: Store, run_id: str) -> list[RecordedReply]:
    """The run's recorded answers in the order they came, each with the hash its event holds."""
    rows = _rows(
        store,
        "SELECT step, attempt, provider, model, reply, event_seq FROM model_attempts"
        " WHERE run_id = ? AND outcome = 'ok' AND reply IS NOT NULL ORDER BY event_seq",
        (run_id,),
    )
    recorded: list[RecordedReply] = []
    for row in rows:
        event = store.event_at(int(row["event_seq"]))
        digest = event.payload.get("reply_sha256") if event is not None else None
        recorded.append(
            RecordedReply(
                int(row["step"]),
                int(row["attempt"]),
                str(row["provider"]),
                str(row["model"]),
                str(row["reply"]).encode("utf-8"),
                digest if isinstance(digest, str) else None,
            )
        )
    return recorded


def carried_context(store: Store, run_id: str) -> dict[int, str]:
    """What the adapter kept of the answer that decided each step (`AttemptReport.carry`),
    by step: the last answered attempt of a step is the one its decision came from."""
    rows = _rows(
        store,
        "SELECT step, carry FROM model_attempts WHERE run_id = ? AND outcome = 'ok'"
        " AND carry IS NOT NULL ORDER BY event_seq",
        (run_id,),
    )
    return {int(row["step"]): str(row["carry"]) for row in rows}


def spending_of(attempts: Sequence[ModelAttempt]) -> RunSpending:
    """Attempts summed."""
    reported = [attempt.usage for attempt in attempts if attempt.usage is not None]
    costs = [attempt.cost for attempt in attempts if attempt.cost is not None]
    return RunSpending(
        calls=len(attempts),
        input_tokens=sum(usage.input_tokens for usage in reported),
        output_tokens=sum(usage.output_tokens for usage in reported),
        cache_creation_input_tokens=sum(usage.cache_creation_input_tokens for usage in reported),
        cache_read_input_tokens=sum(usage.cache_read_input_tokens for usage in reported),
        charged_tokens=sum(attempt.charged_tokens for attempt in attempts),
        cost=sum(costs, Decimal(0)),
        cost_unknown=len(costs) < len(attempts),
    )


def run_spending(store: Store, run_id: str) -> RunSpending:
    """What the run has spent on its model so far."""
    return spending_of(list_attempts(store, run_id))


def spending_by_run(store: Store, run_ids: Sequence[str]) -> dict[str, RunSpending]:
    """`run_spending` for a page of runs in one query; runs without attempts are left out."""
    if not run_ids:
        return {}
    marks = ",".join("?" * len(run_ids))
    rows = _rows(
        store,
        f"SELECT * FROM model_attempts WHERE run_id IN ({marks}) ORDER BY event_seq",
        list(run_ids),
    )
    grouped: dict[str, list[ModelAttempt]] = {}
    for row in rows:
        grouped.setdefault(row["run_id"], []).append(_attempt_of(row))
    return {run_id: spending_of(attempts) for run_id, attempts in grouped.items()}


_PAUSES: Final = frozenset({"approval_requested"})
_RESUMES: Final = frozenset({"run_started", "run_resumed"})
_ENDS: Final = frozenset(f"run_{status}" for status in RunStatus if status.terminal)


def active_seconds(events: Sequence[Event], now: float) -> float:
    """Seconds the run spent running, by its events: approval waits do not count.

    A gap while no process held a running run (a crash, a stop) does count:
    from the log alone it cannot be told from slow work, and counting it errs
    on the side of the limit.
    """
    total = 0.0
    since: float | None = None
    for event in events:
        at = iso_to_epoch(event.created_at)
        if event.type in _RESUMES and since is None:
            since = at
        elif (event.type in _PAUSES or event.type in _ENDS) and since is not None:
            total += max(0.0, at - since)
            since = None
    if since is not None:
        total += max(0.0, now - since)
    return total


class ModelMeter:
    """What an adapter consults before each attempt and tells after it.

    This one limits nothing and records nothing: an adapter used on its own
    (`decide`) still retries, but nobody keeps the books.
    """

    deadline: float | None = None
    """Epoch seconds past which no attempt (and no retry wait) may run."""
    deadline_reason: str = "deadline"
    """The limit that sets `deadline` (`deadline` or `active_time`), the run's end reason then."""

    async def check(self, provider: str, model: str) -> None:
        """Raise `SpendingLimitReached` or `PriceUnknown` when the next attempt must not go."""

    async def record(self, report: AttemptReport) -> None:
        """Keep the books of one attempt."""


@runtime_checkable
class MeteredAgent(Protocol):
    """An agent that calls a model through a meter: limits before, books after each attempt."""

    async def decide_metered(self, step_input: StepInput, meter: ModelMeter) -> Decision: ...


class RunMeter(ModelMeter):
    """The books of one run's step in its store, and the run's limits on what it spends."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        step: int,
        limits: ModelLimits,
        prices: PriceTable,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.step = step
        self.limits = limits
        self.prices = prices
        if store.extension_version("models") != len(MIGRATIONS):
            # Also refuses tables from a newer build rather than writing into them.
            store.migrate_extension("models", MIGRATIONS)
        run = store.get_run(run_id)
        now = time.time()
        self._run_deadline = run.deadline_at
        self._active_before = 0.0
        if limits.max_active_time is not None:
            events = store.list_events(run_id, limit=1_000_000)
            self._active_before = active_seconds(events, now)
        self._since = time.monotonic()
        deadlines = [(run.deadline_at, "deadline")] if run.deadline_at is not None else []
        if limits.max_active_time is not None:
            deadlines.append((now + limits.max_active_time - self._active_before, "active_time"))
        if deadlines:
            self.deadline, self.deadline_reason = min(deadlines)

    def active(self) -> float:
        """Active seconds of the run so far, this process's time included."""
        return self._active_before + (time.monotonic() - self._since)

    def check_time(self) -> None:
        """The time limits alone (for an agent that calls no model through a meter)."""
        limit = self.limits.max_active_time
        if limit is not None and self.active() >= limit:
            raise SpendingLimitReached(
                "active_time", f"the run has been active {self.active():.1f} s of {limit:g} s"
            )
        if self._run_deadline is not None and time.time() >= self._run_deadline:
            raise SpendingLimitReached("deadline", "the run's deadline has passed")

    async def check(self, provider: str, model: str) -> None:
        await self.store.run(self._check, provider, model)

    def _check(self, provider: str, model: str) -> None:
        self.check_time()
        limits = self.limits
        spent = run_spending(self.store, self.run_id)
        if limits.max_model_calls is not None and spent.calls >= limits.max_model_calls:
            raise SpendingLimitReached(
                "model_call_limit",
                f"the run has made {spent.calls} model calls of {limits.max_model_calls} allowed",
            )
        if limits.max_tokens is not None and spent.charged_tokens >= limits.max_tokens:
            raise SpendingLimitReached(
                "token_limit",
                f"the run has been charged {spent.charged_tokens} tokens of"
                f" {limits.max_tokens} allowed",
            )
        if limits.max_cost is not None:
            if self.prices.price(provider, model) is None and not self.prices.unknown_is_free:
                raise PriceUnknown(
                    f"the price of {sanitize(provider)} model {sanitize(model)!r} is unknown,"
                    " so a cost limit cannot be kept; add it to the price table (or declare"
                    " unknown prices free) before dispatching"
                )
            if spent.cost_unknown:
                raise PriceUnknown(
                    f"run {sanitize(self.run_id)} has model calls of unknown price,"
                    " so its cost limit cannot be kept"
                )
            if spent.cost >= limits.max_cost:
                raise SpendingLimitReached(
                    "cost_limit",
                    f"the run has been charged ${spent.cost} of ${limits.max_cost} allowed",
                )

    async def record(self, report: AttemptReport) -> None:
        await self.store.run(self._record, report)

    def _record(self, report: AttemptReport) -> None:
        charged = report.charged()
        cost = self.prices.cost(report.provider, report.model, charged)
        reported = report.usage
        with self.store.transaction() as connection:
            row = connection.execute(
                "SELECT COALESCE(MAX(attempt), 0) FROM model_attempts"
                " WHERE run_id = ? AND step = ?",
                (self.run_id, self.step),
            ).fetchone()
            attempt = row[0] + 1
            payload: dict[str, Any] = {
                "step": self.step,
                "attempt": attempt,
                "provider": report.provider,
                "model": report.model,
                # When the request went out: a span of the attempt needs its start, and the
                # event is written when it ended.
                "started_at": report.started_at,
                "outcome": str(report.outcome),
                "stop_reason": report.stop_reason,
                "usage": None if reported is None else _usage_json(reported),
                "charged_tokens": charged.total,
                "cost": None if cost is None else str(cost),
                "note": report.note,
                "error": report.error,
            }
            if report.carry is not None:
                # Covered by the chain: what is sent back to the model is what it answered.
                payload["carry"] = report.carry
            reply = _reply_text(report.reply)
            if reply is not None:
                # The body sits beside the event; its hash is in the chain, so a replay
                # of an altered recording is refused.
                payload["reply_sha256"] = hashlib.sha256(report.reply or b"").hexdigest()
            event = self.store.append_event(
                connection, self.run_id, EventType.MODEL_ATTEMPT.value, payload
            )
            connection.execute(
                "INSERT INTO model_attempts (run_id, step, attempt, provider, model, started_at,"
                " finished_at, outcome, stop_reason, input_tokens, output_tokens,"
                " cache_creation_input_tokens, cache_read_input_tokens, charged_tokens, cost,"
                " note, error, event_seq, carry, reply) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
                " ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    self.run_id,
                    self.step,
                    attempt,
                    report.provider,
                    report.model,
                    report.started_at,
                    report.finished_at,
                    str(report.outcome),
                    report.stop_reason,
                    None if reported is None else reported.input_tokens,
                    None if reported is None else reported.output_tokens,
                    None if reported is None else reported.cache_creation_input_tokens,
                    None if reported is None else reported.cache_read_input_tokens,
                    charged.total,
                    None if cost is None else str(cost),
                    report.note,
                    report.error,
                    event.seq,
                    report.carry,
                    reply,
                ),
            )

    async def reached(self, limit: SpendingLimitReached) -> None:
        """Record why the next dispatch did not go (the run then ends with `limit.reason`)."""

        def write() -> None:
            with self.store.transaction() as connection:
                self.store.append_event(
                    connection,
                    self.run_id,
                    EventType.MODEL_LIMIT_REACHED.value,
                    {"step": self.step, "limit": limit.reason, "detail": str(limit)},
                )

        await self.store.run(write)


def _usage_json(usage: Usage) -> dict[str, int]:
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cache_creation_input_tokens": usage.cache_creation_input_tokens,
        "cache_read_input_tokens": usage.cache_read_input_tokens,
    }
