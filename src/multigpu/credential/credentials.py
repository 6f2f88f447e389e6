"""A certificate's two files, ``<id>.pdf`` for people and ``<id>.json`` for machines (an Open
Badges 3.0 credential signed with the course key): made (:func:`make_record`, :func:`issue`),
checked (:func:`verify`: any changed byte, another key's signature, a revocation), revoked
(:func:`revoke`, in the course's status list) and published (:func:`publish_issuer`: the issuer's
files a verifier fetches). See :mod:`multigpu.credential.certificates`."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from multigpu.credential import openbadges, status_list
from multigpu.credential.course_key import load_public_key, public_text

COURSE = "Training Deep Learning Models on Multiple GPUs"
#: Where the course hosts its issuer files when nobody said (``python -m http.server`` in the
#: folder ``multigpu publish-issuer`` wrote): enough to try the course out, not for certificates
#: others check; ``--issuer-url`` or ``$MULTIGPU_ISSUER_URL`` names the real address.
LOCAL_ISSUER_URL = "http://localhost:8000"


class CertificateError(ValueError):
    """A certificate that does not verify; the message says why."""


class Revoked(CertificateError):
    """A certificate whose signature holds but that the course revoked."""

    def __init__(self, record: dict[str, Any], revocation: dict[str, str]):
        self.record, self.revocation = record, revocation
        super().__init__(f"certificate {record['id']} ({record['name']}) was REVOKED on "
                         f"{revocation.get('revoked', '?')}: {revocation.get('reason', 'no reason given')}")


# ----------------------------------------------------------------------------- records


def make_record(name: str, student: str, result: dict[str, Any], labs: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a certificate states, from a grader result (``GradeResult.to_dict()``): the
    measurements, and what it was issued for (the graded source's SHA-256, the grader's version;
    ``None`` in results saved before the grader recorded them)."""
    s, m = result.get("settings", {}), result.get("measurements", {})
    return {
        "course": COURSE,
        "name": name,
        "student": student,
        "issued": _dt.date.today().isoformat(),
        "id": str(uuid.uuid4()),
        "assessment": {
            "passed": bool(result.get("passed")),
            "score": result.get("score"),
            "max_score": result.get("max_score"),
            "accuracy": m.get("accuracy_held"),
            # MLPerf's time to train, by the grader's clock: the end of the first epoch after which
            # the held-out accuracy stayed >= A (seconds from the run's start); nothing the run reported
            "time_to_accuracy_s": m.get("time_to_accuracy_s"),
            "throughput_images_per_s": m.get("throughput"),
            "efficiency": m.get("efficiency"),
            "workers": m.get("workers", s.get("workers")),
            "hardware": m.get("hardware"),
            "hardware_mode": m.get("mode") or s.get("profile"),
            "profile": s.get("profile"),
            "thresholds": {"accuracy": s.get("accuracy"), "time_budget_s": s.get("time_budget_s"),
                           "efficiency": s.get("efficiency"), "epochs_held": s.get("epochs_held")},
        },
        "source_sha256": result.get("source_sha256"),
        "grader_version": result.get("grader_version"),
        "labs": labs,
    }


