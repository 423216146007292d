"""`"checkpoint"` in proxy.json: the proxy signs the chain's head on its own, every N events
or every so often, into a log that `agentrt verify --key --checkpoints` then checks."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from proxy_helpers import AGENTRT, build_setup, host, text_of

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from retention_support import make_key  # noqa: E402


def _log_lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


async def test_the_proxy_checkpoints_every_few_events_and_verify_checks_each(
    tmp_path: Path,
) -> None:
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    private = make_key(keys)
    log = tmp_path / "checkpoints.log"
    setup = await build_setup(tmp_path)
    setup.rewrite(checkpoint={"key": str(private), "log": str(log), "every_events": 6})
    async with host(setup) as session:
        for wanted in (1, 2):
            # A proxied call is about six events: two calls make the next checkpoint due.
            for number in range(2):
                answer = await session.call_tool("up_echo", {"text": f"call {number}"})
                assert "call" in text_of(answer)
            deadline = time.monotonic() + 20
            while len(_log_lines(log)) < wanted and time.monotonic() < deadline:
                await anyio.sleep(0.1)
            assert len(_log_lines(log)) == wanted, setup.stderr()
    assert "agentrt proxy: checkpoint 1: event" in setup.stderr()
    verified = subprocess.run(
        [str(AGENTRT), "--db", str(setup.database), "verify", "--key", str(keys / "operator.pub"),
         "--checkpoints", str(log)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "checkpoint" in verified.stdout


async def test_a_proxy_whose_checkpoint_key_others_can_read_does_not_start(
    tmp_path: Path,
) -> None:
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    private = make_key(keys)
    private.chmod(0o644)
    log = tmp_path / "checkpoints.log"
    setup = await build_setup(tmp_path)
    setup.rewrite(checkpoint={"key": str(private), "log": str(log), "every": "1s"})
    started = subprocess.run(
        setup.command(), capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        env=setup.environment(), cwd=str(setup.root),
    )  # fmt: skip
    assert started.returncode != 0
    assert f"private key {private}" in started.stderr, started.stderr
    assert not log.exists()


@pytest.mark.parametrize(
    ("checkpoint", "said"),
    [
        ({"key": "k", "log": "l"}, "checkpoint needs every_events, every, or both"),
        ({"log": "l", "every": "1m"}, "checkpoint.key is required"),
        ({"key": "k", "log": "l", "every_events": 0}, "checkpoint.every_events"),
        ({"key": "k", "log": "l", "every": "1m", "sign": True}, "sign"),
    ],
)
async def test_a_checkpoint_setting_that_makes_no_sense_is_refused_at_load(
    tmp_path: Path, checkpoint: dict[str, object], said: str
) -> None:
    setup = await build_setup(tmp_path)
    setup.rewrite(checkpoint=checkpoint)
    checked = subprocess.run(
        [str(AGENTRT), "check", "--config", str(setup.config_path)],
        capture_output=True, text=True, timeout=60, cwd=str(setup.root),
    )  # fmt: skip
    assert checked.returncode != 0
    assert said in checked.stderr, checked.stderr
