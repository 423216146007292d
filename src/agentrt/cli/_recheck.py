"""`agentrt recheck`: which recorded proxy decisions the configuration as it is now would change.

It loads the configuration (through `read_owned`, as the proxy does),
opens its database read-only and replays each recent call's recorded
request through the proxy's policy; nothing is executed or written.
"""

from __future__ import annotations

import anyio
import click

from ..errors import AgentrtError
from ..policy import Outcome
from ..proxy._calls import proxy_policy
from ..proxy.config import ConfigError, load_config
from ..recheck import Difference, Recheck
from ..recheck import recheck as recheck_store
from ..sanitize import sanitize
from ..store import open_store
from ..tools import ToolSpec
from ._app import EXIT_UNUSABLE, CommandError, Settings
from ._output import Output

__all__ = ["recheck"]

_WORDS = {
    Outcome.ALLOW: "ran",
    Outcome.REQUIRE_APPROVAL: "waited for a person",
    Outcome.DENY: "was denied",
    Outcome.ABORT: "ended its run",
}
_WOULD = {
    Outcome.ALLOW: "would run",
    Outcome.REQUIRE_APPROVAL: "would wait for a person",
    Outcome.DENY: "would be denied",
    Outcome.ABORT: "would end its run",
}


@click.command(short_help="Show which recorded decisions the configuration would now change.")
@click.option("--config", "config_path", required=True, metavar="FILE", help="The proxy's file.")
@click.option(
    "--limit",
    type=click.IntRange(1, 10_000),
    default=50,
    show_default=True,
    help="How many recent calls to replay.",
)
@click.option("--session", metavar="S", help="Whose calls (default: the configuration's session).")
@click.option("--json", "json_lines", is_flag=True, help="Print JSON Lines instead of text.")
@click.pass_obj
def recheck(
    settings: Settings, config_path: str, limit: int, session: str | None, json_lines: bool
) -> None:
    """Replay recent proxied calls through the configuration as it is now; print what changes.

    Reads only: the database named in the configuration is opened read-only.
    """
    output = Output(json=True) if json_lines else settings.output
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise CommandError(sanitize(str(exc)), EXIT_UNUSABLE) from None
    specs = [
        ToolSpec(
            rule.rename if rule.rename is not None else f"{upstream.server.name}_{tool}",
            "",
            {"type": "object"},
            rule.side_effect,
            1.0,
        )
        for upstream in config.servers
        for tool, rule in upstream.rules.items()
    ]
    wanted = session if session is not None else config.session
    try:
        store = open_store(config.database, read_only=True, create=False)
    except AgentrtError as exc:
        raise CommandError(sanitize(str(exc)), EXIT_UNUSABLE) from None
    try:
        # The taint each decision was judged under is the recorded one (docs/flows.md).
        policy = proxy_policy(config, store, replaying=True)

        async def replay() -> Recheck:
            return await recheck_store(store, policy, specs, limit=limit, session=wanted)

        result = anyio.run(replay)
    finally:
        store.close()
    if output.json:
        for difference in result.differences:
            output.record({"record": "difference", **_difference_json(difference)})
        output.record(
            {
                "record": "recheck",
                "checked": result.checked,
                "skipped": result.skipped,
                "differ": len(result.differences),
                "policy_id": policy.id,
            }
        )
        return
    for difference in result.differences:
        output.line(
            f"run {sanitize(difference.run_id)} step {difference.step} "
            f"{sanitize(difference.tool)}: {_WORDS[difference.was]}, {_WOULD[difference.would]}"
            f" ({sanitize(difference.would_reason)})"
        )
    output.line(
        f"{len(result.differences)} of {result.checked} recorded decisions would differ"
        + (f"; {result.skipped} skipped (tool no longer offered)" if result.skipped else "")
    )


def _difference_json(difference: Difference) -> dict[str, object]:
    return {
        "run_id": difference.run_id,
        "step": difference.step,
        "tool": difference.tool,
        "args": difference.args,
        "was": str(difference.was),
        "would": str(difference.would),
        "was_reason": difference.was_reason,
        "would_reason": difference.would_reason,
        "was_policy_id": difference.was_policy_id,
        "would_policy_id": difference.would_policy_id,
    }
