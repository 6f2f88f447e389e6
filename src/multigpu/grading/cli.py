"""``multigpu grade | keygen | verify | certify | calibrate``: the assessment from a terminal.

    multigpu grade [assessments]        the verdict the official grader gives (make grade-me)
    multigpu keygen [--key PATH]        the course's signing key, outside the repository
    multigpu grade-submissions          the official, sandboxed grading of every collected train.py
    multigpu certify                    certificates for who passed (after make autograde)
    multigpu verify CERT --public-key course-key.pub [--status-list status-list.jwt]
    multigpu revoke ID --reason WHY     withdraw a certificate (the course's status list)
    multigpu publish-issuer DIR         the files the course hosts: issuer profile, key, status list, page
    multigpu calibrate                  pass counts of the reference and the broken variants
    multigpu regrade RESULT             grade an official result's kept source again: does the verdict hold?
    multigpu review [STUDENT] [--approve|--reject REASON]   the passes held for review
    multigpu similarity [--threshold F] pairs of collected assessments that share more than the starter
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from multigpu.grading.rules import Settings


def cmd_grade(args: argparse.Namespace) -> int:
    from multigpu.grading import grader, rules

    target = Path(args.target)
    script = target / "train.py" if target.is_dir() else target
    settings = rules.settings(args.profile)
    print(settings.describe(), flush=True)
    try:
        result = grader.grade(script, settings, echo=args.echo, log=lambda m: print(m, flush=True))
    except grader.GradingUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(result.report())
    if args.save or args.json:
        out = grader.save_result(result, args.json or script.parent / grader.RESULT_FILE)
        print(f"result written to {out}")
    return 0 if result.passed else 1


def cmd_grade_submissions(args: argparse.Namespace) -> int:
    from multigpu.grading import grader, official, rules

    try:
        done = official.grade_submissions(args.grading, rules.settings(args.profile))
    except grader.GradingUnavailable as e:  # no sandbox, or no Horovod inside it: nothing recorded
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{sum(g.result.passed for g in done)} of {len(done)} assessment(s) passed; results in "
          f"{args.grading / 'results'}/")
    return 0


def cmd_keygen(args: argparse.Namespace) -> int:
    from multigpu.grading import certificates

    try:
        private, public = certificates.keygen(args.key)
    except (FileExistsError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"private key: {private} (keep it secret; back it up)\npublic key:  {public} (publish it with the course)")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from multigpu.grading import certificates

    public = args.public_key or certificates.public_key_path(certificates.default_key_path())
    if not Path(args.certificate).exists():
        print(f"error: no certificate at {args.certificate}", file=sys.stderr)
        return 2
    if not str(public).startswith("ed25519 ") and not Path(public).is_file():
        print(f"error: no public key at {public}: pass the course's published key, --public-key course-key.pub "
              "(a workshop hub publishes it at <hub address>/services/grading/issuer/course-key.pub; on the hub's "
              f"box it lies beside the signing key, by default {certificates.public_key_path(certificates.default_key_path())})",
              file=sys.stderr)
        return 2
    try:
        print(certificates.verify(args.certificate, public, status_list_file=args.status_list).summary())
    except certificates.Revoked as e:
        print(f"REVOKED: {e}", file=sys.stderr)
        return 3
    except certificates.CertificateError as e:
        print(f"INVALID: {e}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:  # a key or status list file that is not one
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    from multigpu.grading import certificates

    try:
        path = certificates.revoke(args.certificates, args.id, args.reason, certificates.load_private_key(args.key))
    except (certificates.CertificateError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"revoked {args.id}: {args.reason}\nstatus list signed again: {path}")
    if args.publish:
        return cmd_publish_issuer(argparse.Namespace(outdir=args.publish, certificates=args.certificates, key=args.key))
    print("publish it where the course hosts its issuer files: multigpu publish-issuer DIR")
    return 0


def cmd_publish_issuer(args: argparse.Namespace) -> int:
    from multigpu.grading import certificates

    try:
        files = certificates.publish_issuer(args.outdir, args.certificates, certificates.load_private_key(args.key))
    except (certificates.CertificateError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("host these files at the issuer address the credentials name "
          f"({certificates.resolve_issuer_url(args.certificates)}):")
    for f in files:
        print(f"  {f}")
    return 0


def cmd_certify(args: argparse.Namespace) -> int:
    from multigpu.grading import certificates

    if not args.gradebook.exists():
        print(f"error: no gradebook at {args.gradebook}: run 'make autograde' first", file=sys.stderr)
        return 1
    key = certificates.load_private_key(args.key)
    try:
        url = certificates.resolve_issuer_url(args.out, args.issuer_url)
    except certificates.CertificateError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if url == certificates.LOCAL_ISSUER_URL:
        print(f"note: the credentials name the issuer address {url} (for trying the course out); pass "
              "--issuer-url with the address where the course will host its issuer files", file=sys.stderr)
    decisions = certificates.certify(f"sqlite:///{args.gradebook.resolve()}", args.gradebook.parent, args.out, key=key,
                                     issuer_url=url)
    for d in decisions:
        print(f"{d.student:20s} {'CERTIFIED' if d.certified else 'no':10s} {d.reason}"
              + (f" -> {', '.join(map(str, d.files))}" if d.files else ""))
    print(f"{sum(d.certified for d in decisions)} of {len(decisions)} student(s) certified; files in {args.out}/")
    return 0


def _grade_all(jobs: list[tuple[str, Path]], settings: Settings, args: argparse.Namespace) -> dict[str, list[dict]]:
    """Grade every job in turn (sandboxed), print one line each; the rows per variant."""
    from multigpu.grading import grader

    print(settings.describe())
    print(f"{len(jobs)} gradings: the reference x{args.reference}, each broken variant x{args.broken}", flush=True)
    rows: dict[str, list[dict]] = {}
    for i, (name, path) in enumerate(jobs, 1):
        start = time.monotonic()
        r = grader.grade(path, settings, sandbox="required")
        m = r.measurements
        rows.setdefault(name, []).append({"passed": r.passed and not r.held, "held": r.held, "score": r.score, "efficiency": m.get("efficiency"),
                                          "failed": [c for c in r.criteria if not r.ok(c)],
                                          "allreduces_per_epoch": m.get("horovod_gradient_rounds_per_epoch"),
                                          "accuracy_held": m.get("accuracy_held"), "seconds": time.monotonic() - start})
        failed = [c for c in r.criteria if not r.ok(c)]
        print(f"[{i}/{len(jobs)}] {name}: {r.score}/{r.max_score} "
              f"{'HELD for review' if r.held else 'PASS' if r.passed else 'fail'} "
              f"(accuracy held {m.get('accuracy_held')}, efficiency {m.get('efficiency')}; failed: "
              f"{', '.join(failed) or '-'}; {time.monotonic() - start:.0f} s)", flush=True)
    return rows


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Grade the reference N times and each broken variant M times; print the pass counts. The
    variants judged by their effect (:data:`variants.BY_EFFECT`) are graded and printed too, with
    no expected count: their verdict is the measurement."""
    from multigpu.grading import grader, rules, variants

    settings = rules.settings(args.profile)
    made = Path(tempfile.mkdtemp(prefix="multigpu-variants-"))
    # the cheats and broken conversions; the failure cases (crash, hang, ...) are the tests'
    broken = [(v, variants.write(v, grader.REFERENCE, made / f"{v}.py"))
              for v in (*variants.CALIBRATED, *variants.BY_EFFECT)]
    if args.only:
        broken = [(v, p) for v, p in broken if v in args.only]
    jobs = [("reference", grader.REFERENCE)] * args.reference
    for _ in range(args.broken):
        jobs += broken  # interleaved, a slow minute hits all
    hog = None
    if args.busy:  # another CPU-heavy job on the machine: the verdicts must not flip
        from multigpu.running import launch

        hog = launch.start([sys.executable, "-c", "while True: pass"], env=dict(os.environ), capture=False)
        print(f"a CPU-heavy job runs beside the gradings (pid {hog.pid})", flush=True)
    try:
        rows = _grade_all(jobs, settings, args)
    except grader.GradingUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if hog is not None:
            launch.kill_sessions([hog])
    print("\nvariant                   passes   expected  efficiency (min-max)   accuracy held (min-max)")
    ok = True
    for name, rs in rows.items():
        passes = sum(x["passed"] for x in rs)
        expected = len(rs) if name == "reference" else None if name in variants.BY_EFFECT else 0
        ok &= expected is None or passes == expected
        eff = [x["efficiency"] for x in rs if x["efficiency"] is not None]
        acc = [x["accuracy_held"] for x in rs if x["accuracy_held"] is not None]
        span = lambda v: f"{min(v):.2f}-{max(v):.2f}" if v else "-"  # noqa: E731
        wanted = "any  " if expected is None else f"{expected:>2d}/{len(rs):<2d}"
        print(f"{name:25s} {passes:>2d}/{len(rs):<2d}    {wanted}    {span(eff):20s}  {span(acc)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": settings.to_dict(), "rows": rows}, indent=2) + "\n")
    print("calibration " + ("holds" if ok else "DOES NOT HOLD: change the profile in multigpu/grading/rules.py"))
    return 0 if ok else 1


