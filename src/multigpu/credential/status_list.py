"""Revocation of certificates: a W3C Bitstring Status List the credentials point to.

Every issued credential gets an index in one list (``credentialStatus`` of type
``BitstringStatusListEntry``, purpose ``revocation``); revoking it sets that bit. The list is
published as a credential of its own (``BitstringStatusListCredential``), signed with the course
key like the certificates, whose ``encodedList`` is the bitstring GZIP-compressed and written as
multibase base64url (a ``u`` and no padding), bit 0 the most significant bit of the first byte,
at least 16 KiB (131,072 entries) so that one set bit does not single out its holder.

The W3C list carries bits only. The reason a person gives with ``multigpu revoke ID --reason``
is published beside the bits in the same signed list (``revocations``: index, date and reason), so
that a verifier can say why; write reasons fit to be read by anyone.

The registry (:class:`Registry`, ``issuer-state.json`` in the certificates folder) is the
issuer's own book: the next free index, which certificate has which, the revocations. It is the
source of every status list the course publishes.
"""

from __future__ import annotations

import base64
import datetime as _dt
import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Entries in a list: the minimum the W3C recommendation sets (16 KiB), enough for any workshop.
SIZE = 131_072
STATE_FILE = "issuer-state.json"
#: The file name of the published status list credential (compact JWS, ``application/vc+jwt``).
LIST_FILE = "status-list.jwt"
PURPOSE = "revocation"

__all__ = ["LIST_FILE", "PURPOSE", "SIZE", "Registry", "StatusError", "decode", "encode", "entry", "is_set",
           "list_credential"]


class StatusError(ValueError):
    """A status list that cannot be read, or a revocation that cannot be made; the message says why."""


def encode(revoked: set[int] | list[int], size: int = SIZE) -> str:
    """The ``encodedList`` of a bitstring of ``size`` bits with the ``revoked`` indices set."""
    bits = bytearray(size // 8)
    for i in revoked:
        if not 0 <= i < size:
            raise StatusError(f"status index {i} is outside the list (0..{size - 1})")
        bits[i // 8] |= 0x80 >> (i % 8)
    packed = gzip.compress(bytes(bits), mtime=0)
    return "u" + base64.urlsafe_b64encode(packed).rstrip(b"=").decode()


def decode(encoded: object) -> bytes:
    """The bitstring of an ``encodedList``."""
    if not isinstance(encoded, str) or not encoded.startswith("u"):
        raise StatusError("encodedList must be multibase base64url (it starts with 'u')")
    body = encoded[1:]
    try:
        return gzip.decompress(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (ValueError, OSError, EOFError) as e:
        raise StatusError(f"encodedList is not a GZIP-compressed bitstring ({e})") from None


def is_set(bitstring: bytes, index: int) -> bool:
    if not 0 <= index < len(bitstring) * 8:
        raise StatusError(f"status index {index} is outside the list of {len(bitstring) * 8} entries")
    return bool(bitstring[index // 8] & (0x80 >> (index % 8)))


def entry(list_url: str, index: int) -> dict[str, Any]:
    """The ``credentialStatus`` of the credential at ``index`` of the list at ``list_url``."""
    return {"id": f"{list_url}#{index}", "type": "BitstringStatusListEntry", "statusPurpose": PURPOSE,
            "statusListIndex": str(index), "statusListCredential": list_url}


def list_credential(issuer: dict[str, Any], list_url: str, revoked: dict[int, dict[str, str]],
                    *, size: int = SIZE, now: _dt.datetime | None = None) -> dict[str, Any]:
    """The unsigned ``BitstringStatusListCredential`` with ``revoked`` (index -> date, reason) set."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return {
        "@context": ["https://www.w3.org/ns/credentials/v2"],
        "id": list_url,
        "type": ["VerifiableCredential", "BitstringStatusListCredential"],
        "issuer": issuer,
        # milliseconds: of two lists signed in the same second, a verifier can still tell the newer
        "validFrom": now.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "credentialSubject": {
            "id": f"{list_url}#list",
            "type": "BitstringStatusList",
            "statusPurpose": PURPOSE,
            "encodedList": encode(set(revoked), size),
            "revocations": [{"statusListIndex": str(i), **revoked[i]} for i in sorted(revoked)],
        },
    }


@dataclass
class Registry:
    """The issuer's book of indices and revocations, kept in ``folder/issuer-state.json``."""

    folder: Path
    state: dict[str, Any]

    @classmethod
    def open(cls, folder: str | os.PathLike, issuer_url: str | None = None) -> Registry:
        """The registry of ``folder``; ``issuer_url`` (where the course hosts its issuer files) is
        recorded on first use and must match afterwards: credentials already issued point there."""
        folder = Path(folder)
        path = folder / STATE_FILE
        if path.exists():
            try:
                state = json.loads(path.read_text(encoding="utf-8"))
            except ValueError as e:
                raise StatusError(f"{path} is not readable JSON ({e}): restore it from a backup") from None
            if issuer_url and issuer_url.rstrip("/") != state["issuer_url"]:
                raise StatusError(f"{folder} issues for {state['issuer_url']}, not {issuer_url}: its credentials "
                                  "point to that address; use another certificates folder for another address")
            return cls(folder, state)
        if not issuer_url:
            raise StatusError(f"no {STATE_FILE} in {folder}: nothing was issued from this folder")
        return cls(folder, {"issuer_url": issuer_url.rstrip("/"), "size": SIZE, "next_index": 0,
                            "issued": {}, "revoked": {}})

    @property
    def path(self) -> Path:
        return self.folder / STATE_FILE

    @property
    def issuer_url(self) -> str:
        return self.state["issuer_url"]

    @property
    def list_url(self) -> str:
        return f"{self.issuer_url}/{LIST_FILE}"

    def allocate(self, certificate_id: str) -> int:
        """The next free index, given to ``certificate_id`` and saved before it is used."""
        if certificate_id in self.state["issued"]:
            raise StatusError(f"certificate {certificate_id} already has status index {self.state['issued'][certificate_id]}")
        index = self.state["next_index"]
        if index >= self.state["size"]:
            raise StatusError(f"the status list is full ({self.state['size']} certificates): start a new folder")
        self.state["issued"][certificate_id] = index
        self.state["next_index"] = index + 1
        self.save()
        return index

    def revoke(self, certificate_id: str, reason: str, *, today: _dt.date | None = None) -> int:
        """Set the bit of ``certificate_id``; returns its index."""
        if not reason.strip():
            raise StatusError("say why the certificate is revoked (--reason): verifiers show it")
        if certificate_id not in self.state["issued"]:
            raise StatusError(f"no certificate {certificate_id} was issued from {self.folder}")
        if certificate_id in self.state["revoked"]:
            raise StatusError(f"certificate {certificate_id} is already revoked "
                              f"({self.state['revoked'][certificate_id]['reason']})")
        index = self.state["issued"][certificate_id]
        self.state["revoked"][certificate_id] = {"index": index, "reason": reason.strip(),
                                                 "date": (today or _dt.date.today()).isoformat()}
        self.save()
        return index

    def revocations(self) -> dict[int, dict[str, str]]:
        return {r["index"]: {"revoked": r["date"], "reason": r["reason"]} for r in self.state["revoked"].values()}

    def save(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        tmp.replace(self.path)
