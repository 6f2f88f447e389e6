"""The assessment grader: runs a submission itself and judges it on facts it measures.

    result = grade("assessments/train.py", rules.settings())
    print(result.report())

A grading is a pipeline (nothing the script prints or writes as a metric is trusted):

1. **check**: the file exists and compiles (:func:`hints.check_source`; otherwise every
   criterion fails and nothing runs).
2. **prepare** (:mod:`~multigpu.grading.preparation`): the devices the profile grades on, the
   training set the script gets (``$MULTIGPU_ASSESSMENT_DATA``), a held-out set generated with
   the grader's own seed in its private folder, the sandbox's rules, Horovod's check where the
   runs will run (:class:`HorovodUnavailable` and no verdict otherwise: every submission would
   fail through no fault of its own), the submission's scratch copy.
3. **baselines and run** (:mod:`~multigpu.grading.baselines`, :mod:`~multigpu.grading.runs`):
   the unmodified starter on one worker with ONE thread, the submission with ``horovodrun -np
   N`` under the time budget, the baseline again (interleaved, so a slow minute hits both),
   each with :func:`runner.run_untrusted` inside the sandbox (:mod:`multigpu.grading.sandbox`):
   bounded in time, output and memory, no process left behind, checkpoint arrival timed by the
   grader's clock.
4. **evidence** (:func:`evidence.collect`): one record of the run, its checkpoints loaded with
   ``weights_only=True`` (:mod:`~multigpu.grading.checkpoints`), Horovod's timeline read for
   rounds of gradient all-reduces that ended while the run trained
   (:mod:`~multigpu.grading.averaging`), the baselines.
5. **criteria** (:mod:`multigpu.grading.criteria`, in the order of ``CRITERIA``): workers,
   identical, sharded, accuracy, throughput; each gets its points or zero, with a message that
   says what failed and what to do.
6. **review** (:mod:`multigpu.grading.review`): the source's review flags, and the flags of
   what the grader saw from outside the run (:mod:`multigpu.grading.observations`: samples
   served from memory, connections Horovod did not open); a flagged pass is held for a person. The result records the source's SHA-256 and the grader's version
   (:mod:`multigpu.grading.audit`).

This module keeps the names callers use; the stages live in the modules named above.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from multigpu.grading import audit, observations, reuse, review, rules
from multigpu.grading import sandbox as sb
from multigpu.grading.averaging import (
    RunClock,
    gradient_allreduce_rounds,
    horovod_averaging,
    timeline_file,
    timeline_start,
)
from multigpu.grading.baselines import agreeing_baselines, baseline, run_with_baselines
from multigpu.grading.checkpoints import (
    IDENTICAL_TOL,
    find_checkpoints,
    images_per_epoch,
    load_checkpoint,
    state_difference,
    weights_only,
)
from multigpu.grading.criteria import CRITERIA, POINTS, judge_all
from multigpu.grading.evidence import Evidence, collect
from multigpu.grading.hints import check_source, learning_rate_hints
from multigpu.grading.preparation import (
    REFERENCE,
    STARTER,
    Log,
    horovod_unavailable,
    machine_measurements,
    prepare,
    sandbox_rules,
)
from multigpu.grading.result import (
    Criterion,
    GradeResult,
    GradingUnavailable,
    HorovodUnavailable,
    SandboxUnavailable,
    save_result,
)
from multigpu.grading.rules import RESULT_FILE, Settings
from multigpu.grading.runner import RunRecord
from multigpu.grading.runs import lone_rank0, run_failure, run_throughput

__all__ = [
    "CRITERIA", "IDENTICAL_TOL", "POINTS", "REFERENCE", "RESULT_FILE", "STARTER", "Criterion", "GradeResult",
    "GradingUnavailable", "HorovodUnavailable", "Log", "RunClock", "SandboxUnavailable", "Settings",
    "agreeing_baselines", "all_fail", "baseline", "check_source", "collect", "deferred", "find_checkpoints",
    "grade", "gradient_allreduce_rounds", "horovod_averaging", "horovod_unavailable", "images_per_epoch", "judge",
    "learning_rate_hints", "load_checkpoint", "lone_rank0", "run_failure", "run_throughput", "sandbox_rules",
    "save_result", "state_difference", "timeline_file", "timeline_start", "weights_only",
]


def all_fail(script: str, settings: Settings, message: str, *, sandboxed: bool = True,
             **identity: Any) -> GradeResult:
    """Every criterion failed with ``message`` (by default: nothing of the submission ran, so
    nothing escaped a sandbox); ``identity``: :func:`audit.identity` of the source."""
    return GradeResult(script, settings, {n: Criterion(n, p, False, message) for n, p in POINTS.items()},
                       {}, sandboxed=sandboxed, **identity)


def deferred(settings: Settings, message: str) -> GradeResult:
    """A result that grades nothing: the official grading decides (no points here)."""
    return all_fail("train.py", settings, message, sandboxed=False)


def grade(
    script: str | os.PathLike,
    settings: Settings | None = None,
    *,
    args: Sequence[str] = (),
    echo: bool = False,
    log: Log | None = None,
    workdir: str | os.PathLike | None = None,
    sandbox: str = "auto",
    hidden: Sequence[os.PathLike | str] = (),
    reuse_earlier: bool = True,
    holdout_seed: int | None = None,
) -> GradeResult:
    """Grade ``script`` under ``settings`` (default :func:`rules.settings`); see the module doc.

    ``args`` are extra command-line arguments for the submission (tests only: the official
    grading runs the script's defaults). ``echo`` streams the run's output live.
    ``sandbox``: ``"auto"`` (the sandbox where it starts, else an unsandboxed verdict that says
    so), ``"required"`` (raise :class:`SandboxUnavailable` instead: certificates) or ``"off"``.
    ``hidden``: more folders the submission must not see (other submissions, results).
    ``reuse_earlier``: a learner's own check (``sandbox`` not "required", nothing ``hidden``, no
    ``holdout_seed``) takes the session's earlier grading of the same bytes where
    :mod:`multigpu.grading.reuse` keeps them.
    ``holdout_seed``: the held-out set's seed (a regrade's recorded one); by default a fresh secret
    one, returned in the result's ``holdout_seed`` and never saved with it.
    """
    settings = settings or rules.settings()
    log = log or (lambda _msg: None)
    script_path = Path(script).resolve()
    name = str(script)
    unsandboxed = (sb.unavailable() or "") if sandbox != "off" else "sandbox turned off"
    if unsandboxed and sandbox == "required":
        raise SandboxUnavailable(f"cannot grade for a certificate: {unsandboxed}")
    problem = check_source(script_path)
    if problem:
        return all_fail(name, settings, problem, **(audit.identity(script_path.read_bytes())
                                                    if script_path.is_file() else {}))
    raw = script_path.read_bytes()  # graded, hashed and kept: the same bytes
    if reuse_earlier and sandbox != "required" and not hidden and holdout_seed is None:
        earlier = reuse.earlier(raw, settings, args, sandboxed=not unsandboxed)
        if earlier is not None:
            log(f"(the grading of these same bytes earlier in this session, reused: {reuse.ENV})")
            return dataclasses.replace(earlier, script=name)
    measurements = machine_measurements(settings, unsandboxed, log)
    with tempfile.TemporaryDirectory(prefix="multigpu-grade-", dir=workdir) as tmp:
        prepared = prepare(settings, Path(tmp).resolve(), raw, unsandboxed, hidden, log, holdout_seed)
        rec, baselines = run_with_baselines(prepared, settings, script_path.name, args, echo, log)
        measurements["run_s"] = round(rec.wall_s, 2)
        measurements["baselines"] = [round(b, 2) for b in baselines if b]
        source = raw.decode("utf-8", errors="replace")
        criteria, evidence = judged(rec, find_checkpoints(prepared.checkpoints), settings, prepared.train_root,
                                    prepared.holdout, measurements, log, source, timeline_path=prepared.timeline)
    result = GradeResult(name, settings, criteria, measurements, sandboxed=rec.sandboxed, **audit.identity(raw),
                         holdout_seed=prepared.holdout_seed,
                         holdout_seed_sha256=audit.seed_digest(prepared.holdout_seed))
    result.review = review.record([*review.flags(source), *observations.flags(evidence.observed)], result.passed)
    reuse.keep(result, raw, settings, args)
    return result


def judge(rec: RunRecord, found: Mapping[tuple[int, int], Path], settings: Settings, train_root: Path,
          holdout: Path, m: dict[str, Any], log: Log, source: str = "",
          timeline_path: Path | None = None) -> dict[str, Criterion]:
    """The verdicts of a run, criterion by criterion: the evidence collected
    (:func:`evidence.collect`, from the checkpoints ``found`` and the measurements ``m`` so far),
    then judged by :data:`CRITERIA`; the figures the criteria measured are added to ``m``.
    ``timeline_path``: the Horovod timeline the run was told to write (None: none was recorded,
    and the gradients do not count as averaged by Horovod)."""
    return judged(rec, found, settings, train_root, holdout, m, log, source, timeline_path)[0]


def judged(rec: RunRecord, found: Mapping[tuple[int, int], Path], settings: Settings, train_root: Path,
           holdout: Path, m: dict[str, Any], log: Log, source: str = "",
           timeline_path: Path | None = None) -> tuple[dict[str, Criterion], Evidence]:
    """:func:`judge`, and the evidence it judged (what the grader saw from outside the run is added
    to ``m`` too)."""
    evidence = collect(rec, found, settings, train_root, holdout, m, log, source, timeline_path)
    verdicts = judge_all(evidence, settings)
    for c in verdicts.values():
        m.update(c.measured)
    if evidence.observed is not None:
        m.update(evidence.observed.figures())
    return verdicts, evidence
