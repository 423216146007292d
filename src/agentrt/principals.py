"""Principals: who a run is for, as an OAuth access token proved it (issue 35).

`Principal` is recorded in a run's `run_started` event when the run has one, and read
back with `Store.principal_of_run(run_id)` (or, inside a write,
`Store.read_principal_of_run(connection, run_id)`).  The proxy over streamable HTTP
derives it from a validated bearer token (`proxy/_resource.py`); a run of the library,
of a stdio proxy, or of a proxy behind the shared `--token` has none.
"""

from __future__ import annotations

from .store import Principal, principal_from_payload

__all__ = ["Principal", "principal_from_payload"]
