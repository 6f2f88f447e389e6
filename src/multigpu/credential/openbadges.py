"""Open Badges 3.0: each certificate as a W3C Verifiable Credential that employers' tools read.

The proof is a JWT (Open Badges 3.0, section 8.2, "JSON Web Token Proof Format"): the credential's
JSON is the JWT's payload, signed with the course's Ed25519 key as a compact JWS (``alg``
``EdDSA``, RFC 8037) by joserfc. A JWT signs the payload's exact bytes, so nothing has to be
canonicalised: a verifier needs base64url, JSON and Ed25519 and nothing else, which is what lets
one static page verify it with the browser's own WebCrypto, and lets an independent library
(PyJWT, in the tests) verify it too. The alternative proof of the spec, a Data Integrity proof
(``eddsa-rdfc-2022``), signs the RDF canonical form of the JSON-LD: it needs a JSON-LD processor
with the contexts shipped and a local document loader in every verifier, the page included, and
two canonicalisers must agree to the byte.

The certificate file ``<id>.json`` holds the JWT in the JSON form the W3C data model gives a
credential secured this way (``EnvelopedVerifiableCredential``, ``id`` = ``data:application/vc+jwt,<JWT>``).

What the course hosts (:func:`publish`, ``multigpu publish-issuer DIR``), all at ``issuer_url``:

- ``issuer.json``: the issuer's Open Badges ``Profile`` with its key (``verificationMethod``);
- ``jwks.json``: the same key as a JWK Set, what JWT libraries read;
- ``course-key.pub``: the key in the form ``multigpu verify --public-key`` reads;
- ``status-list.jwt``: the revocation list (:mod:`multigpu.credential.status_list`), signed;
- ``verify.html``: the verification page with the key and the status list inside it.

The key in a credential's header (``jwk``) is a hint for tools; every verifier here checks against
the course's published key, never against a key the credential brings.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import shutil
import warnings
from importlib import resources
from pathlib import Path
from typing import Any, cast

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from joserfc import jws
from joserfc.errors import BadSignatureError, JoseError, SecurityWarning
from joserfc.jwk import OKPKey

from multigpu.credential import status_list

VC_CONTEXT = "https://www.w3.org/ns/credentials/v2"
OB_CONTEXT = "https://purl.imsglobal.org/spec/ob/v3p0/context-3.0.3.json"
OB_SCHEMA = "https://purl.imsglobal.org/spec/ob/v3p0/schema/json/ob_v3p0_achievementcredential_schema.json"
ALG = "EdDSA"
ENVELOPE_PREFIX = "data:application/vc+jwt,"
#: The course's own facts inside the credential (the record a certificate states), a term of the
#: issuer's own (the W3C v2 context maps undefined terms to its issuer-dependent vocabulary).
RECORD_TERM = "multigpuRecord"
PAGE = "verify.html"
#: Where the page's template holds the issuer's data; publish() fills it in.
PAGE_SLOT = "/*ISSUER*/null"

__all__ = ["ALG", "CredentialError", "credential", "envelope", "issuer_profile", "jwk", "publish", "sign",
           "token_of", "verify_token"]


class CredentialError(ValueError):
    """A credential that does not verify; the message says why."""


def jwk(public: Ed25519PublicKey) -> dict[str, Any]:
    """The public key as a JWK (``OKP``, ``Ed25519``), its ``kid`` the RFC 7638 thumbprint."""
    key = OKPKey.import_key(public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return {**key.as_dict(private=False), "kid": key.thumbprint(), "alg": ALG, "use": "sig"}


def issuer_id(issuer_url: str) -> str:
    return f"{issuer_url.rstrip('/')}/issuer.json"


def issuer_ref(issuer_url: str, name: str) -> dict[str, Any]:
    """The issuer as a credential names it."""
    return {"id": issuer_id(issuer_url), "type": ["Profile"], "name": name, "url": issuer_url.rstrip("/")}


def issuer_profile(issuer_url: str, name: str, public: Ed25519PublicKey) -> dict[str, Any]:
    """``issuer.json``: the Open Badges ``Profile`` of the course, with its verification key."""
    key = jwk(public)
    ident = issuer_id(issuer_url)
    return {
        "@context": [VC_CONTEXT, OB_CONTEXT],
        **issuer_ref(issuer_url, name),
        "description": f"Issues the certificates of the course '{name}': a pass of its final assessment, "
                       "graded by the course's own sandboxed grader.",
        "verificationMethod": [{"id": f"{ident}#{key['kid']}", "type": "JsonWebKey", "controller": ident,
                                "publicKeyJwk": key}],
        "assertionMethod": [f"{ident}#{key['kid']}"],
    }


def _pct(x: Any) -> str | None:
    return f"{100 * x:.1f}%" if isinstance(x, (int, float)) else None


def _results(issuer_url: str, record: dict[str, Any]) -> tuple[list[dict], list[dict]]:
    """Open Badges ``ResultDescription`` s of the achievement and the ``Result`` s of this learner."""
    a = record["assessment"]
    t = a.get("thresholds") or {}
    base = f"{issuer_url.rstrip('/')}/achievements/final-assessment#"
    rows = [  # (name, resultType, required, achieved)
        ("accuracy", "Held-out accuracy measured by the grader", "Percent", _pct(t.get("accuracy")), _pct(a.get("accuracy"))),
        ("efficiency", "Throughput as a multiple of the ideal of its workers", "Result",
         t.get("efficiency"), a.get("efficiency")),
        ("time_to_accuracy", "Time to accuracy: seconds, by the grader's clock, to the end of the first epoch after "
         "which the held-out accuracy stayed at the required value (MLPerf's time to train)", "Result", None,
         a.get("time_to_accuracy_s")),
        ("throughput", "Aggregate throughput, images per second", "Result", None, a.get("throughput_images_per_s")),
        ("score", "Points of the final assessment", "RawScore", a.get("max_score"), a.get("score")),
    ]
    described, achieved = [], []
    for key, name, kind, required, value in rows:
        d = {"id": base + key, "type": ["ResultDescription"], "name": name, "resultType": kind}
        if required is not None:
            d["requiredValue"] = str(required)
        described.append(d)
        if value is not None:
            achieved.append({"type": ["Result"], "resultDescription": base + key, "value": str(value)})
    return described, achieved


def credential(record: dict[str, Any], *, issuer_url: str, course: str, status: dict[str, Any]) -> dict[str, Any]:
    """The unsigned ``OpenBadgeCredential`` of a certificate ``record``, its ``credentialStatus``
    ``status``; the JWT claims (``iss``, ``jti``, ``nbf``) repeat the credential's own fields."""
    described, achieved = _results(issuer_url, record)
    valid_from = _dt.datetime.fromisoformat(record["issued"]).replace(tzinfo=_dt.timezone.utc)
    ident = f"urn:uuid:{record['id']}"
    issuer = issuer_ref(issuer_url, course)
    return {
        "@context": [VC_CONTEXT, OB_CONTEXT],
        "id": ident,
        "type": ["VerifiableCredential", "OpenBadgeCredential"],
        "issuer": issuer,
        "validFrom": valid_from.isoformat().replace("+00:00", "Z"),
        "name": f"{course}: final assessment passed",
        "credentialSubject": {
            "type": ["AchievementSubject"],
            "identifier": [{"type": "IdentityObject", "identityType": "name", "hashed": False,
                            "identityHash": record["name"]}],
            "achievement": {
                "id": f"{issuer_url.rstrip('/')}/achievements/final-assessment",
                "type": ["Achievement"],
                "achievementType": "Certificate",
                "name": f"{course}: final assessment",
                "description": "Converted a single-device training script to Horovod data parallelism on "
                               "several workers and passed the course's accuracy and throughput thresholds.",
                "criteria": {"narrative": "The grader re-ran the submitted script in a sandbox on the grading "
                                          "machine and measured, itself, held-out accuracy over the last epochs and "
                                          "throughput against a baseline it ran beside it; every criterion passed."},
                "resultDescription": described,
                "creator": issuer,
            },
            "result": achieved,
        },
        "credentialStatus": status,
        "credentialSchema": [{"id": OB_SCHEMA, "type": "1EdTechJsonSchemaValidator2019"}],
        RECORD_TERM: record,
        "iss": issuer["id"],
        "jti": ident,
        "nbf": int(valid_from.timestamp()),
    }


