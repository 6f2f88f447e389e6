"""``multigpu grade | grade-submissions | calibrate | regrade | review | similarity``: the assessment
from a terminal (the certificate verbs are :mod:`multigpu.credential.cli`'s).

    multigpu grade [assessments]        the verdict the official grader gives (make grade-me)
    multigpu grade-submissions          the official, sandboxed grading of every collected train.py
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


def _grade_all(jobs: list[tuple[str, Path]], settings: Settings, args: argparse.Namespace) -> dict[str, list[dict]]:
    """Grade every job in turn (sandboxed), print one line each; the rows per variant."""
    from multigpu.grading import grader, review

    print(settings.describe())
    print(f"{len(jobs)} gradings: the reference x{args.reference}, each broken variant x{args.broken}", flush=True)
    rows: dict[str, list[dict]] = {}
    for i, (name, path) in enumerate(jobs, 1):
        start = time.monotonic()
        r = grader.grade(path, settings, sandbox="required")
        m = r.measurements
        rows.setdefault(name, []).append({"passed": r.passed and not r.held, "held": r.held, "score": r.score, "efficiency": m.get("efficiency"),
                                          "failed": [c for c in r.criteria if not r.ok(c)],
                                          "flags": sorted({f["kind"] for f in r.review["flags"]}),
                                          "time_to_accuracy_s": m.get("time_to_accuracy_s"),
                                          "allreduces_per_epoch": m.get("horovod_gradient_rounds_per_epoch"),
                                          "accuracy_held": m.get("accuracy_held"), "seconds": time.monotonic() - start})
        failed = [c for c in r.criteria if not r.ok(c)]
        print(f"[{i}/{len(jobs)}] {name}: {r.score}/{r.max_score} "
              f"{'HELD for review' if r.held else 'PASS' if r.passed else 'fail'} "
              f"(accuracy held {m.get('accuracy_held')}, efficiency {m.get('efficiency')}, time to accuracy "
              f"{m.get('time_to_accuracy_s')} s; failed: {', '.join(failed) or '-'}; flags: "
              f"{review.summary(r.review['flags']) or '-'}; {time.monotonic() - start:.0f} s)", flush=True)
    return rows


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Grade the reference N times and each broken variant M times; print the pass counts. The
    variants judged by their effect (:data:`variants.BY_EFFECT`) are graded and printed too, with
    no expected count: their verdict is the measurement. With ``--honest`` each honest variant
    too: none may raise a flag (its pass, if it passes, is never held), and the conversion that
    caches the decoded data (:data:`variants.CACHED`) must raise the flag it is held with."""
    from multigpu.grading import grader, honest, rules, variants

    settings = rules.settings(args.profile)
    made = Path(tempfile.mkdtemp(prefix="multigpu-variants-"))
    # the cheats and broken conversions; the failure cases (crash, hang, ...) are the tests'
    broken = [(v, variants.write(v, grader.REFERENCE, made / f"{v}.py"))
              for v in (*variants.CALIBRATED, *variants.BY_EFFECT)]
    broken += [(v, variants.write(v, grader.REFERENCE, made / f"{v}.py"))
               for v in (*variants.HONEST, *variants.CACHED)] if args.honest else []
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
        expected = len(rs) if name == "reference" else None if name in (*variants.BY_EFFECT, *variants.HONEST,
                                                                         *variants.CACHED) else 0
        ok &= expected is None or passes == expected
        if name in variants.HONEST or name == "reference":
            ok &= not any(x["flags"] for x in rs)  # an honest conversion is never flagged
        if name in variants.CACHED:
            ok &= all(honest.CACHED_HELD_BY in x["flags"] for x in rs)
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
    """The grading verbs and the instructor's verbs."""
    _register_grading(sub)
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


def _register_instructor(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="grade the reference and the broken variants; print pass counts")
    p.add_argument("--profile", choices=["cpu", "gpu", "quick"], default="cpu")
    p.add_argument("--reference", type=int, default=10, help="gradings of the reference (default 10)")
    p.add_argument("--broken", type=int, default=3, help="gradings of each broken variant (default 3)")
    p.add_argument("--only", nargs="*", default=None, help="grade only these broken variants")
    p.add_argument("--honest", action="store_true",
                   help="also grade every honest variant (none may raise a review flag) and the caching one")
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
