"""The assessment grader: runs a submission itself and judges it on facts it measures.

    result = grade("assessments/train.py", rules.settings())
    print(result.report())

What it does, in order (nothing the script prints or writes as a metric is trusted):

1. :func:`check_source`: the file exists and compiles (otherwise: zero, nothing runs).
2. Prepares the data: the training set the script gets (``$MULTIGPU_ASSESSMENT_DATA``) and a
   held-out set generated with the grader's own seed (:data:`rules.HOLDOUT_SEED`); checks that
   Horovod loads where the runs will run (:func:`horovod_unavailable`; otherwise
   :class:`HorovodUnavailable` and no verdict: every submission would fail through no fault of
   its own).
3. Runs the unmodified starter on one worker with ONE thread (the baseline: one core's share,
   the same ideal Lab 3 and ``make bench`` use), the submission with ``horovodrun -np 4`` under
   the time budget, and the baseline again (interleaved, so a slow minute hits both), each with
   :func:`runner.run_untrusted` inside the sandbox (:mod:`multigpu.grading.sandbox`): bounded in
   time, output and memory, no process left behind, checkpoint arrival timed by the grader's
   clock.
4. Loads every ``rank-<R>-epoch-<E>.pt`` with ``weights_only=True`` (no code from a
   submission runs in the grader) and checks: every rank saved every epoch; weights identical
   across ranks AND gradients averaged by Horovod (the timeline Horovod's rank 0 wrote where the
   grader's ``HOROVOD_TIMELINE`` said, under a name drawn for this grading, must show about one
   complete round of gradient all-reduces per step in Horovod's format, started inside the run
   and ended before its last checkpoints by the grader's clock: :func:`horovod_averaging`);
   disjoint shards that cover the training set, no rank listing an index twice (counted only
   when the gradients were averaged); its own held-out accuracy of the weights, on a held-out
   set generated afresh in the grader's private folder; throughput from the checkpoints'
   arrival times and the DISTINCT indices of each epoch against the baseline (re-measured, or
   "too noisy" instead of a verdict, when the baselines disagree; above
   :data:`rules.MAX_TRUSTED_EFFICIENCY` x ideal a measurement it does not trust, never a pass).
5. Reads the source for what no check inside the run can prove (:mod:`multigpu.grading.review`):
   a flagged pass is held for a person's review. The result records the source's SHA-256 and
   the grader's version (:mod:`multigpu.grading.audit`).

Each criterion gets its points or zero, with a message that says what failed and what to do.
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
import re
import secrets
import shutil
import statistics
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from multigpu.core import data, devices, layout, models, training
from multigpu.grading import audit, review, rules, runner
from multigpu.grading.rules import RESULT_FILE, Settings
from multigpu.running import timeline

HERE = Path(__file__).resolve().parent
REPO = layout.course_root()
#: The unmodified single-device script learners convert (released as ``assessments/train.py``).
STARTER = HERE / "starter.py"
#: The instructor's converted solution (never released).
REFERENCE = layout.reference_solution(REPO)

#: Criterion -> points. A submission passes with all of them.
POINTS: dict[str, int] = {"workers": 2, "identical": 2, "sharded": 2, "accuracy": 3, "throughput": 1}
#: Largest difference between two ranks' weights that still counts as identical.
IDENTICAL_TOL = 1e-6
#: Largest checkpoint file the grader reads (bytes): AlexNet's weights are 0.25 GB, AlexNetSmall's 0.09.
MAX_CHECKPOINT_BYTES = 2**30
#: Threads of the baseline worker: one core's share, the ideal's unit everywhere in the course.
BASELINE_THREADS = 1

Log = Callable[[str], None]


@dataclass
class Criterion:
    name: str
    points: int
    passed: bool
    message: str

    @property
    def earned(self) -> int:
        return self.points if self.passed else 0


@dataclass
class GradeResult:
    """A grading: per-criterion verdicts, the measurements behind them and the settings used."""

    script: str
    settings: Settings
    criteria: dict[str, Criterion]
    measurements: dict[str, Any] = field(default_factory=dict)
    #: ran inside the sandbox (a certificate needs it)
    sandboxed: bool = False
    #: SHA-256 of the graded source's bytes ("" when there was none)
    source_sha256: str = ""
    #: the grader that gave the verdict: :func:`audit.grader_version`
    grader_version: str = ""
    #: what a person must look at before a pass is certified: :func:`review.record`
    review: dict[str, Any] = field(default_factory=lambda: review.record([], False))
    #: the kept copy of the graded source, next to the saved result (official results: :func:`audit.keep_source`)
    source_file: str = ""

    @property
    def score(self) -> int:
        return sum(c.earned for c in self.criteria.values())

    @property
    def max_score(self) -> int:
        return sum(c.points for c in self.criteria.values())

    @property
    def passed(self) -> bool:
        """Every criterion passed (a pass held for review is still a pass, not yet certified)."""
        return self.score == self.max_score

    @property
    def held(self) -> bool:
        """A pass held for review until a person approves it: see :mod:`multigpu.grading.review`."""
        return review.awaits_decision(self.review)

    def ok(self, name: str) -> bool:
        return self.criteria[name].passed

    def message(self, name: str) -> str:
        c = self.criteria[name]
        return f"{'PASS' if c.passed else 'FAIL'} {name} ({c.earned}/{c.points}): {c.message}"

    def report(self) -> str:
        m = self.measurements
        lines = [f"Grading of {self.script} (profile '{self.settings.profile}'): "
                 f"{self.score}/{self.max_score} points, {'PASSED' if self.passed else 'NOT PASSED'}"]
        if not self.sandboxed:
            lines.append(f"  NOT SANDBOXED: {self.measurements.get('sandbox', 'the run was not sandboxed')} "
                         "(the verdict is yours to see; a certificate needs a sandboxed grading)")
        lines += ["  " + self.message(name) for name in self.criteria]
        if self.review["flags"]:
            lines.append(("  HELD FOR REVIEW (no certificate until the instructor approves it): " if self.review["held"]
                          else "  review flags (a pass would be held for review): ")
                         + review.summary(self.review["flags"]))
        facts = [f"{k} {m[k]:.3f}" if isinstance(m.get(k), float) else f"{k} {m[k]}"
                 for k in ("accuracy_held", "throughput", "ideal", "efficiency", "run_s") if m.get(k) is not None]
        if facts:
            lines.append("  measured: " + ", ".join(facts))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "script": self.script,
            "passed": self.passed,
            "sandboxed": self.sandboxed,
            "score": self.score,
            "max_score": self.max_score,
            "settings": self.settings.to_dict(),
            "criteria": {n: {"points": c.points, "passed": c.passed, "message": c.message}
                         for n, c in self.criteria.items()},
            "measurements": self.measurements,
            "source_sha256": self.source_sha256,
            "grader_version": self.grader_version,
            "review": self.review,
            "source_file": self.source_file,
        }


def save_result(result: GradeResult, path: str | os.PathLike = RESULT_FILE) -> Path:
    """Write ``result`` as JSON (``grading-result.json`` next to the notebook by default)."""
    path = Path(path)
    path.write_text(json.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n")
    return path


def _all_fail(script: str, settings: Settings, message: str, *, sandboxed: bool = True,
              **identity: Any) -> GradeResult:
    """Every criterion failed with ``message`` (by default: nothing of the submission ran, so
    nothing escaped a sandbox); ``identity``: :func:`audit.identity` of the source."""
    return GradeResult(script, settings, {n: Criterion(n, p, False, message) for n, p in POINTS.items()},
                       {}, sandboxed=sandboxed, **identity)


def deferred(settings: Settings, message: str) -> GradeResult:
    """A result that grades nothing: the official grading decides (no points here)."""
    return _all_fail("train.py", settings, message, sandboxed=False)


# ----------------------------------------------------------------------------- reading a submission


def check_source(path: str | os.PathLike) -> str | None:
    """None when ``path`` exists and compiles; otherwise what is wrong (nothing is run)."""
    path = Path(path)
    if not path.is_file():
        return f"no submission: {path} does not exist (save your converted script as train.py next to the notebook)"
    try:
        compile(path.read_bytes(), str(path), "exec")
    except SyntaxError as e:
        return f"{path.name} does not compile: {e.msg} at line {e.lineno}: {(e.text or '').strip()}"
    except ValueError as e:  # e.g. NUL bytes
        return f"{path.name} does not compile: {e}"
    return None


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint of the contract, ``{"model": {name: tensor}, "indices": [int, ...]}``, loaded
    with ``weights_only=True``: tensors and plain containers only, no code from the submission."""
    try:  # a regular file of bounded size first: a FIFO or a symlink named like a checkpoint would hang or mislead
        raw = torch.load(io.BytesIO(timeline.read_regular_file(path, MAX_CHECKPOINT_BYTES)), map_location="cpu",
                         weights_only=True)
    except Exception as e:  # an unpicklable object, a truncated file, not a torch file at all
        raise ValueError(f"{Path(path).name} cannot be loaded as plain weights: {str(e).splitlines()[0][:200]}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("model"), dict) or "indices" not in raw:
        raise ValueError(f"{Path(path).name} does not follow the contract: save it with save_checkpoint() "
                         "(a dict with 'model' = state_dict and 'indices' = the samples trained on)")
    if not all(isinstance(v, torch.Tensor) for v in raw["model"].values()):
        raise ValueError(f"{Path(path).name} does not follow the contract: 'model' must hold tensors only")
    indices = raw["indices"]
    indices = indices.tolist() if isinstance(indices, torch.Tensor) else list(indices)
    if not all(isinstance(i, int) for i in indices):
        raise ValueError(f"{Path(path).name} does not follow the contract: 'indices' must be integers")
    return {"model": raw["model"], "indices": indices}


def state_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, str]:
    """The largest absolute difference between two state dicts and the tensor where it is
    (``(0.0, "")`` when identical; ``inf`` when names or shapes differ)."""
    worst, where = 0.0, ""
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b or a[name].shape != b[name].shape:
            return math.inf, name
        x, y = a[name], b[name]
        if not x.is_floating_point():
            d = 0.0 if torch.equal(x, y) else math.inf
        else:
            d = float((x.double() - y.double()).abs().max()) if x.numel() else 0.0
        if d > worst:
            worst, where = d, name
    return worst, where