def cmd_regrade(args: argparse.Namespace) -> int:
    from multigpu.grading import grader, regrade

    try:
        done = regrade.regrade(args.result, log=lambda m: print(m, flush=True))
    except grader.GradingUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError, KeyError, TypeError) as e:  # no result, no kept source, a changed copy
        print(f"error: cannot regrade {args.result}: {e}", file=sys.stderr)
        return 2
    print(done.report())
    return 0 if done.holds else 3 if done.noisy else 1


def cmd_review(args: argparse.Namespace) -> int:
    from multigpu.grading import official, review

    if args.approve is not None or args.reject is not None:
        if not args.student:
            print("error: name the student whose pass you decide on", file=sys.stderr)
            return 2
        try:
            d = official.decide(args.grading, args.student, approve=args.reject is None,
                                reason=args.approve if args.reject is None else args.reject)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"{args.student}: {'APPROVED' if d['approved'] else 'REJECTED'} by {d['by']} at {d['at']}: {d['reason']}")
        return 0
    items = [(s, r) for s, r in official.held(args.grading) if not args.student or s == args.student]
    if not items:
        print("no pass is held for review" + (f" for {args.student}" if args.student else ""))
        return 0
    for student, result in items:
        d = result["review"].get("decision")
        state = f"{'approved' if d['approved'] else 'rejected'} by {d['by']}: {d['reason']}" if d else "AWAITS A DECISION"
        print(f"{student:20s} {state}; flagged {review.summary(result['review']['flags'])}")
        if args.student:
            print(f"  source {result.get('source_file')} (SHA-256 {result.get('source_sha256')})")
            print(review.show(result["review"]["flags"]))
    if not args.student:
        print("multigpu review STUDENT shows the flagged lines; --approve REASON or --reject REASON decides")
    return 0


