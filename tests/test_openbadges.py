"""Open Badges 3.0 credentials, their revocation and the verification page, checked by three verifiers.

1. ``multigpu verify`` (joserfc, the library that signs);
2. independent Python verifiers: openbadgeslib's Open Badges 3.0 verifier (signature, structure,
   validity window, and the status list it "downloads" from the published folder, its own
   signature checked too), and one written here on PyJWT with the key read from the published
   ``jwks.json`` and the status list decoded by hand (base64url, gzip, bit order, the reason);
3. the published ``verify.html`` in Debian's Chromium (Playwright), with the browser's own Ed25519.

A valid certificate passes all three, any changed character fails all three, a revoked one is
reported revoked, with its reason, by all three.
"""

from __future__ import annotations

import base64
import gzip
import json
import string
from dataclasses import dataclass
from pathlib import Path

import jwt
import pytest

from conftest import REPO
from multigpu.cli import main
from multigpu.credential import certificates as cert
from multigpu.credential import openbadges, status_list
from test_browser import headless_chromium
from test_certificates import RESULT

ISSUER_URL = "https://multigpu-course.example.org/issuer"
SHOTS = REPO / "screenshots" / "verify-page"  # gitignored: for a person to look at
AUDITED = dict(RESULT, source_sha256="5" * 64, grader_version="multigpu 0.1.0 grader 7")
B64URL = string.ascii_letters + string.digits + "-_"


@dataclass
class Issued:
    public: Path  # course-key.pub
    private: Path
    valid: Path  # <id>.json of a certificate in good standing
    revoked: Path  # <id>.json of a revoked one
    reason: str
    certs: Path  # the certificates folder
    published: Path  # what publish-issuer wrote
    stale: Path  # what publish-issuer wrote before the revocation


@pytest.fixture(scope="module")
def issued(tmp_path_factory) -> Issued:
    root = tmp_path_factory.mktemp("ob3")
    private, public = cert.keygen(root / "keys" / "course-key")
    key = cert.load_private_key(private)
    certs = root / "certificates"
    # a name is text, never markup, wherever it is shown
    _, valid = cert.issue(cert.make_record("Zoë <img src=x onerror=alert(1)>", "zoe", AUDITED), key, certs,
                          issuer_url=ISSUER_URL)
    doomed = cert.make_record("Mallory Test", "mallory", AUDITED)
    _, revoked = cert.issue(doomed, key, certs)
    reason = "issued in error: the grader's efficiency check was broken on 2026-11-20"
    assert main(["publish-issuer", str(root / "stale"), "--certificates", str(certs), "--key", str(private)]) == 0
    assert main(["revoke", doomed["id"], "--reason", reason, "--certificates", str(certs), "--key", str(private)]) == 0
    assert main(["publish-issuer", str(root / "site"), "--certificates", str(certs), "--key", str(private)]) == 0
    return Issued(public, private, valid, revoked, reason, certs, root / "site", root / "stale")


def token(path: Path) -> str:
    doc = json.loads(path.read_text())
    assert doc["type"] == "EnvelopedVerifiableCredential" and doc["id"].startswith("data:application/vc+jwt,")
    return doc["id"].split(",", 1)[1]


# ---------------------------------------------------------------------------- verifier 2: PyJWT


def course_key_from_site(site: Path):
    jwks = jwt.PyJWKSet.from_dict(json.loads((site / "jwks.json").read_text()))
    assert len(jwks.keys) == 1
    return jwks.keys[0].key


