"""The first stage of a grading: what every run of it needs, made ready before anything runs.

:func:`machine_measurements` (the devices the profile grades on), :func:`prepare_data` (the
training set, the grader's own held-out set, the baseline's set), :func:`sandbox_rules` (what a
run may read and must not see), :func:`horovod_unavailable` (Horovod works where submissions
run, else no verdict at all) and :func:`prepare` (all of it, and the submission's scratch copy).
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multigpu.core import data, devices, layout
from multigpu.grading import averaging, reads, rules, workprobe
from multigpu.grading import sandbox as sb
from multigpu.grading.result import HorovodUnavailable
from multigpu.grading.rules import Settings
from multigpu.running import launch

HERE = Path(__file__).resolve().parent
REPO = layout.course_root()
#: The unmodified single-device script learners convert (released as ``assessments/train.py``).
STARTER = HERE / "starter.py"
#: The instructor's converted solution (never released).
REFERENCE = layout.reference_solution(REPO)

Log = Callable[[str], None]


def holdout_seed() -> int:
    """A fresh secret seed for one grading's held-out set (:data:`rules.HOLDOUT_SEED_BITS` random
    bits from the operating system): no source a learner can read names it, so no submission can
    generate the images it will be judged on."""
    return secrets.randbits(rules.HOLDOUT_SEED_BITS)


def make_holdout(private: Path, settings: Settings, seed: int, progress: bool = False) -> Path:
    """The grader's held-out set in its ``private`` folder: ``settings.holdout_per_class`` images per
    class of the course's classes, drawn from ``seed`` (``<private>/holdout/val``)."""
    return data.ensure_dataset(private / "holdout", train_per_class=0, val_per_class=settings.holdout_per_class,
                               seed=seed, progress=progress)


def prepare_data(settings: Settings, private: Path, seed: int, progress: bool = False) -> tuple[Path, Path, Path]:
    """``(training set, held-out set, baseline set)`` for ``settings``.

    The training set is generated once and cached (the sandbox shows it read-only); so is the
    smaller set the baseline measures its images/s on (the same images, fewer of them: the
    speed per image is what counts). The held-out set is generated afresh in ``private``, the
    grader's own folder that no submission sees or writes (a few seconds), from the grading's
    secret ``seed`` (:func:`holdout_seed`; a regrade passes the recorded one): no earlier
    submission can have changed it, and no submission can make it.
    """
    train = data.ensure_dataset(train_per_class=settings.train_per_class, val_per_class=settings.val_per_class,
                                progress=progress)
    baseline = train
    if settings.baseline_per_class and settings.baseline_per_class != settings.train_per_class:
        baseline = data.ensure_dataset(train_per_class=settings.baseline_per_class, val_per_class=settings.val_per_class,
                                       progress=progress)
    holdout = make_holdout(private, settings, seed, progress)
    for shared in {train, baseline}:  # read in the sandbox by its account (a cache made 700 earlier: opened)
        if shared.stat().st_uid == os.geteuid():
            shared.chmod(shared.stat().st_mode | 0o055)
    return train, holdout, baseline


def sandbox_rules(train_root: Path, extra_hidden: Sequence[os.PathLike | str] = (),
                  readable: Sequence[os.PathLike | str] = ()) -> dict[str, Sequence[str | os.PathLike]]:
    """What a grading run may read and what it must not see (see :mod:`multigpu.grading.sandbox`):
    the training set readable; the course key's folder, the data cache (the grader's held-out set
    is elsewhere, in its private folder under the hidden /tmp), every ``grading/`` folder
    (gradebook, submissions) of the course and of the current folder hidden."""
    hidden = [rules.course_key_path().parent, data.data_home(), REPO / layout.GRADING,
              Path.cwd() / layout.GRADING, *extra_hidden]
    return {"readable": [train_root, *readable], "hidden": [h for h in hidden if Path(h).exists()]}


def mode_env(settings: Settings) -> dict[str, str]:
    """The cpu and quick profiles grade CPU workers, on a GPU machine too (the same devices for
    the baselines and every submission)."""
    return {} if settings.profile == "gpu" else {devices.FORCE_CPU: "1"}


#: Sandboxed or not, where Horovod was found working in this process (a working build stays
#: working; the folders a grading hides besides HOME and /tmp never hold the venv).
HOROVOD_CHECKED: set[bool] = set()
#: What the check runs where submissions run: Horovod's PyTorch extension and the controllers it has.
_HOROVOD_PROBE = ("import horovod.torch as hvd; "
                  "print('controllers:', 'mpi' * hvd.mpi_built(), 'gloo' * hvd.gloo_built())")


