"""Registering an approver's passkey: `agentrt approvers add NAME --subject SUB`.

A one-use page at http://localhost:PORT (the WebAuthn relying party is `localhost`,
as the inbox's) asks the browser's authenticator for a new credential, user
verification required; the attestation is verified with py_webauthn and the
approver, its subject and public key are added to the registry.  The page needs
the token printed with its address (in the fragment, never sent in a URL), and
answers only Host `localhost:PORT`.
"""

from __future__ import annotations

import datetime
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from ..canonical import JSONBoundaryError, parse_json
from ..inbox._app import CSP
from ..sanitize import sanitize
from ._registry import RP_ID, Approver, Registry, RegistryError, read_registry, write_registry

__all__ = ["Registration", "registration_app"]

_HERE: Final = Path(__file__).parent
_PAGE: Final = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>agentrt: register an approver's passkey</title>
</head><body><h1>Register a passkey for approver <span id="name">{name}</span></h1>
<p>Principal <span id="subject">{subject}</span>. Your authenticator will ask for your PIN or a
biometric: a decision in agentrt's inbox needs it.</p>
<button id="register" type="button">Register a passkey</button>
<p id="said" role="status"></p>
<script src="/register.js"></script></body></html>
"""
_MAX_BODY: Final = 64 * 1024


@dataclass
class Registration:
    """One approver being added: who, where the registry is, and the page's secrets."""

    registry: Path
    name: str
    subject: str
    port: int = 0
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    challenge: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    done: anyio.Event = field(default_factory=anyio.Event)
    added: Approver | None = None

    @property
    def origin(self) -> str:
        return f"http://{RP_ID}:{self.port}"


def _headers(response: Response) -> Response:
    response.headers["content-security-policy"] = CSP
    response.headers["cache-control"] = "no-store"
    response.headers["x-frame-options"] = "DENY"
    return response


def registration_app(registration: Registration) -> Any:
    """The one-use registration page as an ASGI application."""

    def guarded(
        handler: Callable[[Request], Any], *, needs_token: bool
    ) -> Callable[[Request], Any]:
        async def serve(request: Request) -> Response:
            if request.headers.get("host") != f"{RP_ID}:{registration.port}":
                return _headers(
                    JSONResponse({"error": "open this page at its localhost address"}, 403)
                )
            if needs_token and not hmac.compare_digest(
                request.headers.get("authorization", "").encode(),
                f"Bearer {registration.token}".encode(),
            ):
                return _headers(JSONResponse({"error": "the registration token is required"}, 401))
            if registration.added is not None and needs_token:
                return _headers(
                    JSONResponse({"error": "this page has registered its passkey"}, 409)
                )
            return _headers(await handler(request))

        return serve

    async def page(request: Request) -> Response:
        return HTMLResponse(
            _PAGE.format(name=_html(registration.name), subject=_html(registration.subject))
        )

    async def script(request: Request) -> Response:
        return FileResponse(_HERE / "static" / "register.js", media_type="text/javascript")

    async def options(request: Request) -> Response:
        from webauthn import generate_registration_options, options_to_json
        from webauthn.helpers.structs import (
            AuthenticatorSelectionCriteria,
            PublicKeyCredentialDescriptor,
            ResidentKeyRequirement,
            UserVerificationRequirement,
        )

        known = read_registry(registration.registry, missing_ok=True)
        made = generate_registration_options(
            rp_id=RP_ID,
            rp_name="agentrt",
            user_name=registration.name,
            user_id=registration.subject.encode()[:64],
            challenge=registration.challenge,
            authenticator_selection=AuthenticatorSelectionCriteria(
                resident_key=ResidentKeyRequirement.PREFERRED,
                user_verification=UserVerificationRequirement.REQUIRED,
            ),
            exclude_credentials=[
                PublicKeyCredentialDescriptor(id=approver.credential_id)
                for approver in known.approvers
            ],
        )
        return Response(options_to_json(made), media_type="application/json")

    async def register(request: Request) -> Response:
        from webauthn import verify_registration_response
        from webauthn.helpers.exceptions import InvalidRegistrationResponse

        body = await request.body()
        try:
            credential = parse_json(body[: _MAX_BODY + 1]) if len(body) <= _MAX_BODY else None
        except JSONBoundaryError:
            credential = None
        if not isinstance(credential, dict):
            return JSONResponse({"error": "the registration must be a JSON object"}, 400)
        try:
            verified = verify_registration_response(
                credential=credential,
                expected_challenge=registration.challenge,
                expected_rp_id=RP_ID,
                expected_origin=registration.origin,
                require_user_verification=True,
            )
        except (InvalidRegistrationResponse, ValueError, KeyError, TypeError) as exc:
            return JSONResponse(
                {"error": f"the passkey was not registered: {sanitize(str(exc))}"}, 400
            )
        approver = Approver(
            name=registration.name,
            subject=registration.subject,
            credential_id=verified.credential_id,
            public_key=verified.credential_public_key,
            added_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        )
        try:
            add_approver(registration.registry, approver)
        except RegistryError as exc:
            return JSONResponse({"error": sanitize(str(exc))}, 409)
        registration.added = approver
        registration.done.set()
        return JSONResponse(
            {"name": sanitize(approver.name), "subject": sanitize(approver.subject)}
        )

    return Starlette(
        routes=[
            Route("/", guarded(page, needs_token=False)),
            Route("/register.js", guarded(script, needs_token=False)),
            Route("/api/options", guarded(options, needs_token=True)),
            Route("/api/register", guarded(register, needs_token=True), methods=["POST"]),
        ]
    )


def _html(text: str) -> str:
    import html

    return html.escape(sanitize(text))


def add_approver(path: Path, approver: Approver) -> Registry:
    """Add `approver` to the registry in `path` (created owner-only if missing)."""
    registry = read_registry(path, missing_ok=True)
    if registry.by_name(approver.name) is not None:
        raise RegistryError(
            f"approver {sanitize(approver.name)} is already registered; remove it first"
        )
    if registry.by_credential(approver.credential_id) is not None:
        raise RegistryError("this passkey is already registered to another approver")
    updated = replace(registry, approvers=(*registry.approvers, approver))
    write_registry(updated)
    return updated


def remove_approver(path: Path, name: str) -> Registry:
    """Remove approver `name` from the registry in `path`."""
    registry = read_registry(path)
    if registry.by_name(name) is None:
        raise RegistryError(f"no approver {sanitize(name)} is registered in {sanitize(str(path))}")
    updated = replace(registry, approvers=tuple(a for a in registry.approvers if a.name != name))
    write_registry(updated)
    return updated
