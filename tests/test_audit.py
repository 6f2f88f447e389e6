"""The audit trail: what a regrade's verdict says. The regrade of a real official grading of the
reference (its kept source, hash, grader version, profile and measurements) runs in
tests/test_nbgrader.py, on the official grading the nbgrader round trip has made already.
"""

from __future__ import annotations

from multigpu.grading import grader, regrade, rules

SETTINGS = rules.QUICK.replace(workers=2)


def test_a_regrade_that_differs_only_by_a_noisy_machine_is_no_verdict():
    from multigpu.grading.grader import Criterion, GradeResult

    def result(throughput: bool, noisy: bool) -> GradeResult:
        criteria = {n: Criterion(n, p, n != "throughput" or throughput, "") for n, p in grader.POINTS.items()}
        return GradeResult("train.py", SETTINGS, criteria, {"noisy": True} if noisy else {})

    stored = result(True, False).to_dict()
    differs = ["passed: True then False", "criterion throughput: pass then fail"]
    noisy = regrade.Regrade(stored, result(False, True), differs)
    assert not noisy.holds and noisy.noisy and "NOT REPRODUCED" in noisy.report()
    slow = regrade.Regrade(stored, result(False, False), differs)  # measured, and too slow: the verdict changed
    assert not slow.noisy and "DOES NOT HOLD" in slow.report()
    other = regrade.Regrade(stored, result(True, True), ["criterion sharded: pass then fail"])
    assert not other.noisy and "DOES NOT HOLD" in other.report()