def weights_only(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The trainable weights of a state dict, without buffers.

    BatchNorm's running statistics are buffers each rank computes from its own shard (Horovod
    averages gradients, not buffers), so they differ between correct ranks; the weights must not.
    A state dict that fits none of the course's models is returned whole.
    """
    for name in models.MODELS:
        weights, buffers = _state_names(name)
        if set(state) == weights | buffers:
            return {k: v for k, v in state.items() if k in weights}
    return state


@functools.lru_cache(maxsize=None)
def _state_names(model_name: str) -> tuple[frozenset[str], frozenset[str]]:
    """Names of the parameters and of the buffers of a course model (they do not depend on classes)."""
    model = models.build_model(model_name, num_classes=2)
    return frozenset(n for n, _ in model.named_parameters()), frozenset(n for n, _ in model.named_buffers())


def run_throughput(record: runner.RunRecord, images: dict[int, int]) -> float | None:
    """Aggregate images/s of a run from the moments its checkpoints appeared (the grader's clock).

    Epoch 1 is warm-up (start-up, data loading, first steps) and not counted. The time of
    epochs 2..n is at least half their share of the run up to the last checkpoint, so a script
    that saves every checkpoint in one burst at the end gains at most a factor of two.
    None when fewer than two epochs completed.
    """
    epochs = sorted(e for e in record.epoch_times if e in images)
    if len(epochs) < 2 or epochs[0] != 1:
        return None
    last = epochs[-1]
    counted = sum(images[e] for e in epochs[1:])
    t_last = record.epoch_times[last]
    elapsed = max(t_last - record.epoch_times[1], 0.5 * t_last * (len(epochs) - 1) / len(epochs))
    return counted / elapsed if elapsed > 0 else None




def timeline_file(folder: Path) -> Path:
    """Where the submission's run is told to write Horovod's timeline (``HOROVOD_TIMELINE``;
    Horovod's coordinator, rank 0, writes it from hvd.init() on): in its writable folder, under a
    name drawn afresh for every grading, so no script can name the file in advance."""
    return folder / f"horovod-timeline-{secrets.token_hex(8)}.json"


_SHAPE = re.compile(r"\[\s*(\d+(?:\s*,\s*\d+)*)?\s*\]")


def _timeline_shape(text: Any) -> tuple[int, ...] | None:
    """``"[10, 2048]"`` (a tensor shape as Horovod's timeline writes it) -> ``(10, 2048)``."""
    m = _SHAPE.fullmatch(text) if isinstance(text, str) and len(text) < 200 else None
    return None if m is None else tuple(int(x) for x in (m.group(1) or "").replace(" ", "").split(",") if x)


def gradient_round_ends(events: Sequence[Any], weights: dict[str, torch.Tensor]) -> tuple[list[float], int]:
    """When each complete round of the model's gradient all-reduces ended in a Horovod timeline's
    events (``ts``: microseconds after the timeline's start, ``inf`` where an event has none), and
    how many all-reduces of the gradients' shapes completed.

    An all-reduce counts when it completed in Horovod's format: on a tensor whose name starts with
    ``allreduce.`` (``hvd.DistributedOptimizer`` names them ``allreduce.<parameter>`` or
    ``allreduce.allreduce.noname.<group>.<i>``), a top-level ``ALLREDUCE`` phase that contains the
    library's own phase (``MPI_ALLREDUCE``, ``GLOO_ALLREDUCE``, ``NCCL_ALLREDUCE``, ...) and whose
    end event carries the result's shape (``{"ph": "E", "args": {"dtype": ..., "shape": "[10, 2048]"}}``).
    A round is one all-reduce of EVERY trainable tensor of ``weights``, matched by shape, so names
    do not matter; it ends with the last of them. Anything malformed is skipped.
    """
    wanted = Counter(tuple(t.shape) for t in weights.values() if t.is_floating_point())
    if not wanted:
        return [], 0
    names = timeline.tensor_names(events)
    ends: dict[tuple[int, ...], list[float]] = {s: [] for s in wanted}
    for pid, ts, args in _completed_allreduces(events, names):
        shape = _timeline_shape(args.get("shape"))
        if shape is not None and shape in wanted:
            ends[shape].append(float(ts) if isinstance(ts, (int, float)) and math.isfinite(ts) else math.inf)
    rounds = min(len(ends[s]) // k for s, k in wanted.items())
    for times in ends.values():
        times.sort()
    round_ends = [max(ends[s][(j + 1) * k - 1] for s, k in wanted.items()) for j in range(rounds)]
    return round_ends, sum(len(v) for v in ends.values())


#: The library's part of a collective in Horovod's timeline (MPI_ALLREDUCE, GLOO_ALLREDUCE, NCCL_ALLREDUCE, ...).
_LIBRARY_PHASE = re.compile(r"^[A-Z0-9]+_(ALLREDUCE|REDUCESCATTER|ALLGATHER)$")


def _completed_allreduces(events: Sequence[Any], names: dict[int, str]) -> list[tuple[int, Any, dict]]:
    """``(pid, ts, args)`` of each all-reduce of an ``allreduce.*`` tensor that completed in
    Horovod's format (see :func:`gradient_round_ends`): begin/end events paired per tensor."""
    stacks: dict[int, list[list]] = {}  # pid -> open phases: [name, saw the library's phase]
    done = []
    for e in events:
        if not isinstance(e, dict) or not isinstance(e.get("pid"), int) \
                or not names.get(e["pid"], "").startswith("allreduce."):
            continue
        stack = stacks.setdefault(e["pid"], [])
        if e.get("ph") == "B" and isinstance(e.get("name"), str):
            if stack and _LIBRARY_PHASE.match(e["name"]):
                stack[0][1] = True
            stack.append([e["name"], False])
        elif e.get("ph") == "E" and stack:
            phase, library = stack.pop()
            if not stack and phase == "ALLREDUCE" and library and isinstance(e.get("args"), dict):
                done.append((e["pid"], e.get("ts"), e["args"]))
    return done


def gradient_allreduce_rounds(events: Sequence[Any], weights: dict[str, torch.Tensor]) -> tuple[int, int]:
    """``(rounds, all-reduces)`` of the model's gradients in a Horovod timeline's events (see
    :func:`gradient_round_ends`)."""
    round_ends, allreduces = gradient_round_ends(events, weights)
    return len(round_ends), allreduces


@dataclass(frozen=True)
class RunClock:
    """The grader's clock of a run: when it started (wall clock, seconds since the epoch), how
    long it ran, and when the checkpoints of its last complete epoch had all appeared (seconds
    after the start)."""

    started_at: float
    wall_s: float
    trained_until: float


#: Slack between the grader's clock and the timeline's (seconds). Both read the same system clock;
#: the grader sees a checkpoint up to one poll (runner.POLL_S) late, more on a loaded machine.
CLOCK_SLACK_S = 2.0


def timeline_start(events: Sequence[Any]) -> float | None:
    """The wall clock (seconds since the epoch) at which Horovod started the timeline: its first
    metadata event, ``{"name": "process_name", "pid": 0, "args": {"start_time_since_epoch_in_micros": ...}}``."""
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M" and e.get("pid") == 0 and isinstance(e.get("args"), dict):
            start = e["args"].get("start_time_since_epoch_in_micros")
            if isinstance(start, int) and not isinstance(start, bool):
                return start / 1e6
    return None


def rounds_while_training(events: Sequence[Any], round_ends: Sequence[float], clock: RunClock) -> tuple[int, str]:
    """How many of the gradient rounds ended while the run trained, by the grader's clock (from
    the run's start to its last complete epoch's checkpoints), and why the timeline's clock
    cannot be the run's ("" when it can). Horovod starts its timeline in ``hvd.init()``, after the
    run started and before it ended; a timeline written afterwards, or with made-up times, does not
    fit the run."""
    start = timeline_start(events)
    if start is None:
        return 0, "it lacks the start time Horovod writes first (start_time_since_epoch_in_micros)"
    offset = start - clock.started_at
    if not -CLOCK_SLACK_S <= offset <= clock.wall_s + CLOCK_SLACK_S:
        return 0, (f"its clock starts {offset:+.1f} s from the start of the run, which lasted "
                   f"{clock.wall_s:.0f} s (the grader's clock)")
    limit = clock.trained_until + CLOCK_SLACK_S
    return sum(1 for t in round_ends if -CLOCK_SLACK_S <= offset + t / 1e6 <= limit), ""


def horovod_averaging(path: Path | None, weights: dict[str, torch.Tensor], samples_per_worker: float, epochs: int,
                      settings: Settings, source: str = "", clock: RunClock | None = None) -> dict[str, Any]:
    """Did Horovod average the gradients? Judged from Horovod's own account of the run: the
    timeline its rank 0 wrote to ``path`` (``HOROVOD_TIMELINE``, set by the grader).

    An epoch needs ``max(settings.min_allreduces_per_epoch, ceil(samples_per_worker /
    rules.MAX_IMAGES_PER_ALLREDUCE))`` complete rounds of gradient all-reduces, on average over
    the ``epochs`` (see :func:`gradient_round_ends` and :mod:`rules`). With the run's ``clock``
    only the rounds that ended while the run trained count, and a timeline whose clock does not
    fit the run is not Horovod's account of it (:func:`rounds_while_training`). A missing,
    oversized or malformed file is a fail with a message. Returns ``{"ok", "message", "measurements"}``.
    """
    convert = ("This assessment certifies a Horovod conversion: call hvd.init() and wrap the optimizer in "
               "hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters()), which all-reduces "
               "every gradient at every step; a torch DDP (torch.distributed) conversion launched under horovodrun "
               "is not accepted")
    if "DistributedDataParallel" in source or "init_process_group" in source:
        convert += " (your script uses torch.distributed: its all-reduces are not Horovod's)"
    tamper = "leave HOROVOD_TIMELINE as the grader sets it and never write Horovod's timeline yourself"
    if path is None or not (path.exists() or path.is_symlink()):
        return {"ok": False, "measurements": {"horovod_timeline_bytes": None}, "message": (
            "the grader found no Horovod gradient all-reduce in the run: Horovod's rank 0 records every collective "
            "in a timeline from hvd.init() on (HOROVOD_TIMELINE, set by the grader), and this run left none. "
            f"{convert}; {tamper}")}
    try:
        size = path.lstat().st_size
        events = timeline.load(path, max_bytes=rules.MAX_TIMELINE_BYTES)
        round_ends, allreduces = gradient_round_ends(events, weights)
    except (ValueError, OSError, RecursionError, MemoryError) as err:
        why = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        why = why.replace(path.name, "the timeline")  # the grader's file name stays its own
        big = (f". A timeline over {rules.MAX_TIMELINE_BYTES // 2**20} MB means a very small per-worker batch: "
               "use a larger one (the reference uses 32)") if "larger than" in why else ""
        return {"ok": False, "measurements": {"horovod_timeline_bytes": None}, "message": (
            f"the Horovod timeline of the run could not be read ({why}), so the grader cannot see "
            f"Horovod average the gradients: {tamper}{big}")}
    rounds, late = len(round_ends), 0
    measured: dict[str, Any] = {"horovod_timeline_bytes": size}
    if clock is not None:
        counted, misfit = rounds_while_training(events, round_ends, clock)
        if misfit:
            measured["horovod_timeline_misfit"] = misfit
            return {"ok": False, "measurements": measured, "message": (
                f"the Horovod timeline of the run does not fit the run: {misfit}. The grader takes only Horovod's own "
                f"account of the run, written from hvd.init() on, as evidence that the gradients were averaged: "
                f"{tamper}. {convert}")}
        rounds, late = counted, rounds - counted
    return _averaging_verdict(rounds, late, allreduces, weights, samples_per_worker, epochs, settings, measured,
                              convert)


def _averaging_verdict(rounds: int, late: int, allreduces: int, weights: dict[str, torch.Tensor],
                       samples_per_worker: float, epochs: int, settings: Settings, measured: dict[str, Any],
                       convert: str) -> dict[str, Any]:
    """:func:`horovod_averaging`'s verdict on the gradient rounds counted in the timeline."""
    need = max(settings.min_allreduces_per_epoch, math.ceil(samples_per_worker / rules.MAX_IMAGES_PER_ALLREDUCE))
    per_epoch = rounds / max(epochs, 1)
    tensors = sum(1 for t in weights.values() if t.is_floating_point())
    measured["horovod_gradient_rounds_per_epoch"] = round(per_epoch, 1)
    after = (f" ({late} more ended after the last epoch's checkpoints, when the run no longer trained, and do not "
             "count)") if late else ""
    if per_epoch >= need:
        return {"ok": True, "measurements": measured, "message": (
            f"Horovod's timeline shows {rounds} complete rounds of gradient all-reduces (all {tensors} trainable "
            f"tensors), {per_epoch:.0f} per epoch, about {samples_per_worker / max(per_epoch, 1):.0f} images per "
            f"worker between two rounds{after}")}
    if rounds == 0:
        if late:
            seen = "no complete round of the model's gradients while the run trained" + after
        elif allreduces:
            seen = f"{allreduces} all-reduces of some of the model's {tensors} trainable tensors, never all of them"
        else:
            seen = "no all-reduce of the model's gradients"
        return {"ok": False, "measurements": measured, "message": (
            f"the grader found no Horovod gradient all-reduce in the run: Horovod's timeline shows {seen}. "
            "Identical weights at the end of an epoch (a broadcast before saving, one rank training alone) are not "
            f"data parallelism. {convert}")}
    return {"ok": False, "measurements": measured, "message": (
        f"Horovod's timeline shows {rounds} complete rounds of gradient all-reduces in {epochs} epoch(s){after}, "
        f"{per_epoch:.1f} per epoch: too few for {samples_per_worker:.0f} samples per worker per epoch (the grader "
        f"asks for {need}: at most {rules.MAX_IMAGES_PER_ALLREDUCE} images per worker between two all-reduces). "
        "Average the gradients at every step with hvd.DistributedOptimizer, not once in a while")}


def _checkpoints(folder: Path) -> dict[tuple[int, int], Path]:
    out = {}
    for p in folder.glob("rank-*-epoch-*.pt") if folder.is_dir() else []:
        m = runner.CHECKPOINT.match(p.name)
        if m:
            out[(int(m.group(1)), int(m.group(2)))] = p
    return out


# ----------------------------------------------------------------------------- evaluation


def _fit_model(state: dict[str, torch.Tensor], num_classes: int) -> tuple[torch.nn.Module, str] | None:
    """The course model whose architecture the weights fit (the contract allows the course's models)."""
    for name in sorted(models.MODELS, key=lambda n: n != "alexnet_small"):  # the CPU default first
        model = models.build_model(name, num_classes=num_classes)
        try:
            model.load_state_dict(state, strict=True)
        except (RuntimeError, KeyError):
            continue
        return model, name
    return None


def holdout_accuracy(state: dict[str, torch.Tensor], holdout: Path) -> float:
    """Accuracy of the weights on the grader's held-out set (evaluated by the grader itself)."""
    classes, _ = data.find_classes(holdout / "val")
    fitted = _fit_model(state, len(classes))
    if fitted is None:
        raise ValueError("the weights fit none of the course's models "
                         f"({', '.join(models.MODELS)}) with {len(classes)} classes")
    model, name = fitted
    dataset = data.JPEGFolder(holdout, data.val_transform(models.default_image_size(name)), split="val")
    _, accuracy = training.evaluate(model, data.make_loader(dataset, 256))
    return accuracy


# ----------------------------------------------------------------------------- the grading


def prepare_data(settings: Settings, private: Path, progress: bool = False) -> tuple[Path, Path, Path]:
    """``(training set, held-out set, baseline set)`` for ``settings``.

    The training set is generated once and cached (the sandbox shows it read-only); so is the
    smaller set the baseline measures its images/s on (the same images, fewer of them: the
    speed per image is what counts). The held-out set is generated afresh in ``private``, the
    grader's own folder that no submission sees or writes (a few seconds; deterministic from
    :data:`rules.HOLDOUT_SEED`), so no earlier submission can have changed it.
    """
    train = data.ensure_dataset(train_per_class=settings.train_per_class, val_per_class=settings.val_per_class,
                                progress=progress)
    baseline = train
    if settings.baseline_per_class and settings.baseline_per_class != settings.train_per_class:
        baseline = data.ensure_dataset(train_per_class=settings.baseline_per_class, val_per_class=settings.val_per_class,
                                       progress=progress)
    holdout = data.ensure_dataset(private / "holdout", train_per_class=0, val_per_class=settings.holdout_per_class,
                                  seed=rules.HOLDOUT_SEED, progress=progress)
    return train, holdout, baseline


def _images_per_epoch(loaded: dict[tuple[int, int], dict]) -> dict[int, int]:
    """Samples trained on per epoch, all ranks together, from the loaded checkpoints: the DISTINCT
    indices the ranks reported (an index listed twice, by one rank or by two, is one image)."""
    seen: dict[int, set[int]] = {}
    for (_, epoch), c in loaded.items():
        seen.setdefault(epoch, set()).update(c["indices"])
    return {epoch: len(indices) for epoch, indices in seen.items()}


def learning_rate_hints(source: str) -> list[str]:
    """What the script's text suggests about its learning rate, for the accuracy message only
    (a reading of the source is a hint, never a verdict): no multiplication by ``hvd.size()`` (or
    a name bound to it), no warm-up anywhere in the text. Empty when nothing can be told."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []

    def is_size(node: ast.AST) -> bool:  # hvd.size(), size(), dist.get_world_size(), int(os.environ["HOROVOD_SIZE"])
        for x in ast.walk(node):
            if isinstance(x, ast.Call) and not x.args and (
                    (isinstance(x.func, ast.Attribute) and x.func.attr in ("size", "get_world_size"))
                    or (isinstance(x.func, ast.Name) and x.func.id in ("size", "get_world_size"))):
                return True
            if isinstance(x, ast.Constant) and x.value in ("HOROVOD_SIZE", "WORLD_SIZE"):
                return True
        return False

    sizes: set[str] = set()  # names bound to the number of workers: workers = hvd.size()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            pairs = [(node.targets[0], node.value)]
            if isinstance(node.targets[0], ast.Tuple) and isinstance(node.value, ast.Tuple):
                pairs = list(zip(node.targets[0].elts, node.value.elts))
            sizes |= {t.id for t, v in pairs if isinstance(t, ast.Name) and is_size(v)}
    scaled = any(isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)
                 and any(is_size(x) or (isinstance(x, ast.Name) and x.id in sizes) for x in (node.left, node.right))
                 for node in ast.walk(tree))
    hints: list[str] = []
    if not re.search(r"\bhvd\.|\bhorovod\.torch|\btorch\.distributed", source):  # unconverted: other messages first
        return hints
    if not scaled:
        hints.append("your script does not seem to multiply the learning rate by hvd.size(): hvd.size() workers "
                     "make the global batch hvd.size() times larger, so scale the rate with them")
    if not re.search(r"warm[\s_-]?up", source, re.IGNORECASE):
        hints.append("no warm-up found: ramp the rate from lr to lr x hvd.size() over the first epoch, since a "
                     "large rate from the first step can throw the model off (Goyal et al. 2017, Lab 1)")
    return hints


#: The least time a run goes on after rank 0's first checkpoint while no other rank has saved one
#: (see :func:`lone_rank0`); the grace is also at least a quarter of the time rank 0 took to get
#: there. The ranks of a data-parallel run finish an epoch within a step of each other, and a
#: script that saves every rank's checkpoints in one burst at the end does so within a second.
LONE_RANK0_GRACE_S = 20.0


def lone_rank0(workers: int, grace_s: float = LONE_RANK0_GRACE_S) -> runner.StopRule:
    """A stop rule for :func:`runner.run_untrusted`: stop a run in which only rank 0 ever saved,
    once the grace after its first checkpoint has passed. Such a run cannot earn a point (every
    criterion needs every rank's checkpoints of an epoch), and an unconverted script (4 copies of
    one worker, each on all the data, all saving as rank 0) would otherwise run for most of the
    time budget."""
    def rule(seen: dict[tuple[int, int], float], elapsed: float) -> str:
        first = seen.get((0, 1))
        if workers < 2 or first is None or any(r != 0 for r, _ in seen):
            return ""
        grace = max(grace_s, 0.25 * first)
        if elapsed - first < grace:
            return ""
        return (f"stopped early, {elapsed:.0f} s into the run: rank 0 saved epoch 1 and {grace:.0f} s later no other "
                "rank had saved a checkpoint, so the run could not earn a point")
    return rule


def run_failure(rec: runner.RunRecord, settings: Settings) -> str | None:
    """Why a run did not end cleanly, in words a learner can act on (None: it did)."""
    from multigpu.running.launch import worker_errors

    if rec.stopped_early:
        return rec.stopped_early
    if rec.timed_out:
        return (f"the run did not finish within the time budget T = {settings.time_budget_s:.0f} s and was stopped "
                "(a rank waiting in a collective another never joined, an endless loop, or too many epochs). "
                f"Last output:\n{rec.tail[-1500:]}")
    if rec.output_exceeded:
        return (f"the run printed more than {settings.max_output_bytes:,} bytes and was stopped: print once per "
                f"epoch on rank 0 only. Last output:\n{rec.tail[-800:]}")
    if rec.memory_exceeded:
        return (f"the run's processes held more than {settings.max_memory_bytes / 2**30:.0f} GiB of memory together "
                "and were stopped: keep one model and a few batches per worker in memory")
    if rec.returncode != 0:
        lines = rec.tail.splitlines()
        return f"the run ended with exit code {rec.returncode}. " + worker_errors(lines, limit=20)
    return None


def sandbox_rules(train_root: Path, extra_hidden: Sequence[os.PathLike | str] = (),
                  readable: Sequence[os.PathLike | str] = ()) -> dict[str, Sequence[str | os.PathLike]]:
    """What a grading run may read and what it must not see (see :mod:`multigpu.grading.sandbox`):
    the training set readable; the course key's folder, the data cache (the grader's held-out set
    is elsewhere, in its private folder under the hidden /tmp), every ``grading/`` folder
    (gradebook, submissions) of the course and of the current folder hidden."""
    hidden = [rules.course_key_path().parent, data.data_home(), REPO / layout.GRADING,
              Path.cwd() / layout.GRADING, *extra_hidden]
    return {"readable": [train_root, *readable], "hidden": [h for h in hidden if Path(h).exists()]}


def _mode_env(settings: Settings) -> dict[str, str]:
    """The cpu and quick profiles grade CPU workers, on a GPU machine too (the same devices for
    the baselines and every submission)."""
    return {} if settings.profile == "gpu" else {devices.FORCE_CPU: "1"}


def _baseline(settings: Settings, workdir: Path, train_root: Path, index: int, log: Log,
              sandbox: dict | None) -> float | None:
    """One run of the unmodified starter on one worker with one thread: its images/s (None if it failed)."""
    work = workdir / f"baseline-{index}"
    work.mkdir()
    shutil.copy(STARTER, work / "train.py")
    ckpt = work / "checkpoints"
    rec = runner.run_untrusted(work / "train.py", work, workers=None, timeout=settings.time_budget_s,
                            max_output_bytes=settings.max_output_bytes, max_memory_bytes=settings.max_memory_bytes,
                            args=("--epochs", str(settings.baseline_epochs), "--threads", str(BASELINE_THREADS)),
                            env={"MULTIGPU_ASSESSMENT_DATA": str(train_root), "MULTIGPU_CHECKPOINT_DIR": str(ckpt),
                                 **_mode_env(settings)},
                            checkpoint_dir=ckpt, sandbox=sandbox)
    if not rec.ok:
        log(f"baseline run {index + 1} failed: {run_failure(rec, settings)}")
        return None
    loaded = {k: load_checkpoint(p) for k, p in _checkpoints(ckpt).items()}
    value = run_throughput(rec, _images_per_epoch(loaded))
    shutil.rmtree(work, ignore_errors=True)
    log(f"baseline {index + 1}: the unmodified starter on one worker, {BASELINE_THREADS} thread: "
        + (f"{value:.1f} images/s" if value else "no throughput (fewer than 2 epochs)"))
    return value


def agreeing_baselines(values: Sequence[float | None], tolerance: float) -> list[float] | None:
    """The largest group of baseline measurements within ``tolerance`` (max/min - 1) of each
    other, at least two; None when no two agree (the machine's speed changed under the grading)."""
    vs = sorted(v for v in values if v)
    best: list[float] = []
    for i in range(len(vs)):
        group = [v for v in vs[i:] if v <= vs[i] * (1 + tolerance)]
        if len(group) > len(best):
            best = group
    return best if len(best) >= 2 else None


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
) -> GradeResult:
    """Grade ``script`` under ``settings`` (default :func:`rules.settings`); see the module doc.

    ``args`` are extra command-line arguments for the submission (tests only: the official
    grading runs the script's defaults). ``echo`` streams the run's output live.
    ``sandbox``: ``"auto"`` (the sandbox where it starts, else an unsandboxed verdict that says
    so), ``"required"`` (raise :class:`SandboxUnavailable` instead: certificates) or ``"off"``.
    ``hidden``: more folders the submission must not see (other submissions, results).
    """
    from multigpu.grading import sandbox as sb

    settings = settings or rules.settings()
    log = log or (lambda _msg: None)
    script_path = Path(script).resolve()
    name = str(script)
    why_not = sb.unavailable() if sandbox != "off" else "sandbox turned off"
    if why_not and sandbox == "required":
        raise SandboxUnavailable(f"cannot grade for a certificate: {why_not}")
    problem = check_source(script_path)
    if problem:
        return _all_fail(name, settings, problem, **(audit.identity(script_path.read_bytes())
                                                     if script_path.is_file() else {}))
    raw = script_path.read_bytes()  # graded, hashed and kept: the same bytes

    info = devices.detect()
    if settings.profile == "gpu" and info.gpus < settings.workers:
        raise ValueError(f"the gpu profile grades {settings.workers} workers, one per GPU; this machine has "
                         f"{info.gpus} GPU(s): grade with --profile cpu (CPU workers)")
    if settings.profile != "gpu":
        info = devices.as_cpu(info)  # CPU workers (the env of every run says so: _mode_env)
    measurements: dict[str, Any] = {
        "workers": settings.workers, "mode": info.mode, "ideal_factor": devices.ideal_factor(settings.workers, info),
        "hardware": f"{info.mode.upper()} mode, {info.cores} cores" + (f", {info.gpus} GPUs" if info.gpus else ""),
    }
    if why_not:
        measurements["sandbox"] = why_not
        log(f"NOT SANDBOXED: {why_not}")
    with tempfile.TemporaryDirectory(prefix="multigpu-grade-", dir=workdir) as tmp:
        work = Path(tmp).resolve()
        private = work / "grader"  # the held-out set: never bound into a sandbox
        log("preparing the data (the training set and the grader's own held-out set)")
        train_root, holdout, baseline_root = prepare_data(settings, private)
        rules_ = None if why_not else sandbox_rules(train_root, [private, *hidden], [baseline_root])
        broken = horovod_unavailable(rules_)
        if broken:
            raise HorovodUnavailable(f"cannot grade: {broken}. No submission was graded.")
        submission = work / "submission"
        submission.mkdir()
        (submission / "train.py").write_bytes(raw)  # the script runs from a scratch copy of what was hashed
        ckpt = submission / "checkpoints"
        timeline = timeline_file(submission)

        repeats = settings.baseline_repeats
        before, after = (repeats + 1) // 2, repeats // 2
        baselines: list[float | None] = [_baseline(settings, work, baseline_root, i, log, rules_) for i in range(before)]
        log(f"running {script_path.name} on {settings.workers} workers (time budget {settings.time_budget_s:.0f} s)")
        rec = runner.run_untrusted(submission / "train.py", submission, workers=settings.workers,
                                timeout=settings.time_budget_s, max_output_bytes=settings.max_output_bytes,
                                max_memory_bytes=settings.max_memory_bytes, args=args, echo=echo, checkpoint_dir=ckpt,
                                env={"MULTIGPU_ASSESSMENT_DATA": str(train_root), "MULTIGPU_CHECKPOINT_DIR": str(ckpt),
                                     # Horovod's own account of the run: rank 0 records every collective
                                     "HOROVOD_TIMELINE": str(timeline), **_mode_env(settings)},
                                sandbox=rules_, stop_if=lone_rank0(settings.workers))
        measurements["run_s"] = round(rec.wall_s, 2)
        if rec.stopped_early:  # no complete epoch: no throughput to measure, no more baselines to run
            log(rec.stopped_early)
        else:
            baselines += [_baseline(settings, work, baseline_root, before + i, log, rules_) for i in range(after)]
            if repeats >= 2 and agreeing_baselines(baselines, settings.baseline_tolerance) is None:
                log(f"the baselines disagree ({', '.join(f'{b:.1f}' for b in baselines if b)} images/s): "
                    "the machine's speed changed; measuring once more")
                baselines.append(_baseline(settings, work, baseline_root, len(baselines), log, rules_))
        measurements["baselines"] = [round(b, 2) for b in baselines if b]
        source = raw.decode("utf-8", errors="replace")
        criteria = judge(rec, _checkpoints(ckpt), settings, train_root, holdout, measurements, log, source,
                          timeline_path=timeline)
    result = GradeResult(name, settings, criteria, measurements, sandboxed=rec.sandboxed, **audit.identity(raw))
    result.review = review.record(review.flags(source), result.passed)
    return result


class GradingUnavailable(RuntimeError):
    """This machine cannot give the verdict asked for: an error for the operator, no grade."""


class SandboxUnavailable(GradingUnavailable):
    """Grading for a certificate was asked for where the sandbox cannot start."""


class HorovodUnavailable(GradingUnavailable):
    """The grading environment cannot run Horovod where submissions run: no verdict is given
    (every submission would fail its workers criterion through no fault of its own)."""


#: Sandboxed or not, where Horovod was found working in this process (a working build stays
#: working; the folders a grading hides besides HOME and /tmp never hold the venv).
_HOROVOD_CHECKED: set[bool] = set()
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
    import subprocess
    import sys

    from multigpu.grading import sandbox as sb
    from multigpu.running import launch

    sandboxed = sandbox_rules_ is not None
    if sandboxed in _HOROVOD_CHECKED:
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
        _HOROVOD_CHECKED.add(sandboxed)
        return None
    why = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1] if out.returncode else \
        f"it was built without {controller.upper()}, which the grader launches with"
    return (f"Horovod's PyTorch extension does not work {where} ({why}): rerun tools/install_horovod.sh "
            "(make setup) and check that the extension loads its libraries from the venv "
            "(ldd .venv/lib/python3.11/site-packages/horovod/torch/mpi_lib_v2*.so)")





def judge(
    rec: runner.RunRecord,
    ckpts: dict[tuple[int, int], Path],
    settings: Settings,
    train_root: Path,
    holdout: Path,
    m: dict[str, Any],
    log: Log,
    source: str = "",
    timeline_path: Path | None = None,
) -> dict[str, Criterion]:
    """The verdicts of a run, criterion by criterion (each function below judges one and adds its
    figures to ``m``). ``timeline_path``: the Horovod timeline the run was told to write (None:
    none was recorded, and the gradients do not count as averaged by Horovod)."""
    n = settings.workers
    failure = run_failure(rec, settings)
    crit: dict[str, Criterion] = {}
    uses_horovod = re.search(r"^\s*(import|from)\s+horovod\b", source, re.MULTILINE) is not None
    crit["workers"], complete = _judge_workers(rec, ckpts, settings, failure, uses_horovod, m)
    loaded, nothing = _load_complete(ckpts, complete, n, failure)
    usable = not nothing
    seen = [rec.epoch_times[e] for e in complete if e in rec.epoch_times]
    clock = RunClock(rec.started_at, rec.wall_s, max(seen)) if rec.started_at and seen else None
    crit["identical"], not_averaged = _judge_identical(loaded, complete, settings, m, source,
                                                       (timeline_path, clock), nothing)
    crit["sharded"] = _judge_sharded(loaded, complete, n, train_root, not_averaged, nothing)
    crit["accuracy"] = _judge_accuracy(loaded, complete, settings, holdout, m, log, source, nothing)
    prerequisites = [c for c in ("workers", "identical", "sharded", "accuracy") if not crit[c].passed]
    crit["throughput"] = _judge_throughput(rec, loaded if usable else None, settings, m, prerequisites)
    return crit


def _judge_workers(rec: runner.RunRecord, ckpts: dict[tuple[int, int], Path], settings: Settings, failure: str | None,
                   uses_horovod: bool, m: dict[str, Any]) -> tuple[Criterion, list[int]]:
    """A clean run, and a checkpoint from every rank for every epoch; also the complete epochs."""
    n = settings.workers
    ranks = {r for r, _ in ckpts}
    epochs = sorted({e for _, e in ckpts})
    missing_ranks = sorted(set(range(n)) - ranks)
    extra_ranks = sorted(ranks - set(range(n)))
    complete = [e for e in epochs if all((r, e) in ckpts for r in range(n))]
    m["epochs"] = len(complete)
    if ckpts and missing_ranks:  # the root cause first: an unconverted script saves as rank 0 only
        also = f" The run also failed: {failure.splitlines()[0]}" if failure else ""
        if uses_horovod and ranks == {0}:  # Lab 3's habit: only rank 0 writes files
            why = ("only rank 0 saved. Lab 3 saves on rank 0 only (one copy of the model is enough there); "
                   "the assessment's contract is different: EVERY rank calls save_checkpoint(..., hvd.rank(), "
                   "indices) at the end of every epoch, so the grader can check each rank's weights and shard")
        else:
            why = ("every worker must save with its own hvd.rank() (did the script call hvd.init()? an "
                   "unconverted script runs 4 independent copies that all save as rank 0)")
        verdict = Criterion("workers", POINTS["workers"], False,
                            f"no checkpoint from rank {', '.join(map(str, missing_ranks))} of {n}: {why}." + also)
    elif failure:
        verdict = Criterion("workers", POINTS["workers"], False, failure)
    elif not ckpts:
        verdict = Criterion("workers", POINTS["workers"], False,
                            "the run left no checkpoint: call save_checkpoint(..., rank, indices) on every "
                            "rank at the end of every epoch")
    elif extra_ranks:
        verdict = Criterion("workers", POINTS["workers"], False,
                            f"checkpoints from rank(s) {extra_ranks} that do not exist in a {n}-worker run")
    elif len(complete) != len(epochs) or epochs != list(range(1, len(epochs) + 1)):
        gaps = [e for e in range(1, max(epochs) + 1) if e not in complete]
        verdict = Criterion("workers", POINTS["workers"], False,
                            f"epoch(s) {gaps} lack a checkpoint from some rank: every rank saves every epoch")
    else:
        verdict = Criterion("workers", POINTS["workers"], True,
                            f"{n} workers ran {len(complete)} epochs in {rec.wall_s:.0f} s "
                            f"(budget {settings.time_budget_s:.0f} s), every rank saved every epoch")
    return verdict, complete


def _load_complete(ckpts: dict[tuple[int, int], Path], complete: list[int], n: int,
                   failure: str | None) -> tuple[dict[tuple[int, int], dict], str]:
    """The checkpoints of the complete epochs (ranks of one epoch are compared with each other),
    and why there is nothing to judge ("" when there is)."""
    loaded: dict[tuple[int, int], dict] = {}
    load_error = ""
    try:
        for e in complete:
            for r in range(n):
                loaded[(r, e)] = load_checkpoint(ckpts[(r, e)])
    except ValueError as err:
        load_error = str(err)
    nothing = load_error or ("no epoch has a checkpoint from all "
                             f"{n} ranks, so there is nothing to compare" + (f" ({failure.splitlines()[0]})" if failure else ""))
    return loaded, ("" if not load_error and complete else nothing)


def _judge_identical(loaded: dict[tuple[int, int], dict], complete: list[int],
                     settings: Settings, m: dict[str, Any], source: str,
                     evidence: tuple[Path | None, RunClock | None], nothing: str) -> tuple[Criterion, bool]:
    """Identical weights, averaged by Horovod (its timeline and the run's clock: ``evidence``);
    also whether the gradients were NOT averaged (then the shards do not count)."""
    n = settings.workers
    not_averaged = False
    if nothing:
        verdict = Criterion("identical", POINTS["identical"], False, nothing)
    else:
        worst = (0.0, "", 0, 0)
        for e in complete:
            for r in range(1, n):
                d, where = state_difference(weights_only(loaded[(0, e)]["model"]), weights_only(loaded[(r, e)]["model"]))
                if d > worst[0]:
                    worst = (d, where, r, e)
        m["max_weight_difference"] = worst[0] if math.isfinite(worst[0]) else "shape mismatch"
        weights = weights_only(loaded[(0, complete[0])]["model"])
        per_worker = sum(len(set(c["indices"])) for c in loaded.values()) / len(loaded)
        by_horovod = horovod_averaging(evidence[0], weights, per_worker, len(complete), settings, source,
                                       clock=evidence[1])
        m.update(by_horovod["measurements"])
        if worst[0] > IDENTICAL_TOL:
            verdict = Criterion(
                "identical", POINTS["identical"], False,
                f"weights differ between rank 0 and rank {worst[2]} after epoch {worst[3]} (largest difference "
                f"{worst[0]:.3g} in '{worst[1]}'): broadcast rank 0's parameters and optimizer state at the start "
                "(hvd.broadcast_parameters, hvd.broadcast_optimizer_state) and average gradients with "
                "hvd.DistributedOptimizer")
        elif not by_horovod["ok"]:
            not_averaged = True
            verdict = Criterion("identical", POINTS["identical"], False, by_horovod["message"])
        else:
            verdict = Criterion(
                "identical", POINTS["identical"], True,
                f"all {n} ranks hold the same trainable weights after each of {len(complete)} epochs (BatchNorm's "
                "running statistics are buffers each rank computes from its own shard, so they are not compared); "
                + by_horovod["message"])
    return verdict, not_averaged


def _judge_sharded(loaded: dict[tuple[int, int], dict], complete: list[int], n: int, train_root: Path,
                   not_averaged: bool, nothing: str) -> Criterion:
    """Disjoint shards that cover the training set in every epoch (counted only for averaged gradients)."""
    train_size = len(data.JPEGFolder(train_root, None, split="train"))
    padding = (-train_size) % n  # DistributedSampler repeats this many samples to even out the shards
    if nothing:
        return Criterion("sharded", POINTS["sharded"], False, nothing)
    elif not_averaged:
        return Criterion("sharded", POINTS["sharded"], False,
                         "not counted: shards make one model only when the ranks average their gradients, "
                         "and the grader did not see that (see 'identical')")
    else:
        problem = ""
        for e in complete:
            sets = [set(loaded[(r, e)]["indices"]) for r in range(n)]
            counts = sum(len(s) for s in sets)
            union = set().union(*sets)
            shared = counts - len(union)
            repeated = [(r, len(loaded[(r, e)]["indices"]) - len(sets[r])) for r in range(n)]
            repeated = [(r, k) for r, k in repeated if k]
            if repeated:
                r, k = repeated[0]
                problem = (f"epoch {e}: rank {r} listed {k} index(es) more than once: an index is one sample trained "
                           "on once in the epoch, so list the indices of the batches this rank trained on, each "
                           "once (trained_on.extend(index.tolist()) per batch)"
                           + (f"; {len(repeated) - 1} other rank(s) did the same" if len(repeated) > 1 else ""))
            elif any(i < 0 or i >= train_size for i in union):
                problem = f"epoch {e}: indices outside the training set (0..{train_size - 1})"
            elif shared > padding:
                problem = (f"epoch {e}: {shared} samples were trained on by more than one rank: give each rank its "
                           "own shard with DistributedSampler(num_replicas=hvd.size(), rank=hvd.rank()) and call "
                           "sampler.set_epoch(epoch)")
            elif len(union) < train_size:
                problem = (f"epoch {e}: the ranks together trained on {len(union)} of {train_size} samples: "
                           "every epoch must cover the training set")
            if problem:
                break
        same_every_epoch = len(complete) >= 2 and all(
            set(loaded[(r, complete[0])]["indices"]) == set(loaded[(r, e)]["indices"]) for r in range(n) for e in complete)
        hint = (" Note: every rank trained on the same shard in every epoch: call sampler.set_epoch(epoch) at the "
                "start of each epoch so that the shards are reshuffled" if same_every_epoch else "")
        return Criterion("sharded", POINTS["sharded"], not problem, (problem or
                         f"disjoint shards covering all {train_size} training samples in each of "
                         f"{len(complete)} epochs") + hint)


def _judge_accuracy(loaded: dict[tuple[int, int], dict], complete: list[int], settings: Settings, holdout: Path,
                    m: dict[str, Any], log: Log, source: str, nothing: str) -> Criterion:
    """Rank 0's weights on the grader's held-out set, reached and held for ``epochs_held`` epochs."""
    if nothing:
        return Criterion("accuracy", POINTS["accuracy"], False, nothing)
    else:
        accs: list[float] = []
        try:
            for e in complete:
                accs.append(holdout_accuracy(loaded[(0, e)]["model"], holdout))
                log(f"epoch {e}: the grader measured {accs[-1]:.1%} on its held-out set")
        except ValueError as err:
            return Criterion("accuracy", POINTS["accuracy"], False, str(err))
        else:
            k = settings.epochs_held
            held = max((min(accs[i:i + k]) for i in range(len(accs) - k + 1)), default=None)
            m["accuracy_per_epoch"] = [round(a, 4) for a in accs]
            m["accuracy"] = round(accs[-1], 4)
            m["accuracy_held"] = round(held, 4) if held is not None else None
            per_epoch = ", ".join(f"{a:.1%}" for a in accs)
            if held is None:
                return Criterion("accuracy", POINTS["accuracy"], False,
                                 f"the grader measured {per_epoch} on its held-out set: it needs at least "
                                 f"{k} epochs to see the accuracy held")
            elif held >= settings.accuracy:
                return Criterion("accuracy", POINTS["accuracy"], True,
                                 f"the grader measured {per_epoch} on its held-out set: {held:.1%} held "
                                 f"for {k} epochs (A = {settings.accuracy:.0%})")
            else:
                hints = learning_rate_hints(source)
                return Criterion(
                    "accuracy", POINTS["accuracy"], False,
                    f"the grader measured {per_epoch} on its held-out set; best held for {k} epochs: {held:.1%}, "
                    f"below A = {settings.accuracy:.0%}. Tune the learning rate (scaled by hvd.size() after a "
                    "warm-up), the per-worker batch size or the epochs; what the script prints is not used"
                    + "".join(f". Hint from reading your script (not a verdict): {h}" for h in hints))


def _judge_throughput(rec: runner.RunRecord, loaded: dict[tuple[int, int], dict] | None, settings: Settings,
                      m: dict[str, Any], prerequisites: list[str]) -> Criterion:
    """Images/s of the run (checkpoint times) against the ideal measured in this grading; ``loaded``
    is None when there is nothing to judge."""
    n = settings.workers
    usable = loaded is not None
    images = _images_per_epoch(loaded) if loaded is not None else {}
    throughput = run_throughput(rec, images) if usable else None
    baselines = m.get("baselines") or []
    agreeing = agreeing_baselines(baselines, settings.baseline_tolerance) if len(baselines) >= 2 else baselines
    m["throughput"] = round(throughput, 2) if throughput else None
    if not baselines:
        return Criterion("throughput", POINTS["throughput"], False,
                         "not measured: no single-worker baseline in this grading "
                         f"(baseline_repeats={settings.baseline_repeats}, or the starter failed)")
    elif throughput is None:
        return Criterion("throughput", POINTS["throughput"], False,
                         "not measured: the run needs at least 2 complete epochs (the first is warm-up)")
    elif agreeing is None:
        m["noisy"] = True
        return Criterion(
            "throughput", POINTS["throughput"], False,
            f"machine too noisy to grade throughput: the single-worker baselines measured "
            f"{', '.join(f'{b:.1f}' for b in baselines)} images/s, more than {settings.baseline_tolerance:.0%} apart "
            "(something else ran on this machine). Not a verdict on your script: grade again on a quiet machine")
    else:
        baselines = agreeing
        baseline = statistics.median(baselines)
        factor = m.get("ideal_factor") or devices.ideal_factor(n)  # min(workers, cores or GPUs) of this grading
        ideal = factor * baseline
        eff = throughput / ideal
        m.update(baseline=round(baseline, 2), ideal=round(ideal, 2), efficiency=round(eff, 4))
        figures = (f"{throughput:.1f} images/s on {n} workers = {eff:.2f} x ideal ({ideal:.1f} = "
                   f"{factor} x {baseline:.1f} images/s of one worker with one thread, median of "
                   f"{len(baselines)}); "
                   f"E = {settings.efficiency:.2f}")
        if prerequisites:
            return Criterion("throughput", POINTS["throughput"], False,
                             f"{figures}; not counted: the run failed {', '.join(prerequisites)} "
                             "(speed only counts for a run that trains correctly)")
        elif eff > rules.MAX_TRUSTED_EFFICIENCY:
            m["untrusted_efficiency"] = True
            return Criterion("throughput", POINTS["throughput"], False,
                             f"{figures}: faster than the ideal, which {n} workers cannot beat, beyond the "
                             f"{rules.MAX_TRUSTED_EFFICIENCY - 1:.0%} a baseline may be off: the grader does not trust "
                             "this measurement, so it is no pass. Images count once per epoch however many ranks "
                             "list them; if your script is honest, ask for a grading on a quiet machine")
        elif eff >= settings.efficiency:
            return Criterion("throughput", POINTS["throughput"], True, figures)
        else:
            return Criterion("throughput", POINTS["throughput"], False,
                             f"{figures}: too slow. Give each worker cores // workers threads, "
                             "use a larger per-worker batch, and print/evaluate less often")
