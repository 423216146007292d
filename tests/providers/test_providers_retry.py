"""Retry rules and the price table, each checked on its own."""

from __future__ import annotations

import socket
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from email.utils import format_datetime
from pathlib import Path

import pytest

from agentrt import Driver, Gate, RunStatus, UnsafeDatabase, open_store
from agentrt.accounting import AttemptOutcome, Price, PriceTable, Usage, list_attempts
from agentrt.providers import AnthropicAgent, ProviderError, RetryPolicy
from agentrt.providers._http import retry_after_seconds

pytestmark = [pytest.mark.timeout(30)]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.anyio
async def test_a_refused_connection_is_transient_retried_and_charged_nothing(
    tmp_path: Path,
) -> None:
    # Nothing listens: the request was never sent, so it is safe to retry and costs nothing.
    agent = AnthropicAgent(
        "claude-fake",
        base_url=f"http://127.0.0.1:{closed_port()}",
        retry=RetryPolicy(max_attempts=3, initial_delay=0.05, max_delay=0.1),
    )
    store = open_store(tmp_path / "agentrt.db")

    with pytest.raises(
        ProviderError, match=r"could not be reached.*\(3 attempts, no more allowed\)"
    ):
        await Driver(Gate(store, []), agent).run("Anything.")

    (run,) = store.list_runs()
    assert run.status is RunStatus.RUNNING
    attempts = list_attempts(store, run.run_id)
    assert [a.outcome for a in attempts] == [AttemptOutcome.TRANSIENT_ERROR] * 3
    assert [a.charged_tokens for a in attempts] == [0, 0, 0]


def test_backoff_doubles_with_jitter_and_never_undercuts_retry_after() -> None:
    policy = RetryPolicy(initial_delay=1.0, max_delay=5.0)
    for _ in range(50):
        assert 0.5 <= policy.delay(1, None) <= 1.0
        assert 1.0 <= policy.delay(2, None) <= 2.0
        assert 2.5 <= policy.delay(5, None) <= 5.0  # capped at max_delay
        assert policy.delay(1, 7.0) == 7.0


def test_retry_after_reads_seconds_and_http_dates() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    later = format_datetime(now + timedelta(seconds=30), usegmt=True)
    assert retry_after_seconds("1") == 1.0
    assert retry_after_seconds(later, now=now.timestamp()) == 30.0
    assert retry_after_seconds(format_datetime(now, usegmt=True), now=now.timestamp() + 9) == 0.0
    for unusable in (None, "", "soon", "-3", "1.5e9"):
        assert retry_after_seconds(unusable) is None


def test_price_table_matches_dated_versions_and_a_provider_wildcard() -> None:
    table = PriceTable(
        {
            "anthropic:claude-sonnet-4": Price(Decimal("3"), Decimal("15")),
            "anthropic:claude-sonnet-4-5": Price(Decimal("4"), Decimal("16")),
            "ollama:*": Price(Decimal(0), Decimal(0)),
        }
    )
    usage = Usage(1_000_000, 1_000_000)
    assert table.cost("anthropic", "claude-sonnet-4-5-20250929", usage) == Decimal("20")
    assert table.cost("anthropic", "claude-sonnet-4-20250514", usage) == Decimal("18")
    assert table.cost("ollama", "qwen3:30b", usage) == Decimal(0)
    # Not a dated version: a different model that shares a prefix is not priced.
    assert table.cost("anthropic", "claude-sonnet-40", usage) is None
    assert PriceTable({}, unknown_is_free=True).cost("x", "y", usage) == Decimal(0)
    # An attempt charged nothing (a 429, a refused connection) costs nothing at any price.
    assert PriceTable({}).cost("x", "y", Usage()) == Decimal(0)


def test_cache_tokens_are_priced_at_their_own_rate_or_the_input_rate() -> None:
    usage = Usage(0, 0, 1_000_000, 1_000_000)
    assert Price(Decimal("3"), Decimal("15")).cost(usage) == Decimal("6")
    priced = Price(Decimal("3"), Decimal("15"), Decimal("3.75"), Decimal("0.30"))
    assert priced.cost(usage) == Decimal("4.05")


@pytest.mark.anyio
async def test_model_tables_from_a_newer_build_are_refused_before_any_dispatch(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path / "agentrt.db")
    with store.transaction() as connection:
        connection.execute("INSERT INTO extensions (name, version) VALUES ('models', 99)")
    agent = AnthropicAgent("claude-fake", base_url=f"http://127.0.0.1:{closed_port()}")

    with pytest.raises(UnsafeDatabase, match="models tables from a newer build"):
        await Driver(Gate(store, []), agent).run("Anything.")