def _pdf(record: dict[str, Any], path: Path) -> None:
    import matplotlib
    from fpdf import FPDF

    fonts = Path(matplotlib.get_data_path()) / "fonts" / "ttf"  # DejaVu: every name's letters
    a = record["assessment"]
    pdf = FPDF(orientation="landscape", format="A4")
    pdf.set_title(f"Certificate: {record['course']}")
    pdf.set_author(COURSE)
    pdf.set_creation_date(_dt.datetime(2000, 1, 1, tzinfo=_dt.timezone.utc))
    pdf.add_font("DejaVu", "", str(fonts / "DejaVuSans.ttf"))
    pdf.add_font("DejaVu", "B", str(fonts / "DejaVuSans-Bold.ttf"))
    pdf.add_page()
    pdf.set_draw_color(40, 70, 120)
    pdf.set_line_width(1.5)
    pdf.rect(10, 10, 277, 190)
    pdf.set_y(30)
    pdf.set_font("DejaVu", "B", 30)
    pdf.cell(0, 16, "Certificate of Competency", align="C", new_x="LMARGIN", new_y="NEXT")
    pdf.set_font("DejaVu", "", 14)
    pdf.cell(0, 10, "This certifies that", align="C", new_x="LMARGIN", new_y="NEXT")
    pdf.set_font("DejaVu", "B", 26)
    pdf.cell(0, 16, record["name"], align="C", new_x="LMARGIN", new_y="NEXT")
    pdf.set_font("DejaVu", "", 14)
    pdf.cell(0, 10, "passed the final assessment of the course", align="C", new_x="LMARGIN", new_y="NEXT")
    pdf.set_font("DejaVu", "B", 18)
    pdf.cell(0, 12, record["course"], align="C", new_x="LMARGIN", new_y="NEXT")
    pdf.ln(6)
    pdf.set_font("DejaVu", "", 12)
    t = a["thresholds"]
    lines = [
        f"Converted a training script to Horovod and trained it on {a['workers']} workers "
        f"({a['hardware'] or a['hardware_mode']}).",
        f"Held-out accuracy measured by the grader: {_pct(a['accuracy'])} (required {_pct(t['accuracy'])}, "
        f"held for {t['epochs_held']} epochs).",
        f"Time to accuracy (the grader's clock): {_seconds(a.get('time_to_accuracy_s'))}. Aggregate throughput: "
        f"{_num(a['throughput_images_per_s'])} images/s, {_num(a['efficiency'])} x the ideal "
        f"(required {_num(t['efficiency'])} x).",
        f"Score: {a['score']}/{a['max_score']} (grading profile '{a['profile']}').",
    ]
    if record.get("labs"):
        lab = record["labs"]
        lines.append(f"Labs: {lab['score']:g}/{lab['max_score']:g} points.")
    for line in lines:
        pdf.cell(0, 8, line, align="C", new_x="LMARGIN", new_y="NEXT")
    pdf.set_y(170)
    pdf.set_font("DejaVu", "", 10)
    pdf.cell(0, 6, f"Issued {record['issued']} · certificate {record['id']}", align="C", new_x="LMARGIN", new_y="NEXT")
    pdf.cell(0, 6, f"Verify {record['id']}.json (an Open Badges 3.0 credential signed with the course's Ed25519 key) "
             "on the course's verify.html or with multigpu verify", align="C")
    pdf.output(str(path))


def _seconds(x: Any) -> str:
    return f"{x:.0f} s" if isinstance(x, (int, float)) else "not recorded"


def _pct(x: Any) -> str:
    return f"{x:.1%}" if isinstance(x, (int, float)) else "n/a"


def _num(x: Any) -> str:
    return f"{x:.2f}" if isinstance(x, (int, float)) else "n/a"


def _status_token(registry: status_list.Registry, key: Ed25519PrivateKey) -> str:
    """The registry's status list as a signed credential."""
    issuer = openbadges.issuer_ref(registry.issuer_url, COURSE)
    payload = status_list.list_credential(issuer, registry.list_url, registry.revocations(),
                                          size=registry.state["size"])
    valid_from = _dt.datetime.fromisoformat(payload["validFrom"])
    payload.update(iss=issuer["id"], jti=registry.list_url, nbf=int(valid_from.timestamp()))
    return openbadges.sign(payload, key, issuer_url=registry.issuer_url)


