"""Replaying a recorded run's model answers, byte for byte, so the run can be tested without
a model.

An adapter made with `record_replies=True` keeps each answer's body with its
attempt (`model_attempts.reply`; the chain holds its SHA-256).  `replay_client`
returns an `http_client_factory` for the same adapter class that answers each
request with the next recorded body, in the order they came: the adapter
parses the same bytes, so it decides the same steps, with the same usage and
stop reasons.  Nothing leaves the machine.  A recording whose body no longer
matches the hash in the chain is refused before anything is replayed; a run
that asks for more answers than were recorded gets a 410 naming the attempt
(a permanent error: the replayed run has gone somewhere the recording did not).
"""

from __future__ import annotations

import hashlib
import threading
from collections import deque

import httpx2

from ..accounting import recorded_replies
from ..canonical import canonical_bytes
from ..sanitize import sanitize
from ..store import Store
from ._http import HTTPClientFactory, ProviderError

__all__ = ["replay_client"]


def replay_client(store: Store, run_id: str) -> HTTPClientFactory:
    """An `http_client_factory` answering with run `run_id`'s recorded answers, in order."""
    replies = recorded_replies(store, run_id)
    if not replies:
        raise ProviderError(
            f"run {sanitize(run_id)} has no recorded model answers to replay "
            "(an adapter records them with record_replies=True)"
        )
    for reply in replies:
        if reply.sha256 is None or hashlib.sha256(reply.body).hexdigest() != reply.sha256:
            raise ProviderError(
                f"the recorded answer of run {sanitize(run_id)} step {reply.step} attempt "
                f"{reply.attempt} does not match the hash its event holds; the recording "
                "was altered and is not replayed"
            )
    queue = deque(replies)
    lock = threading.Lock()
    served = 0

    def answer(request: httpx2.Request) -> httpx2.Response:
        nonlocal served
        with lock:
            served += 1
            if not queue:
                body = canonical_bytes(
                    {
                        "error": {
                            "type": "replay_exhausted",
                            "message": f"the recording of run {run_id} has no answer left for "
                            f"request {served}",
                        }
                    }
                )
                return httpx2.Response(410, content=body, headers=_JSON)
            reply = queue.popleft()
        return httpx2.Response(200, content=reply.body, headers=_JSON)

    def factory() -> httpx2.AsyncClient:
        return httpx2.AsyncClient(transport=httpx2.MockTransport(answer), follow_redirects=False)

    return factory


_JSON = {"content-type": "application/json"}
