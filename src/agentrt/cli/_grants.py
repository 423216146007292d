"""`grants` and `revoke`: the standing grants people gave, and ending one at once."""

from __future__ import annotations

import time

import click

from .. import grants
from ..sanitize import sanitize
from ..store import GrantStatus, StandingGrant, epoch_to_iso
from ._app import Settings, login_name, open_for_deciding, open_for_reading
from ._decide import grant_json

__all__ = ["grants_command", "revoke"]


def _line(grant: StandingGrant, now: float) -> str:
    status = str(grant.status)
    if grant.status is GrantStatus.ACTIVE and grant.expires_at <= now:
        status = "expired"  # its expiry is recorded when a call or `revoke` finds it
    calls = (
        "any number of calls"
        if grant.calls_left is None
        else f"{grant.calls_left} of {grant.calls_given} call(s) left"
    )
    when = f", only when {sanitize(grant.condition)}" if grant.condition else ""
    return (
        f"{grant.grant_id}  {status:<8} {sanitize(grant.tool)} in session "
        f"{sanitize(grant.session)}: {calls}{when}, until {epoch_to_iso(grant.expires_at)} "
        f"(given by {sanitize(grant.given_by) or '-'} with approval {grant.approval_id})"
    )


@click.command("grants")
@click.option("--all", "include_ended", is_flag=True, help="Also list grants that ended.")
@click.pass_obj
def grants_command(settings: Settings, include_ended: bool) -> None:
    """List the standing grants: what each covers, until when, and how many calls are left."""
    output = settings.output
    with open_for_reading(settings) as store:
        found = grants.list_grants(store, include_ended=include_ended)
    if output.json:
        for grant in found:
            output.record(grant_json(grant))
        return
    if not found:
        output.line("no standing grants" if include_ended else "no active standing grants")
        return
    now = time.time()
    for grant in found:
        output.line(_line(grant, now))


@click.command()
@click.argument("grant_id", metavar="GRANT")
@click.option(
    "--by",
    metavar="NAME",
    default=login_name,
    show_default="your login name",
    help="Who revoked, recorded as a label (it proves nothing).",
)
@click.pass_obj
def revoke(settings: Settings, grant_id: str, by: str) -> None:
    """End the standing grant GRANT at once: the next call it would have covered asks again."""
    output = settings.output
    with open_for_deciding(settings) as store:
        ended = grants.revoke(store, grant_id, by=by)
    if output.json:
        output.record(grant_json(ended))
        return
    output.line(
        f"revoked standing grant {ended.grant_id}; the next call of {sanitize(ended.tool)} "
        "asks a person again"
    )
