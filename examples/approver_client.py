"""A small client of the signed approver channel: poll one run, show the text, decide.

    python examples/approver_client.py http://127.0.0.1:8470 RUN_ID --secret-file FILE

It polls `GET /runs/RUN_ID/approvals` every few seconds; for each approval that waits it
prints the approval's plain text (`Accept: text/plain`: sanitized, what a chat message
would carry), asks approve / reject / skip at the terminal (or decides as `--decide`
says), and posts the decision with the hash it was shown, so a request that changed in
between is refused (409) rather than approved.  Every request is signed with the shared
secret (`agentrt.approver.signed_request`); see docs/approvals.md.
"""

from __future__ import annotations

import argparse
import sys
import time

import httpx2 as httpx

from agentrt.approver import read_secret, signed_request


def _decide(
    base: str, run_id: str, secret: bytes, client: httpx.Client, args: argparse.Namespace
) -> bool:
    """One poll: show and decide what waits; True once something was decided."""
    listed = client.send(signed_request("GET", f"{base}/runs/{run_id}/approvals", secret=secret))
    if listed.status_code != 200:
        print(
            f"listing refused: {listed.status_code} {listed.json().get('error')}", file=sys.stderr
        )
        return False
    decided = False
    for approval in listed.json()["approvals"]:
        path = approval["path"]
        text = client.send(
            signed_request("GET", base + path, secret=secret, headers={"Accept": "text/plain"})
        )
        print(text.text)
        verdict = args.decide
        if verdict is None:
            answer = input("approve, reject or skip? [a/r/s] ").strip().lower()
            verdict = {"a": "approve", "r": "reject"}.get(answer[:1])
        if verdict is None:
            continue
        body = {
            "run_id": run_id,
            "approval_id": approval["approval_id"],
            "hash": approval["hash"],
            "by": args.by,
            "note": args.note,
        }
        answer = client.send(
            signed_request("POST", f"{base}{path}/{verdict}", secret=secret, json=body)
        )
        print(f"{verdict}: {answer.status_code} {answer.json()}")
        decided = decided or answer.status_code in (200, 202)
    return decided


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the channel's address, e.g. http://127.0.0.1:8470")
    parser.add_argument("run_id")
    parser.add_argument("--secret-file", required=True)
    parser.add_argument("--decide", choices=["approve", "reject"], help="decide without asking")
    parser.add_argument("--by", default="approver-client")
    parser.add_argument("--note", default="")
    parser.add_argument("--interval", type=float, default=3.0)
    parser.add_argument("--once", action="store_true", help="stop after the first decision")
    args = parser.parse_args()
    secret = read_secret(args.secret_file)
    base = args.base.rstrip("/")
    with httpx.Client(timeout=10.0) as client:
        while True:
            if _decide(base, args.run_id, secret, client, args) and args.once:
                return 0
            time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