def _okp(key: Ed25519PrivateKey | Ed25519PublicKey) -> OKPKey:
    if isinstance(key, Ed25519PrivateKey):
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    else:
        pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return OKPKey.import_key(pem)


def sign(payload: dict[str, Any], key: Ed25519PrivateKey, *, issuer_url: str) -> str:
    """The compact JWS of ``payload`` (UTF-8 JSON) signed with ``key``."""
    public = jwk(key.public_key())
    header = {"alg": ALG, "typ": "JWT", "kid": f"{issuer_id(issuer_url)}#{public['kid']}", "jwk": public}
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    with warnings.catch_warnings():
        # RFC 9864 names this signature "Ed25519"; "EdDSA" is the name Open Badges verifiers know
        warnings.simplefilter("ignore", SecurityWarning)
        return jws.serialize_compact(header, body, _okp(key), algorithms=[ALG])


def _b64(part: str, what: str) -> bytes:
    """A base64url part of a JWS, refused unless written the one canonical way (no padding, no
    stray bits), so that a changed character can never decode to the same bytes."""
    try:
        raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except ValueError:
        raw = None
    if raw is None or base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != part:
        raise CredentialError(f"the credential's {what} is not valid base64url: it was changed")
    return raw


def verify_token(token: str, public: Ed25519PublicKey) -> tuple[dict[str, Any], dict[str, Any]]:
    """Check a compact JWS against the course's key; returns ``(header, payload)``."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise CredentialError("not a JWT (three base64url parts separated by dots)")
    raw_header = _b64(parts[0], "header")
    _b64(parts[1], "payload")
    _b64(parts[2], "signature")
    try:
        header = json.loads(raw_header)
    except ValueError:
        raise CredentialError("the credential's header is not JSON: it was changed") from None
    if not isinstance(header, dict) or header.get("alg") != ALG:
        raise CredentialError(f"the credential is not signed with {ALG} (Ed25519): alg {header.get('alg')!r}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SecurityWarning)
            signed = jws.deserialize_compact(token.strip(), _okp(public), algorithms=[ALG])
    except BadSignatureError:
        theirs = (header.get("jwk") or {}).get("x")
        if theirs and theirs != jwk(public)["x"]:
            raise CredentialError("signed with a different key than the course's: it is not issued by this course") from None
        raise CredentialError("the signature does not match: the credential was changed after it was signed") from None
    except JoseError as e:
        raise CredentialError(f"not a valid JWS ({e})") from None
    try:
        payload = json.loads(signed.payload)
    except ValueError:
        raise CredentialError("the credential's payload is not JSON") from None
    if not isinstance(payload, dict):
        raise CredentialError("the credential's payload is not a JSON object")
    return header, payload


def envelope(token: str) -> dict[str, Any]:
    """The JSON of a certificate file: the JWT as an ``EnvelopedVerifiableCredential``."""
    return {"@context": [VC_CONTEXT], "id": ENVELOPE_PREFIX + token, "type": "EnvelopedVerifiableCredential"}


def token_of(text: str) -> str:
    """The JWT in a certificate file's text: an enveloped credential's JSON, or a bare JWT."""
    text = text.strip()
    if not text.startswith("{"):
        return text
    doc = json.loads(text)
    ident = doc.get("id") if isinstance(doc, dict) else None
    if doc.get("type") != "EnvelopedVerifiableCredential" or not str(ident).startswith(ENVELOPE_PREFIX):
        raise CredentialError("not an Open Badges credential of this course (no EnvelopedVerifiableCredential "
                              "holding a JWT)")
    return cast(str, ident)[len(ENVELOPE_PREFIX):]


def page_template() -> str:
    return resources.files("multigpu.credential").joinpath(PAGE).read_text(encoding="utf-8")


def page(profile: dict[str, Any], status_token: str) -> str:
    """The verification page with the issuer's profile (its key) and the status list inside it."""
    data = json.dumps({"issuer": profile, "statusList": status_token}, ensure_ascii=True)
    template = page_template()
    if template.count(PAGE_SLOT) != 1:
        raise RuntimeError(f"{PAGE} has no single slot {PAGE_SLOT} for the issuer's data")
    # "<" escaped: a profile's text can never close the script element it sits in
    return template.replace(PAGE_SLOT, data.replace("<", "\\u003c"))


def publish(outdir: str | Path, *, issuer_url: str, course: str, key: Ed25519PrivateKey,
            status_token: str, public_text: str) -> list[Path]:
    """Write the files the course hosts at ``issuer_url`` into ``outdir``; returns them."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    profile = issuer_profile(issuer_url, course, key.public_key())
    files = {
        "issuer.json": json.dumps(profile, indent=2, ensure_ascii=False) + "\n",
        "jwks.json": json.dumps({"keys": [jwk(key.public_key())]}, indent=2) + "\n",
        "course-key.pub": public_text + "\n",
        status_list.LIST_FILE: status_token + "\n",
        PAGE: page(profile, status_token),
    }
    written = []
    for name, text in files.items():
        tmp = outdir / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        shutil.move(tmp, outdir / name)
        written.append(outdir / name)
    return written
