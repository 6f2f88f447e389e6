"""Certificates: keys outside the repo, signed records that reveal any tampering, a PDF, certify.

The credential format, revocation and the other two verifiers: tests/test_openbadges.py."""

from __future__ import annotations

import base64
import json

import pytest

from multigpu.credential import certificates as cert
from multigpu.credential import openbadges

RESULT = {  # what GradeResult.to_dict() gives for a passing submission (abridged)
    "passed": True, "score": 10, "max_score": 10,
    "settings": {"profile": "cpu", "accuracy": 0.8, "time_budget_s": 900.0, "efficiency": 0.25, "epochs_held": 2,
                 "workers": 4},
    "measurements": {"accuracy": 0.91, "accuracy_held": 0.89, "throughput": 412.5, "efficiency": 0.52,
                     "time_to_accuracy_s": 131.4, "workers": 4, "hardware": "CPU mode, 2 cores"},
}


@pytest.fixture
def key_pair(tmp_path):
    private, public = cert.keygen(tmp_path / "keys" / "course-key")
    return cert.load_private_key(private), public


def issue(tmp_path, key, name="Zoë Dupont-Łukasiewicz"):
    record = cert.make_record(name, "zoe", RESULT, labs={"score": 9, "max_score": 10, "required_fraction": 0.6})
    return cert.issue(record, key, tmp_path / "out")


def test_keygen_writes_a_private_key_only_its_owner_reads(tmp_path):
    private, public = cert.keygen(tmp_path / "k" / "course-key")
    assert private.stat().st_mode & 0o077 == 0, "the private key must not be readable by others"
    assert public.read_text().startswith("ed25519 ")
    assert b"PRIVATE KEY" in private.read_bytes() and b"PRIVATE" not in public.read_bytes()
    with pytest.raises(FileExistsError):
        cert.keygen(private)


def test_keygen_refuses_a_path_inside_the_repository(repo):
    with pytest.raises(ValueError, match="outside"):
        cert.keygen(repo / "grading" / "course-key")


def test_default_key_lives_outside_the_repository(monkeypatch, repo):
    monkeypatch.delenv("MULTIGPU_COURSE_KEY", raising=False)
    path = cert.default_key_path()
    assert repo.resolve() not in path.resolve().parents


def test_the_record_carries_what_it_was_issued_for():
    audited = dict(RESULT, source_sha256="ab" * 32, grader_version="grader 7")
    record = cert.make_record("Ada", "ada", audited)
    assert (record["source_sha256"], record["grader_version"]) == ("ab" * 32, "grader 7")
    older = cert.make_record("Ada", "ada", RESULT)  # a result saved before the grader recorded them
    assert older["source_sha256"] is None and older["grader_version"] is None


def test_issued_certificate_verifies_and_states_the_measurements(tmp_path, key_pair):
    key, public = key_pair
    pdf, record = issue(tmp_path, key)
    assert pdf.read_bytes().startswith(b"%PDF") and pdf.stat().st_size > 5000
    ok = cert.verify(record, public)
    assert ok.pdf_checked
    a = ok.record["assessment"]
    assert ok.record["name"] == "Zoë Dupont-Łukasiewicz" and ok.record["course"] == cert.COURSE
    assert (a["accuracy"], a["throughput_images_per_s"], a["efficiency"], a["hardware_mode"]) == (0.89, 412.5, 0.52, "cpu")
    assert a["time_to_accuracy_s"] == 131.4  # the grader's clock, beside images/s
    assert "VALID" in ok.summary() and "time to accuracy 131 s (the grader's clock)" in ok.summary()
    assert cert.verify(pdf, public).record == ok.record  # the PDF's path works too


def rewrite_claims(path, change) -> None:
    """Change the credential's claims and keep its old signature (what a forger can do)."""
    token = openbadges.token_of(path.read_text())
    head, body, sig = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    change(claims)
    body = base64.urlsafe_b64encode(json.dumps(claims, ensure_ascii=False).encode()).rstrip(b"=").decode()
    path.write_text(json.dumps(openbadges.envelope(f"{head}.{body}.{sig}")))


@pytest.mark.parametrize("field,value", [("name", "Mallory"), ("issued", "1999-01-01")])
def test_a_changed_record_fails_verification(tmp_path, key_pair, field, value):
    key, public = key_pair
    _, path = issue(tmp_path, key)
    rewrite_claims(path, lambda c: c[openbadges.RECORD_TERM].__setitem__(field, value))
    with pytest.raises(cert.CertificateError, match="changed"):
        cert.verify(path, public)


def test_every_single_changed_byte_is_detected(tmp_path, key_pair):
    """Each character of the certificate's JWT, in turn, changed to the next base64url letter."""
    key, public = key_pair
    _, path = issue(tmp_path, key)
    raw = path.read_text()
    start = raw.index(openbadges.ENVELOPE_PREFIX) + len(openbadges.ENVELOPE_PREFIX)
    end = raw.index('"', start)
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    for pos in range(start, end):
        if raw[pos] == ".":
            continue
        path.write_text(raw[:pos] + letters[(letters.index(raw[pos]) + 1) % 64] + raw[pos + 1:])
        with pytest.raises(cert.CertificateError):
            cert.verify(path, public)
    path.write_text(raw)
    cert.verify(path, public)