def pyjwt_verdict(path: Path, site: Path) -> tuple[str, str]:
    """('valid' | 'invalid' | 'revoked', detail), decided with PyJWT and nothing of multigpu."""
    key = course_key_from_site(site)
    issuer = json.loads((site / "issuer.json").read_text())["id"]
    try:
        credential = jwt.decode(token(path), key, algorithms=["EdDSA"], issuer=issuer)
    except jwt.InvalidTokenError as e:
        return "invalid", f"{type(e).__name__}: {e}"
    entry = credential["credentialStatus"]
    listed = jwt.decode((site / "status-list.jwt").read_text().strip(), key, algorithms=["EdDSA"], issuer=issuer)
    assert listed["id"] == entry["statusListCredential"] and entry["type"] == "BitstringStatusListEntry"
    encoded = listed["credentialSubject"]["encodedList"]
    assert encoded[0] == "u", "multibase base64url starts with 'u'"
    bits = gzip.decompress(base64.urlsafe_b64decode(encoded[1:] + "=" * (-len(encoded[1:]) % 4)))
    index = int(entry["statusListIndex"])
    if (bits[index // 8] >> (7 - index % 8)) & 1:  # index 0 is the first byte's most significant bit
        why = [r["reason"] for r in listed["credentialSubject"]["revocations"] if r["statusListIndex"] == str(index)]
        return "revoked", why[0] if why else ""
    return "valid", credential["credentialSubject"]["identifier"][0]["identityHash"]


def openbadgeslib_verdict(path: Path, site: Path) -> tuple[str, str]:
    """('valid' | 'invalid' | 'revoked', detail) from openbadgeslib's OB 3.0 verifier, offline:
    its status list download is answered from the published folder."""
    from openbadgeslib.ob3.verifier import OB3VerificationError, OB3Verifier

    def download(url: str) -> bytes:
        assert url == f"{ISSUER_URL}/status-list.jwt", f"openbadgeslib asked for {url}"
        return (site / "status-list.jwt").read_bytes()

    verifier = OB3Verifier(cert.load_public_key(site / "course-key.pub"))
    try:
        verifier.verify(token(path))
    except OB3VerificationError as e:
        return "invalid", str(e)
    try:
        credential = verifier.verify(token(path), check_status=True, verify_status_list=True, download=download)
    except OB3VerificationError as e:
        assert "is set at index" in str(e), e
        return "revoked", str(e)
    return "valid", credential.issuer.id


def python_verdicts(path: Path, site: Path) -> list[str]:
    return [openbadgeslib_verdict(path, site)[0], pyjwt_verdict(path, site)[0]]


# ---------------------------------------------------------------------------- verifier 1: multigpu


def multigpu_verdict(path: Path, issued: Issued, capsys) -> tuple[str, str]:
    code = main(["verify", str(path), "--public-key", str(issued.public),
                 "--status-list", str(issued.published / "status-list.jwt")])
    out = capsys.readouterr()
    return {0: "valid", 1: "invalid", 3: "revoked"}[code], out.out + out.err


# ---------------------------------------------------------------------------- verifier 3: the page

@pytest.fixture(scope="module")
def browser():
    with headless_chromium() as chromium:
        yield chromium


def page_verdict(browser, site: Path, *files: Path, shot: str | None = None) -> tuple[str, str]:
    """Open the published page from disk, give it the files, read its verdict and details
    (and leave a screenshot named ``shot``)."""
    context = browser.new_context()
    requests: list[str] = []
    context.on("request", lambda r: requests.append(r.url))
    try:
        tab = context.new_page()
        errors: list[str] = []
        tab.on("pageerror", lambda e: errors.append(str(e)))
        tab.goto((site / "verify.html").as_uri())
        tab.set_input_files("#files", [str(f) for f in files])
        # selectors, not wait_for_function: the page's Content-Security-Policy forbids eval
        tab.wait_for_selector('#verdict:not([data-state="idle"])', timeout=30_000)
        state = tab.get_attribute("#verdict", "data-state")
        if shot:
            SHOTS.mkdir(parents=True, exist_ok=True)
            tab.screenshot(path=str(SHOTS / f"{shot}.png"), full_page=True)
        text = tab.inner_text("#verdict") + "\n" + tab.inner_text("#details")
        assert not errors, errors
        assert tab.locator("#details img, #details script").count() == 0, "a certificate's text became markup"
    finally:
        context.close()
    assert all(u.startswith("file:") for u in requests), f"the page went to the network: {requests}"
    return state, text


# ---------------------------------------------------------------------------- the credential


def test_the_certificate_is_an_open_badges_3_credential(issued):
    key = course_key_from_site(issued.published)
    header = jwt.get_unverified_header(token(issued.valid))
    credential = jwt.decode(token(issued.valid), key, algorithms=["EdDSA"])
    assert header["alg"] == "EdDSA" and header["kid"].startswith(f"{ISSUER_URL}/issuer.json#")
    assert credential["@context"] == [openbadges.VC_CONTEXT, openbadges.OB_CONTEXT]
    assert credential["type"] == ["VerifiableCredential", "OpenBadgeCredential"]
    profile = json.loads((issued.published / "issuer.json").read_text())
    assert credential["issuer"]["id"] == credential["iss"] == profile["id"] == f"{ISSUER_URL}/issuer.json"
    assert profile["type"] == ["Profile"]
    jwks = json.loads((issued.published / "jwks.json").read_text())
    assert profile["verificationMethod"][0]["publicKeyJwk"] == jwks["keys"][0] == header["jwk"]
    assert header["kid"] == profile["verificationMethod"][0]["id"] == profile["assertionMethod"][0]
    subject = credential["credentialSubject"]
    assert subject["type"] == ["AchievementSubject"] and subject["achievement"]["type"] == ["Achievement"]
    assert subject["identifier"][0]["identityHash"].startswith("Zoë")
    results = {r["resultDescription"].rsplit("#", 1)[1]: r["value"] for r in subject["result"]}
    assert results["accuracy"] == "89.0%" and results["efficiency"] == "0.52", results
    assert results["time_to_accuracy"] == "131.4", results
    assert credential["validFrom"].endswith("T00:00:00Z") and credential["jti"] == credential["id"]
    entry = credential["credentialStatus"]
    assert entry["statusListCredential"] == f"{ISSUER_URL}/status-list.jwt" and entry["statusPurpose"] == "revocation"
    record = credential[openbadges.RECORD_TERM]
    assert record["source_sha256"] == "5" * 64 and record["grader_version"] == "multigpu 0.1.0 grader 7"
    assert (issued.published / "course-key.pub").read_text() == issued.public.read_text()


def test_the_published_key_is_the_course_key(issued):
    published = json.loads((issued.published / "jwks.json").read_text())["keys"][0]
    pub = cert.load_public_key(issued.public)
    raw = base64.urlsafe_b64decode(published["x"] + "=" * (-len(published["x"]) % 4))
    from cryptography.hazmat.primitives import serialization

    assert raw == pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert published["kty"] == "OKP" and published["crv"] == "Ed25519" and "d" not in published


# ---------------------------------------------------------------------------- three verifiers


@pytest.mark.slow
def test_a_valid_certificate_verifies_with_all_three(issued, capsys, browser):
    verdict, text = multigpu_verdict(issued.valid, issued, capsys)
    assert verdict == "valid" and "not revoked" in text, text
    assert "time to accuracy 131 s (the grader's clock)" in text, text
    assert python_verdicts(issued.valid, issued.published) == ["valid", "valid"]
    assert openbadgeslib_verdict(issued.valid, issued.published)[1] == f"{ISSUER_URL}/issuer.json"
    pdf = issued.valid.with_suffix(".pdf")
    state, shown = page_verdict(browser, issued.published, issued.valid, pdf, shot="valid")
    assert state == "valid", shown
    assert "Zoë <img src=x onerror=alert(1)>" in shown and "89.0%" in shown and "5" * 64 in shown, shown
    assert "131 s by the grader's clock" in shown, shown
    assert f"{pdf.name} matches" in shown and "not revoked" in shown, shown


def changed(path: Path, out: Path, segment: int, where: float) -> Path:
    """A copy of the certificate with ONE character of one part of its JWT changed."""
    raw = path.read_text()
    start = raw.index("data:application/vc+jwt,") + len("data:application/vc+jwt,")
    parts = raw[start:raw.index('"', start)].split(".")
    offset = start + sum(len(p) + 1 for p in parts[:segment]) + int(where * (len(parts[segment]) - 1))
    c = raw[offset]
    out.write_text(raw[:offset] + B64URL[(B64URL.index(c) + 1) % 64] + raw[offset + 1:])
    assert sum(a != b for a, b in zip(raw, out.read_text())) == 1
    return out


@pytest.mark.parametrize("segment,where", [(0, 0.5), (1, 0.3), (1, 1.0), (2, 0.5), (2, 1.0)],
                         ids=["header", "payload", "payload-last", "signature", "signature-last"])
@pytest.mark.slow
def test_one_changed_character_fails_all_three(issued, capsys, browser, tmp_path, segment, where):
    bad = changed(issued.valid, tmp_path / issued.valid.name, segment, where)
    verdict, text = multigpu_verdict(bad, issued, capsys)
    assert verdict == "invalid" and "INVALID" in text, text
    assert python_verdicts(bad, issued.published) == ["invalid", "invalid"]
    state, shown = page_verdict(browser, issued.published, bad, shot=f"changed-{segment}-{where}")
    assert state == "invalid" and shown.startswith("INVALID"), shown


def test_every_changed_character_fails_both_python_verifiers(issued, tmp_path):
    """The whole JWT, character by character (the page gets a sample above: a browser per character
    would take minutes)."""
    public = cert.load_public_key(issued.public)
    key = course_key_from_site(issued.published)
    good = token(issued.valid)
    for i, c in enumerate(good):
        if c == ".":
            continue
        bad = good[:i] + B64URL[(B64URL.index(c) + 1) % 64] + good[i + 1:]
        with pytest.raises(openbadges.CredentialError):
            openbadges.verify_token(bad, public)
        with pytest.raises(jwt.InvalidTokenError):
            jwt.decode(bad, key, algorithms=["EdDSA"])


@pytest.mark.slow
def test_a_changed_claim_with_the_old_signature_fails_all_three(issued, capsys, browser, tmp_path):
    head, body, sig = token(issued.valid).split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims[openbadges.RECORD_TERM]["assessment"]["efficiency"] = 0.92
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    bad = tmp_path / issued.valid.name
    bad.write_text(json.dumps(openbadges.envelope(f"{head}.{body}.{sig}")))
    assert multigpu_verdict(bad, issued, capsys)[0] == "invalid"
    assert python_verdicts(bad, issued.published) == ["invalid", "invalid"]
    assert page_verdict(browser, issued.published, bad)[0] == "invalid"


@pytest.mark.slow
def test_a_revoked_certificate_is_reported_revoked_with_its_reason_by_all_three(issued, capsys, browser):
    verdict, text = multigpu_verdict(issued.revoked, issued, capsys)
    assert verdict == "revoked" and issued.reason in text, text
    assert pyjwt_verdict(issued.revoked, issued.published) == ("revoked", issued.reason)
    assert openbadgeslib_verdict(issued.revoked, issued.published)[0] == "revoked"
    state, shown = page_verdict(browser, issued.published, issued.revoked, shot="revoked")
    assert state == "revoked" and issued.reason in shown and "Mallory Test" in shown, shown


@pytest.mark.slow
def test_a_certificate_signed_with_another_key_fails_all_three(issued, capsys, browser, tmp_path):
    other, _ = cert.keygen(tmp_path / "other" / "key")
    _, forged = cert.issue(cert.make_record("Eve Forger", "eve", AUDITED), cert.load_private_key(other),
                           tmp_path / "forged", issuer_url=ISSUER_URL)
    verdict, text = multigpu_verdict(forged, issued, capsys)
    assert verdict == "invalid" and "different key" in text, text
    assert python_verdicts(forged, issued.published) == ["invalid", "invalid"]
    state, shown = page_verdict(browser, issued.published, forged)
    assert state == "invalid" and "different key" in shown, shown


@pytest.mark.slow
def test_a_page_published_before_a_revocation_learns_it_from_the_current_list(issued, browser):
    state, shown = page_verdict(browser, issued.stale, issued.revoked)
    assert state == "valid" and "inside this page" in shown, shown  # all that page can know
    state, shown = page_verdict(browser, issued.stale, issued.revoked, issued.published / "status-list.jwt")
    assert state == "revoked" and issued.reason in shown, shown


@pytest.mark.slow
def test_an_older_or_forged_dropped_list_never_hides_a_revocation(issued, browser, tmp_path):
    state, shown = page_verdict(browser, issued.published, issued.revoked, issued.stale / "status-list.jwt")
    assert state == "revoked" and issued.reason in shown, shown
    other, _ = cert.keygen(tmp_path / "other" / "key")
    cert.issue(cert.make_record("X", "x", AUDITED), cert.load_private_key(other), tmp_path / "forged",
               issuer_url=ISSUER_URL)
    forged = tmp_path / "forged" / status_list.LIST_FILE
    state, shown = page_verdict(browser, issued.published, issued.revoked, forged)
    assert state == "invalid" and "dropped status list" in shown, shown


@pytest.mark.slow
def test_the_page_checks_a_dropped_pdf(issued, browser, tmp_path):
    pdf = tmp_path / issued.valid.with_suffix(".pdf").name
    pdf.write_bytes(issued.valid.with_suffix(".pdf").read_bytes() + b"\n")
    state, shown = page_verdict(browser, issued.published, issued.valid, pdf)
    assert state == "invalid" and "PDF" in shown, shown


@pytest.mark.slow
def test_the_unpublished_template_verifies_nothing(browser, tmp_path):
    (tmp_path / "verify.html").write_text(openbadges.page_template())
    context = browser.new_context()
    try:
        tab = context.new_page()
        tab.goto((tmp_path / "verify.html").as_uri())
        assert tab.get_attribute("#verdict", "data-state") == "unpublished"
        assert tab.is_disabled("#files")
    finally:
        context.close()


# ---------------------------------------------------------------------------- the status list


def test_the_bitstring_is_16_kib_gzip_multibase_with_index_0_the_first_bit():
    encoded = status_list.encode({0, 9, 131_071})
    bits = gzip.decompress(base64.urlsafe_b64decode(encoded[1:] + "=" * (-len(encoded[1:]) % 4)))
    assert encoded[0] == "u" and "=" not in encoded and len(bits) == 16 * 1024
    assert bits[0] == 0x80 and bits[1] == 0x40 and bits[-1] == 0x01 and sum(map(bool, bits)) == 3
    assert status_list.decode(encoded) == bits
    assert [i for i in (0, 1, 8, 9, 131_071) if status_list.is_set(bits, i)] == [0, 9, 131_071]
    with pytest.raises(status_list.StatusError):
        status_list.encode({131_072})


def test_revoke_refuses_what_it_cannot_do(issued, capsys):
    key = cert.load_private_key(issued.private)
    with pytest.raises(cert.CertificateError, match="no certificate"):
        cert.revoke(issued.certs, "not-an-id", "a reason", key)
    valid_id = issued.valid.stem
    with pytest.raises(cert.CertificateError, match="say why"):
        cert.revoke(issued.certs, valid_id, "  ", key)
    with pytest.raises(cert.CertificateError, match="already revoked"):
        cert.revoke(issued.certs, issued.revoked.stem, "again", key)
    assert main(["revoke", "nope", "--reason", "x", "--certificates", str(issued.certs),
                 "--key", str(issued.private)]) == 1
    assert "no certificate nope" in capsys.readouterr().err


def test_a_folder_keeps_the_issuer_address_its_credentials_name(issued, tmp_path):
    key = cert.load_private_key(issued.private)
    with pytest.raises(cert.CertificateError, match="point to that address"):
        cert.issue(cert.make_record("Ada", "ada", AUDITED), key, issued.certs, issuer_url="https://elsewhere.example.org")
    state = json.loads((issued.certs / status_list.STATE_FILE).read_text())
    assert state["issuer_url"] == ISSUER_URL and sorted(state["issued"].values()) == [0, 1]


def test_one_issuer_folder_numbers_the_certificates_of_several_output_folders(tmp_path, issued):
    key = cert.load_private_key(issued.private)
    books = tmp_path / "issuer"
    made = [cert.issue(cert.make_record(n, n, AUDITED), key, tmp_path / n, issuer_dir=books, issuer_url=ISSUER_URL)[1]
            for n in ("ann", "ben")]
    entries = [cert.verify(js, issued.public, status_list_file=books / status_list.LIST_FILE).credential["credentialStatus"]
               for js in made]
    assert [e["statusListIndex"] for e in entries] == ["0", "1"]
    assert not (tmp_path / "ann" / status_list.STATE_FILE).exists()


def test_without_a_status_list_verify_says_revocation_was_not_checked(issued, tmp_path):
    alone = tmp_path / issued.revoked.name
    alone.write_bytes(issued.revoked.read_bytes())
    ok = cert.verify(alone, issued.public)
    assert "revocation NOT checked" in ok.summary()


def test_a_status_list_from_another_key_is_refused(issued, tmp_path):
    other, _ = cert.keygen(tmp_path / "other" / "key")
    forged = tmp_path / "forged"
    cert.issue(cert.make_record("X", "x", AUDITED), cert.load_private_key(other), forged, issuer_url=ISSUER_URL)
    with pytest.raises(cert.CertificateError, match="status list"):
        cert.verify(issued.revoked, issued.public, status_list_file=forged / status_list.LIST_FILE)