def _write_status(registry: status_list.Registry, key: Ed25519PrivateKey) -> Path:
    path = registry.folder / status_list.LIST_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(_status_token(registry, key) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def resolve_issuer_url(folder: str | os.PathLike, given: str | None = None) -> str:
    """The address the credentials of ``folder`` point to: the one its registry recorded, else
    ``given``, else ``$MULTIGPU_ISSUER_URL``, else :data:`LOCAL_ISSUER_URL`."""
    try:
        return status_list.Registry.open(folder, given).issuer_url
    except status_list.StatusError as e:
        if (Path(folder) / status_list.STATE_FILE).exists():
            raise CertificateError(str(e)) from None
    return (given or os.environ.get("MULTIGPU_ISSUER_URL") or LOCAL_ISSUER_URL).rstrip("/")


def issue(record: dict[str, Any], key: Ed25519PrivateKey, outdir: str | os.PathLike, *,
          issuer_url: str | None = None, issuer_dir: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """Write ``outdir/<id>.pdf`` and the signed credential ``outdir/<id>.json``; returns
    ``(pdf, json)``. The credential gets the next index of the status list kept in ``issuer_dir``
    (default ``outdir``): every certificate of one issuer address must come from one such folder,
    or two lists would claim the same address."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    issuer_dir = Path(issuer_dir) if issuer_dir else outdir
    registry = status_list.Registry.open(issuer_dir, resolve_issuer_url(issuer_dir, issuer_url))
    pdf = outdir / f"{record['id']}.pdf"
    _pdf(record, pdf)
    signed = dict(record, pdf={"file": pdf.name, "sha256": hashlib.sha256(pdf.read_bytes()).hexdigest()})
    try:
        index = registry.allocate(record["id"])
    except status_list.StatusError as e:
        raise CertificateError(str(e)) from None
    payload = openbadges.credential(signed, issuer_url=registry.issuer_url, course=COURSE,
                                    status=status_list.entry(registry.list_url, index))
    token = openbadges.sign(payload, key, issuer_url=registry.issuer_url)
    path = outdir / f"{record['id']}.json"
    path.write_text(json.dumps(openbadges.envelope(token), indent=2) + "\n", encoding="utf-8")
    _write_status(registry, key)
    return pdf, path


@dataclass
class Verified:
    record: dict[str, Any]
    pdf_checked: bool
    path: Path
    status: str  # what the status list said, or why it was not checked
    credential: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        a = self.record["assessment"]
        pdf = "the PDF matches" if self.pdf_checked else "PDF not found next to the record: not checked"
        return (f"VALID certificate {self.record['id']}: {self.record['name']}, '{self.record['course']}', issued "
                f"{self.record['issued']}; accuracy {_pct(a['accuracy'])}, time to accuracy "
                f"{_seconds(a.get('time_to_accuracy_s'))} (the grader's clock), throughput "
                f"{_num(a['throughput_images_per_s'])} images/s ({_num(a['efficiency'])} x ideal, "
                f"{a['hardware_mode']} mode); {pdf}; {self.status}")


def _read_credential(path: Path, trusted: Ed25519PublicKey) -> tuple[dict[str, Any], dict[str, Any]]:
    """The verified credential in ``path`` and the record it states."""
    try:
        token = openbadges.token_of(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, AttributeError) as e:
        raise CertificateError(f"{path} is not a certificate of this course ({e})") from None
    try:
        _, payload = openbadges.verify_token(token, trusted)
    except openbadges.CredentialError as e:
        raise CertificateError(f"{path}: {e}") from None
    record = payload.get(openbadges.RECORD_TERM)
    if "OpenBadgeCredential" not in (payload.get("type") or []) or not isinstance(record, dict):
        raise CertificateError(f"{path} is signed by the course but is not one of its certificates")
    return payload, record


def _status(credential: dict[str, Any], record: dict[str, Any], list_file: Path | None,
            trusted: Ed25519PublicKey) -> str:
    """Check the credential against the course's status list; raise :class:`Revoked` if its bit is set."""
    entry = credential.get("credentialStatus") or {}
    if entry.get("type") != "BitstringStatusListEntry" or entry.get("statusPurpose") != status_list.PURPOSE:
        raise CertificateError("the credential names no revocation status list")
    if list_file is None or not list_file.exists():
        return (f"revocation NOT checked: no status list given (--status-list {status_list.LIST_FILE}, "
                f"published at {entry.get('statusListCredential')})")
    try:
        _, listed = openbadges.verify_token(list_file.read_text(encoding="utf-8"), trusted)
    except (OSError, openbadges.CredentialError) as e:
        raise CertificateError(f"the status list {list_file} does not verify ({e})") from None
    if listed.get("id") != entry.get("statusListCredential"):
        raise CertificateError(f"{list_file} is the status list {listed.get('id')}, not the credential's "
                               f"{entry.get('statusListCredential')}")
    subject = listed.get("credentialSubject") or {}
    try:
        index = int(entry["statusListIndex"])
        revoked = status_list.is_set(status_list.decode(subject.get("encodedList")), index)
    except (KeyError, ValueError) as e:
        raise CertificateError(f"the status list cannot be read ({e})") from None
    if revoked:
        why: dict[str, str] = next((r for r in subject.get("revocations") or [] if r.get("statusListIndex") == str(index)), {})
        raise Revoked(record, why)
    return f"not revoked (status list of {listed.get('validFrom')})"


def verify(path: str | os.PathLike, public_key: str | os.PathLike, *,
           status_list_file: str | os.PathLike | None = None) -> Verified:
    """Check a certificate (its ``.json``, or the ``.pdf`` next to it) against the course's public
    key, and against the status list (``status_list_file``, else ``status-list.jwt`` next to the
    certificate). Raises :class:`CertificateError` saying what is wrong, :class:`Revoked` for a
    revoked one."""
    path = Path(path)
    if path.suffix.lower() == ".pdf":
        path = path.with_suffix(".json")
    trusted = load_public_key(public_key)
    credential, record = _read_credential(path, trusted)
    pdf_checked = False
    pdf_info = record.get("pdf") or {}
    pdf = path.with_name(pdf_info.get("file", path.stem + ".pdf"))
    if pdf.exists():
        if hashlib.sha256(pdf.read_bytes()).hexdigest() != pdf_info.get("sha256"):
            raise CertificateError(f"{pdf} was changed: the PDF is not the one that was issued with this record")
        pdf_checked = True
    list_file = Path(status_list_file) if status_list_file else path.with_name(status_list.LIST_FILE)
    status = _status(credential, record, list_file, trusted)
    return Verified(record, pdf_checked, path, status, credential)


def revoke(folder: str | os.PathLike, certificate_id: str, reason: str, key: Ed25519PrivateKey) -> Path:
    """Revoke a certificate issued from ``folder``: its bit set, the reason recorded, the status
    list signed again. Returns the status list file (publish it: ``multigpu publish-issuer``)."""
    try:
        registry = status_list.Registry.open(folder)
        registry.revoke(certificate_id, reason)
    except status_list.StatusError as e:
        raise CertificateError(str(e)) from None
    return _write_status(registry, key)


def publish_issuer(outdir: str | os.PathLike, folder: str | os.PathLike, key: Ed25519PrivateKey,
                   issuer_url: str | None = None) -> list[Path]:
    """Write the files the course hosts (issuer profile, keys, status list, verification page)
    for the certificates issued from ``folder`` (before the first one, for ``issuer_url``)."""
    try:
        registry = status_list.Registry.open(folder, None if (Path(folder) / status_list.STATE_FILE).exists()
                                             else issuer_url)
    except status_list.StatusError as e:
        raise CertificateError(f"{e}: issue certificates first (multigpu certify)") from None
    return openbadges.publish(Path(outdir), issuer_url=registry.issuer_url, course=COURSE, key=key,
                              status_token=_status_token(registry, key), public_text=public_text(key.public_key()))


# ----------------------------------------------------------------------------- certify a workshop