def horovod_unavailable(sandbox_rules_: dict | None) -> str | None:
    """None when Horovod's PyTorch extension loads where submissions run (inside the sandbox with
    ``sandbox_rules_``, else plainly) with the controller the grader launches them with
    (:func:`launch.horovod_controller`, decided outside the sandbox); otherwise why not, for the
    operator. An extension that loads MPI from a folder the sandbox hides passes outside and fails
    inside (seen: a cached wheel that kept its building clone's library path): every submission
    would then fail through no fault of its own."""
    sandboxed = sandbox_rules_ is not None
    if sandboxed in HOROVOD_CHECKED:
        return None
    controller = launch.horovod_controller()
    argv = [sys.executable, "-c", _HOROVOD_PROBE]
    where = "inside the grading sandbox" if sandboxed else "on this machine"
    if sandbox_rules_ is not None:  # as sandbox.unavailable probes: nothing to write, so no work folder
        argv = sb.command(argv, workdir=Path("/"), writable=False, readable=sandbox_rules_.get("readable", ()),
                          hidden=sandbox_rules_.get("hidden", ()))
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/",
                             env=sb.environment() if sandboxed else None)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"Horovod's check did not run {where}: {e}"
    found = re.search(r"^controllers:(.*)$", out.stdout, re.M)
    if out.returncode == 0 and found and controller in found.group(1).split():
        HOROVOD_CHECKED.add(sandboxed)
        return None
    why = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1] if out.returncode else \
        f"it was built without {controller.upper()}, which the grader launches with"
    return (f"Horovod's PyTorch extension does not work {where} ({why}): rerun tools/install_horovod.sh "
            "(make setup) and check that the extension loads its libraries from the venv "
            "(ldd .venv/lib/python3.11/site-packages/horovod/torch/mpi_lib_v2*.so)")


def machine_measurements(settings: Settings, unsandboxed: str, log: Log) -> dict[str, Any]:
    """The grading's first measurements: the workers and the devices the profile grades on (the
    cpu and quick profiles grade CPU workers, on a GPU machine too), and why the runs are not
    sandboxed (``unsandboxed``, "" when they are). The gpu profile needs a GPU per worker."""
    info = devices.detect()
    if settings.profile == "gpu" and info.gpus < settings.workers:
        raise ValueError(f"the gpu profile grades {settings.workers} workers, one per GPU; this machine has "
                         f"{info.gpus} GPU(s): grade with --profile cpu (CPU workers)")
    if settings.profile != "gpu":
        info = devices.as_cpu(info)  # CPU workers (the env of every run says so: mode_env)
    measurements: dict[str, Any] = {
        "workers": settings.workers, "mode": info.mode, "ideal_factor": devices.ideal_factor(settings.workers, info),
        "hardware": f"{info.mode.upper()} mode, {info.cores} cores" + (f", {info.gpus} GPUs" if info.gpus else ""),
    }
    if unsandboxed:
        measurements["sandbox"] = unsandboxed
        log(f"NOT SANDBOXED: {unsandboxed}")
    return measurements


@dataclass(frozen=True)
class Prepared:
    """The folders and rules of one grading, ready before anything of the submission runs."""

    work: Path
    #: the training set the submission reads: this grading's private view of the cached set
    #: (:func:`reads.private_view`), watched by the grader while the submission runs
    train_root: Path
    holdout: Path
    baseline_root: Path
    #: the sandbox's rules (:func:`sandbox_rules`); None: the runs are not sandboxed
    sandbox: dict[str, Sequence[str | os.PathLike]] | None
    #: the submission's folder: its scratch copy ``train.py``, its checkpoints, Horovod's timeline
    submission: Path
    checkpoints: Path
    timeline: Path
    #: the held-out set's secret seed: never in the sandbox, never in a result (its hash is)
    holdout_seed: int
    #: the folder of the work probe's sitecustomize (readable in the sandbox) and of its records
    #: (in the submission's folder, under a name drawn for this grading)
    work_probe: Path
    work_records: Path


def prepare(settings: Settings, work: Path, raw: bytes, unsandboxed: str, hidden: Sequence[os.PathLike | str],
            log: Log, seed: int | None = None) -> Prepared:
    """Data, sandbox rules and Horovod's check for a grading in the folder ``work``, and the
    submission's bytes ``raw`` written to its scratch copy (the script runs from a copy of what
    was hashed). The held-out set comes from ``seed``, a fresh secret one by default
    (:func:`holdout_seed`). Raises :class:`HorovodUnavailable` where Horovod does not work."""
    private = work / "grader"  # the held-out set: never bound into a sandbox
    log("preparing the data (the training set and the grader's own held-out set)")
    seed = holdout_seed() if seed is None else seed
    cached, holdout, baseline_root = prepare_data(settings, private, seed)
    train_root = reads.private_view(cached, work / "data" / cached.name)
    probe = workprobe.sitecustomize(work / "probe")
    rules_ = None if unsandboxed else sandbox_rules(train_root, [private, *hidden], [baseline_root, probe])
    broken = horovod_unavailable(rules_)
    if broken:
        raise HorovodUnavailable(f"cannot grade: {broken}. No submission was graded.")
    submission = work / "submission"
    submission.mkdir()
    (submission / "train.py").write_bytes(raw)
    records = submission / f"work-{secrets.token_hex(8)}"
    records.mkdir()
    return Prepared(work, train_root, holdout, baseline_root, rules_, submission, submission / "checkpoints",
                    averaging.timeline_file(submission), seed, probe, records)
