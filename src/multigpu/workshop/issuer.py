"""The hub publishes its certificates' issuer files where the certificates say they are.

A certificate names its issuer's address and its status list's (``status-list.jwt``); the hub
issues them for ``<hub>/services/grading/issuer`` (``hubconfig.issuer_url``) and the grading
service serves, there and to anyone (a verifier has no account): ``issuer.json``, ``jwks.json``,
``course-key.pub`` (what ``multigpu verify --public-key`` reads), ``status-list.jwt`` and
``verify.html``. They are written by ``multigpu publish-issuer``'s code into ``state/issuer/``,
again whenever the certificates' status list changed (a certificate issued, ``multigpu revoke``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from multigpu.workshop.layout import Hub

FILES = {"issuer.json": "application/json", "jwks.json": "application/json", "course-key.pub": "text/plain",
         "status-list.jwt": "application/vc+jwt", "verify.html": "text/html"}


def folder(hub: Hub) -> Path:
    return hub.state / "issuer"


def published(hub: Hub, name: str, issuer_url: str | None = None) -> Path:
    """The published file ``name`` (one of :data:`FILES`), written again first when it is missing
    or older than the certificates' own status list."""
    from multigpu.credential import certificates
    from multigpu.credential.status_list import LIST_FILE

    if name not in FILES:
        raise KeyError(name)
    out = folder(hub)
    page = out / "verify.html"
    source = hub.certificates / LIST_FILE
    if not page.exists() or (source.exists() and source.stat().st_mtime >= page.stat().st_mtime):
        key = certificates.load_private_key(os.environ.get("MULTIGPU_CERTIFICATE_KEY") or None)
        certificates.publish_issuer(out, hub.certificates, key,
                                    issuer_url=issuer_url or os.environ.get("MULTIGPU_ISSUER_URL"))
    return out / name


def handlers(hub: Hub, prefix: str) -> list[tuple[str, Any]]:
    """The grading service's route for the issuer files (no login: verifiers have no account)."""
    from tornado import web

    class IssuerFile(web.RequestHandler):
        def get(self, name: str) -> None:
            try:
                path = published(hub, name)
            except (KeyError, FileNotFoundError) as e:
                raise web.HTTPError(404, str(e)) from None
            self.set_header("Content-Type", FILES[name])
            self.set_header("Access-Control-Allow-Origin", "*")  # verifiers fetch it from their own pages
            self.write(path.read_bytes())

    return [(prefix + r"issuer/([A-Za-z0-9._-]+)", IssuerFile)]