def cmd_similarity(args: argparse.Namespace) -> int:
    from multigpu.grading import similarity

    found, out = similarity.report(args.grading, args.threshold)
    for p in found:
        print(f"{p.a:20s} {p.b:20s} {p.similarity:.0%} shared ({p.a} {p.similarity_a:.0%}, {p.b} {p.similarity_b:.0%}, "
              f"{p.tokens} tokens)")
    print(f"{len(found)} pair(s) at or above {args.threshold:.0%} of the code outside the starter (a lead for a "
          f"person, not a verdict); written to {out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """The grading verbs, the certificate verbs and the instructor's verbs."""
    _register_grading(sub)
    _register_certificates(sub)
    _register_instructor(sub)


def _register_grading(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("grade", help="grade an assessment the way the official grader does")
    p.add_argument("target", nargs="?", default="assessments", help="the assessments/ folder or a script")
    p.add_argument("--profile", choices=["cpu", "gpu", "quick"], default=None,
                   help="grading profile (default: by this machine; quick under MULTIGPU_QUICK=1)")
    p.add_argument("--echo", action="store_true", help="show the run's output live")
    p.add_argument("--save", action="store_true", help="write grading-result.json next to the script")
    p.add_argument("--json", type=Path, default=None, help="write the result as JSON to this file")
    p.set_defaults(func=cmd_grade)

    p = sub.add_parser("grade-submissions", help="the official, sandboxed grading of every collected assessment")
    p.add_argument("--grading", type=Path, default=Path("grading"), help="the course's grading folder")
    p.add_argument("--profile", choices=["cpu", "gpu", "quick"], default=None)
    p.set_defaults(func=cmd_grade_submissions)


def _register_certificates(sub: argparse._SubParsersAction) -> None:
    from multigpu.grading.certificates import default_key_path

    p = sub.add_parser("keygen", help="create the course's certificate signing key (outside the repository)")
    p.add_argument("--key", type=Path, default=None, help=f"private key path (default {default_key_path()})")
    p.set_defaults(func=cmd_keygen)

    p = sub.add_parser("verify", help="check a certificate's signature, PDF and revocation status")
    p.add_argument("certificate", type=Path, help="the certificate's .json (or its .pdf)")
    p.add_argument("--public-key", default=None, help="the course's public key file (default: next to the key)")
    p.add_argument("--status-list", type=Path, default=None,
                   help="the course's published status-list.jwt (default: the one next to the certificate)")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("revoke", help="revoke a certificate (its bit in the course's status list, with the reason)")
    p.add_argument("id", help="the certificate's id (its file name without .json)")
    p.add_argument("--reason", required=True, help="why, in words anyone may read: verifiers show it")
    p.add_argument("--certificates", type=Path, default=Path("certificates"), help="the folder it was issued to")
    p.add_argument("--key", type=Path, default=None, help="private key (default: multigpu keygen's)")
    p.add_argument("--publish", type=Path, default=None, help="also write the hostable issuer files here")
    p.set_defaults(func=cmd_revoke)

    p = sub.add_parser("publish-issuer", help="write the files the course hosts: issuer profile, key, status list, page")
    p.add_argument("outdir", type=Path, help="folder to write them to (served at the issuer address)")
    p.add_argument("--certificates", type=Path, default=Path("certificates"), help="the folder certificates were issued to")
    p.add_argument("--key", type=Path, default=None, help="private key (default: multigpu keygen's)")
    p.set_defaults(func=cmd_publish_issuer)

    p = sub.add_parser("certify", help="issue certificates to students who passed (after make autograde)")
    p.add_argument("--gradebook", type=Path, default=Path("grading/gradebook.db"),
                   help="the gradebook; the official results are read from results/ next to it")
    p.add_argument("--out", type=Path, default=Path("certificates"))
    p.add_argument("--key", type=Path, default=None, help="private key (default: multigpu keygen's)")
    p.add_argument("--issuer-url", default=None,
                   help="where the course hosts its issuer files (default: the folder's, $MULTIGPU_ISSUER_URL, "
                        "else a local address for trying it out)")
    p.set_defaults(func=cmd_certify)


def _register_instructor(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="grade the reference and the broken variants; print pass counts")
    p.add_argument("--profile", choices=["cpu", "gpu", "quick"], default="cpu")
    p.add_argument("--reference", type=int, default=10, help="gradings of the reference (default 10)")
    p.add_argument("--broken", type=int, default=3, help="gradings of each broken variant (default 3)")
    p.add_argument("--only", nargs="*", default=None, help="grade only these broken variants")
    p.add_argument("--busy", action="store_true", help="run a CPU-heavy job beside the gradings")
    p.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("regrade", help="grade an official result's kept source again and say if the verdict holds")
    p.add_argument("result", type=Path, help="the official result, e.g. grading/results/<student>.json")
    p.set_defaults(func=cmd_regrade)

    p = sub.add_parser("review", help="list, show and decide the passes held for review")
    p.add_argument("student", nargs="?", default=None, help="show this student's flagged lines (or decide)")
    p.add_argument("--grading", type=Path, default=Path("grading"), help="the course's grading folder")
    decide = p.add_mutually_exclusive_group()
    decide.add_argument("--approve", metavar="REASON", default=None, help="release the hold: the pass may be certified")
    decide.add_argument("--reject", metavar="REASON", default=None, help="keep the hold: no certificate")
    p.set_defaults(func=cmd_review)

    from multigpu.grading.similarity import THRESHOLD

    p = sub.add_parser("similarity", help="pairs of collected assessments that share more than the starter")
    p.add_argument("--grading", type=Path, default=Path("grading"), help="the course's grading folder")
    p.add_argument("--threshold", type=float, default=THRESHOLD,
                   help=f"shared fraction of either one's code outside the starter (default {THRESHOLD})")
    p.set_defaults(func=cmd_similarity)
