"""Did Horovod average the gradients? The evidence is Horovod's own account of the run: the
timeline its rank 0 writes where the grader's ``HOROVOD_TIMELINE`` says (:func:`timeline_file`),
read for complete rounds of gradient all-reduces (:func:`gradient_round_ends`) that ended while
the run trained by the grader's clock (:class:`RunClock`, :func:`rounds_while_training`), judged
by :func:`horovod_averaging`."""

from __future__ import annotations

import math
import re
import secrets
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from multigpu.grading import rules
from multigpu.grading.rules import Settings
from multigpu.running import timeline


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
