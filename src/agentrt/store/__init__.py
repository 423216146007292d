"""The store: runs, steps, approvals and a hash-chained event log, in SQLite.

(Or in PostgreSQL, for a `postgresql://` URL: the same SQL through an adapter
with the same connection surface, `_postgres.py`; decision 0015.  What
follows describes SQLite; the PostgreSQL differences are in that module and
in the store's hooks for each backend, `_backend.py`.)

Tables are the state; events are the explanation.  Every state change is
written in the same transaction as its event, and each event's hash covers the
previous event's hash and its own canonical content, so `verify_chain` finds
the first event that was altered, removed or inserted after the fact.

The database is the operator's: whoever can write it can forge an approval.
So a new file is created owner-only (0600, whatever the umask), a file that
group or others can write is refused, a symbolic link is refused, and a
database from a newer build is refused rather than misread.

A database that is not ours, or lost what it held, is refused too: an
existing file is opened only if it already holds the agentrt schema (never
initialised in place), holds no trigger or view, and passes SQLite's quick
check; and a **head anchor** beside it (`<db>.anchor`: the last committed
event's seq and hash) refuses a database whose chain is behind it — a WAL
deleted after a crash, an old copy restored, a truncated file.  (On
PostgreSQL each host keeps its own anchor for the database, in its state
directory: `postgres_anchor_path`.)

Store work is synchronous, on one connection under the store's lock; async
code runs it off the event loop with `Store.run` (a worker thread) and
`Store.write` (the store's one writer thread), so neither an fsync nor a busy
wait ever stalls the loop.  The writer **commits in groups**: the `write`
units of concurrent callers share one SQLite transaction, each in its own
savepoint (a failing unit rolls back only itself), and every caller is
answered only after that transaction's COMMIT returned and the anchor was
written — so nothing a caller is told is ahead of the disk.  A busy database
is waited on in short steps until a deadline (`StoreBusy`), never for ever.

The rooms, each a module of this package:

- `ledger.py`: every write of a run, step or approval, one typed function per
  transition (its compare-and-set and its event), and `verify_state`;
- `events.py`: the event vocabulary (`EventType`, `EndReason`) and the legal
  transitions as data (`TRANSITIONS`), which drive both the ledger and `verify_state`;
- `_store.py`: `Store`, its lock and transactions, `run` and `write`;
- `_group_commit.py`: the writer thread and the units it commits in groups;
- `_reads.py`: runs, steps, approvals and events read back as records;
- `_records.py`: the statuses, the records and reports, the row mappers;
- `_chain.py`: hashing and appending events, `verify_chain`, `verify_state`;
- `_anchor.py`: the head anchor, written after each commit and checked at opening;
- `_outbox.py`: the notification outbox (the `notify` extension), written by the
  ledger with the event it announces once a route is enabled, and its sweep;
- `_schema.py`: the core migrations and the extensions' own (the proxy's call
  index, `proxy/_index.py`; the accounting, `accounting.py`);
- `_grants.py`: the standing grants' extension tables, records and reads;
- `_principals.py`: a run's principal (`Principal`), recorded in its `run_started`
  event only when it has one, and read back (`Store.principal_of_run`);
- `_open.py`: `open_store`, for a file or a URL;
- `_sqlite.py`: opening a SQLite file safely, and SQLite's hooks;
- `_postgres.py`: the PostgreSQL adapter, and PostgreSQL's hooks;
- `_backend.py`: the hooks themselves, what differs between the two;
- `_times.py`: times as the store writes them.

Nothing above the store writes SQL but its extensions, and nothing above
it catches a database driver's errors (`tests/test_architecture.py`).
"""

from typing import TYPE_CHECKING, Final

from .._lazy import lazy_names

if TYPE_CHECKING:
    from ._anchor import postgres_anchor_path
    from ._chain import GENESIS_HASH, event_hash
    from ._grants import (
        GrantLimits,
        GrantStatus,
        StandingGrant,
        grant_limits,
        list_standing_grants,
        live_standing_grants,
        migrate_grants,
        set_grant_limits,
        standing_grant,
    )
    from ._open import open_store
    from ._passkeys import enable_passkey_mode, in_passkey_mode
    from ._principals import Principal, principal_from_payload
    from ._reads import _LIST_RUNS as _LIST_RUNS  # not public: a test compares it with a sort
    from ._records import (
        AnchorReport,
        ApprovalRecord,
        ApprovalStatus,
        ChainReport,
        Connection,
        Event,
        RunRecord,
        RunStatus,
        StateReport,
        StepRecord,
        StepStatus,
        approval_hash,
    )
    from ._schema import SCHEMA_VERSION
    from ._sqlite import DATABASE_ERRORS, INTEGRITY_ERRORS
    from ._store import Store
    from ._target import is_postgres_url
    from ._times import epoch_to_iso, iso_to_epoch, utc_at, utc_now

__all__ = [
    "DATABASE_ERRORS",
    "GENESIS_HASH",
    "INTEGRITY_ERRORS",
    "SCHEMA_VERSION",
    "AnchorReport",
    "ApprovalRecord",
    "ApprovalStatus",
    "ChainReport",
    "Connection",
    "Event",
    "GrantLimits",
    "GrantStatus",
    "Principal",
    "RunRecord",
    "RunStatus",
    "StandingGrant",
    "StateReport",
    "StepRecord",
    "StepStatus",
    "Store",
    "approval_hash",
    "enable_passkey_mode",
    "epoch_to_iso",
    "event_hash",
    "grant_limits",
    "in_passkey_mode",
    "is_postgres_url",
    "iso_to_epoch",
    "list_standing_grants",
    "live_standing_grants",
    "migrate_grants",
    "open_store",
    "postgres_anchor_path",
    "principal_from_payload",
    "set_grant_limits",
    "standing_grant",
    "utc_at",
    "utc_now",
]

# Each name is imported on first use (as the package `agentrt`'s are): the proxy's
# configuration names `GrantLimits` before it spawns the servers, and must not pay for
# the ledger, the chain and the readers then (issue 36).
_WHERE: Final = {
    "postgres_anchor_path": "._anchor",
    "GENESIS_HASH": "._chain",
    "event_hash": "._chain",
    "GrantLimits": "._grants",
    "GrantStatus": "._grants",
    "StandingGrant": "._grants",
    "grant_limits": "._grants",
    "list_standing_grants": "._grants",
    "live_standing_grants": "._grants",
    "migrate_grants": "._grants",
    "set_grant_limits": "._grants",
    "standing_grant": "._grants",
    "is_postgres_url": "._target",
    "open_store": "._open",
    "enable_passkey_mode": "._passkeys",
    "in_passkey_mode": "._passkeys",
    "Principal": "._principals",
    "principal_from_payload": "._principals",
    "_LIST_RUNS": "._reads",
    "AnchorReport": "._records",
    "ApprovalRecord": "._records",
    "ApprovalStatus": "._records",
    "ChainReport": "._records",
    "Connection": "._records",
    "Event": "._records",
    "RunRecord": "._records",
    "RunStatus": "._records",
    "StateReport": "._records",
    "StepRecord": "._records",
    "StepStatus": "._records",
    "approval_hash": "._records",
    "SCHEMA_VERSION": "._schema",
    "DATABASE_ERRORS": "._sqlite",
    "INTEGRITY_ERRORS": "._sqlite",
    "Store": "._store",
    "epoch_to_iso": "._times",
    "iso_to_epoch": "._times",
    "utc_at": "._times",
    "utc_now": "._times",
}

__getattr__ = lazy_names(__name__, _WHERE, globals())