def test_a_certificate_signed_with_another_key_fails(tmp_path, key_pair):
    key, public = key_pair
    other, _ = cert.keygen(tmp_path / "other" / "key")
    _, path = issue(tmp_path, cert.load_private_key(other))
    with pytest.raises(cert.CertificateError, match="different key"):
        cert.verify(path, public)


def test_a_changed_pdf_fails_verification(tmp_path, key_pair):
    key, public = key_pair
    pdf, path = issue(tmp_path, key)
    pdf.write_bytes(pdf.read_bytes().replace(b"Certificate", b"Certificatf", 1) + b"\n")
    with pytest.raises(cert.CertificateError, match="PDF|pdf"):
        cert.verify(path, public)


def test_garbage_is_not_a_certificate(tmp_path, key_pair):
    _, public = key_pair
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(cert.CertificateError, match="not a certificate"):
        cert.verify(bad, public)


@pytest.mark.slow
def test_certify_issues_only_to_students_who_passed_both_parts(tmp_path, key_pair):
    from nbgrader.api import Gradebook

    key, public = key_pair
    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    people = {  # student: (assessment points of 10, lab points of 10, official result passed)
        "ada": (10, 8, True), "bob": (7, 10, False), "cy": (10, 3, True), "dee": (10, 10, False),
        "eve": (10, 10, True), "fay": (10, 10, None), "gus": (10, 10, True), "hal": (10, 10, True),
        "ivy": (10, 10, True),
    }
    flag = {"kind": "collective", "line": 42, "code": "hvd.allreduce(torch.zeros(3))", "why": "not the gradients"}
    reviews = {  # the grader held these passes for review; a person decided on two of them
        "gus": {"flags": [flag], "held": True, "decision": None},
        "hal": {"flags": [flag], "held": True,
                "decision": {"approved": True, "by": "instructor", "reason": "a metric, not a gradient"}},
        "ivy": {"flags": [flag], "held": True,
                "decision": {"approved": False, "by": "instructor", "reason": "all-reduces zeros"}},
    }
    with Gradebook(url) as gb:
        for assignment, nb, cell in (("assessments", "assessment", "t1"), ("notebooks", "01-lab", "t2")):
            gb.add_assignment(assignment)
            gb.add_notebook(nb, assignment)
            gb.add_grade_cell(cell, nb, assignment, max_score=10, cell_type="code")
        for sid, (a, lab, _) in people.items():
            gb.add_student(sid, first_name=sid.capitalize(), last_name="Test")
            for assignment, nb, cell, pts in (("assessments", "assessment", "t1", a), ("notebooks", "01-lab", "t2", lab)):
                gb.add_submission(assignment, sid)
                grade = gb.find_grade(cell, nb, assignment, sid)
                grade.auto_score = pts
                gb.db.commit()
    grading = tmp_path  # the course's grading folder: gradebook.db, results/, autograded/
    for sid, (_, _, passed) in people.items():
        # what a learner's notebook kernel could write: a forged passing result next to the notebook
        d = grading / "autograded" / sid / "assessments"
        d.mkdir(parents=True)
        (d / "grading-result.json").write_text(json.dumps(dict(RESULT, passed=True, sandboxed=True)))
        if passed is not None:  # the official result, from the grader's own sandboxed run
            (grading / "results").mkdir(exist_ok=True)
            (grading / "results" / f"{sid}.json").write_text(
                json.dumps(dict(RESULT, passed=passed, sandboxed=sid != "eve", source_sha256=sid * 4,
                                grader_version="grader 7", review=reviews.get(sid))))
    decisions = {d.student: d for d in cert.certify(url, grading, tmp_path / "certs", key=key)}
    assert [s for s, d in decisions.items() if d.certified] == ["ada", "hal"], {s: d.reason for s, d in decisions.items()}
    assert "not passed" in decisions["bob"].reason and "labs" in decisions["cy"].reason
    assert "official result does not say passed" in decisions["dee"].reason
    assert "sandbox" in decisions["eve"].reason, "an unsandboxed grading never certifies"
    assert "no official result" in decisions["fay"].reason, "a file the notebook wrote is never read"
    assert "held for review (line 42 (collective))" in decisions["gus"].reason, decisions["gus"].reason
    assert cert.held_for_review(dict(RESULT, review=reviews["gus"])) and not cert.held_for_review(RESULT)
    assert "rejected on review by instructor: all-reduces zeros" in decisions["ivy"].reason, decisions["ivy"].reason
    json_file = next(f for f in decisions["ada"].files if f.suffix == ".json")
    record = cert.verify(json_file, public).record
    assert (record["name"], record["source_sha256"], record["grader_version"]) == ("Ada Test", "adaadaadaada", "grader 7")
