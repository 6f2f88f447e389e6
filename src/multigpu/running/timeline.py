"""Read and draw a Horovod timeline (``HOROVOD_TIMELINE=file.json``) with matplotlib.

Horovod's coordinator (rank 0) writes one Chrome-trace event per phase of every collective:
each tensor (``allreduce.features.0.weight``, ``broadcast...``) is a "process" (``pid``) whose
phases are begin/end pairs: ``NEGOTIATE_ALLREDUCE`` (from the first rank reporting the tensor
ready until the last one does; the instant events named ``"0"``, ``"1"``... mark each rank's
report), then ``ALLREDUCE`` with its parts ``MEMCPY_IN_FUSION_BUFFER``, ``MPI_ALLREDUCE`` (or
``GLOO_ALLREDUCE``, ``NCCL_ALLREDUCE``: the library that moved the bytes) and
``MEMCPY_OUT_FUSION_BUFFER``. The file is often left without its
closing bracket; :func:`load` copes.
"""

from __future__ import annotations

import json
import os
import stat
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Colours of the phases in :func:`plot` (anything else is grey).
COLOURS = {
    "NEGOTIATE_ALLREDUCE": "#f2c14e",
    "NEGOTIATE_BROADCAST": "#f2c14e",
    "ALLREDUCE": "#9ecae1",
    "BROADCAST": "#9ecae1",
    "MEMCPY_IN_FUSION_BUFFER": "#e76f51",
    "MEMCPY_OUT_FUSION_BUFFER": "#f4a261",
    "MPI_ALLREDUCE": "#2a6f97",
    "GLOO_ALLREDUCE": "#2a6f97",
    "NCCL_ALLREDUCE": "#2a6f97",
    "MPI_BCAST": "#2a6f97",
    "GLOO_BCAST": "#2a6f97",
    "QUEUE": "#bbbbbb",
}


@dataclass(frozen=True)
class Span:
    """One phase of one tensor's collective: times in seconds from the start of the timeline."""

    tensor: str
    phase: str
    start: float
    end: float
    depth: int  #: 0 for a top-level phase, 1 for a part of it (e.g. GLOO_ALLREDUCE inside ALLREDUCE)

    @property
    def duration(self) -> float:
        return self.end - self.start


def load(path: str | Path, max_bytes: int | None = None) -> list[dict[str, Any]]:
    """The events of a timeline file (tolerates a missing closing ``]`` and a trailing comma).

    ``max_bytes`` (a file someone else wrote, e.g. the grader reading a submission's run) reads
    it defensively: a regular file only (no symbolic link, FIFO or device), at most
    ``max_bytes``, and anything that is not a list of events raises ``ValueError``.
    """
    text = (Path(path).read_text() if max_bytes is None else read_regular_file(Path(path), max_bytes).decode("utf-8", errors="replace")).strip()
    if not text:
        return []
    text = text.rstrip(",")
    if not text.endswith("]"):
        text += "]"
    try:
        events = json.loads(text)
    except json.JSONDecodeError:
        # a half-written last event (the run was killed): drop it. It ends a few "}" before the
        # end at most (an event nests one object), so a handful of tries, not one per "}"
        cut, events = text.rfind("}"), None
        for _ in range(_RECOVERY_TRIES):
            if cut <= 0:
                break
            try:
                events = json.loads(text[: cut + 1].rstrip(",") + "]")
                break
            except json.JSONDecodeError:
                cut = text.rfind("}", 0, cut)
        if events is None:
            raise
    if max_bytes is not None and not (isinstance(events, list) and all(isinstance(e, dict) for e in events)):
        raise ValueError(f"{Path(path).name} is not a list of timeline events")
    return events


#: Cuts :func:`load` tries when the end of a file is half-written.
_RECOVERY_TRIES = 8


def read_regular_file(path: str | os.PathLike, max_bytes: int) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``max_bytes`` (ValueError otherwise).

    For files someone else wrote (a submission's timeline or checkpoints): a symlink, a FIFO
    (which would block a plain ``open``), a device or a directory is refused, and no more than
    ``max_bytes + 1`` bytes are ever read.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise ValueError(f"{path.name} cannot be opened: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path.name} is not a regular file")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path.name} is larger than {max_bytes:,} bytes")
    return data


def tensor_names(events: Iterable[Any]) -> dict[int, str]:
    """``pid -> tensor name``: Horovod writes one "process" per tensor, named by a metadata event
    (``{"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "allreduce.fc.weight"}}``).
    Anything that is not such an event, malformed ones included, is skipped."""
    names: dict[int, str] = {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "process_name" \
                and isinstance(e.get("pid"), int) and isinstance(e.get("args"), dict) \
                and isinstance(e["args"].get("name"), str):
            names[e["pid"]] = e["args"]["name"]
    return names


def spans(events: Sequence[dict[str, Any]]) -> list[Span]:
    """Pair begin/end events per tensor into :class:`Span` s, sorted by start time."""
    names = tensor_names(events)
    stacks: dict[int, list[tuple[str, float]]] = defaultdict(list)
    out: list[Span] = []
    for e in events:
        ph = e.get("ph")
        pid: Any = e.get("pid")
        if ph == "B":
            stacks[pid].append((e["name"], e["ts"] / 1e6))
        elif ph == "E" and stacks[pid]:
            phase, start = stacks[pid].pop()
            out.append(Span(names.get(pid, str(pid)), phase, start, e["ts"] / 1e6, len(stacks[pid])))
        elif ph == "X" and e.get("dur", 0) > 0:
            out.append(Span(names.get(pid, str(pid)), e["name"], e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6,
                            len(stacks[pid])))
    out.sort(key=lambda s: s.start)
    return out


def ready_marks(events: Sequence[dict[str, Any]]) -> list[tuple[str, int, float]]:
    """``(tensor, rank, time_s)``: when each rank reported each tensor ready (during negotiation)."""
    names = tensor_names(events)
    marks = []
    for e in events:
        if e.get("ph") == "X" and str(e.get("name", "")).isdigit() and e.get("dur", 0) == 0:
            marks.append((names.get(e["pid"], str(e["pid"])), int(e["name"]), e["ts"] / 1e6))
    return marks


def summary(spans_: Sequence[Span], prefix: str = "allreduce.") -> dict[str, float]:
    """Total seconds per phase over the tensors whose name starts with ``prefix``."""
    totals: dict[str, float] = defaultdict(float)
    for s in spans_:
        if s.tensor.startswith(prefix):
            totals[s.phase] += s.duration
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def steps(spans_: Sequence[Span], prefix: str = "allreduce.", gap_s: float = 0.02) -> list[tuple[float, float]]:
    """Windows ``(start, end)`` of the gradient all-reduce bursts, one per training step.

    Collectives closer than ``gap_s`` belong to the same burst."""
    bursts: list[list[float]] = []
    for s in spans_:
        if not s.tensor.startswith(prefix) or s.depth != 0:
            continue
        if bursts and s.start <= bursts[-1][1] + gap_s:
            bursts[-1][1] = max(bursts[-1][1], s.end)
        else:
            bursts.append([s.start, s.end])
    return [(a, b) for a, b in bursts]


def plot(
    spans_: Sequence[Span],
    *,
    window: tuple[float, float] | None = None,
    prefix: str = "allreduce.",
    ax: Any = None,
    max_tensors: int = 40,
    title: str | None = None,
    marks: Sequence[tuple[str, int, float]] = (),
) -> Any:
    """Draw the phases of each tensor over time: one row per tensor, one colour per phase.

    ``marks`` (from :func:`ready_marks`) adds a tick where each rank reported the tensor ready:
    the yellow negotiation lasts until the slowest rank is ready. ``window`` (seconds) zooms on part of the run, e.g. one step from
    :func:`steps`. Rows are ordered by when the tensor's first phase starts, so the gradients
    that backward produces first are on top. Returns the matplotlib Axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    chosen = [s for s in spans_ if s.tensor.startswith(prefix)]
    if window is not None:
        chosen = [s for s in chosen if s.end >= window[0] and s.start <= window[1]]
    if not chosen:
        raise ValueError(f"no timeline events for tensors named {prefix}* in this window")
    t0 = window[0] if window is not None else min(s.start for s in chosen)
    first: dict[str, float] = {}
    for s in chosen:
        first[s.tensor] = min(first.get(s.tensor, s.start), s.start)
    tensors = sorted(first, key=first.__getitem__)[:max_tensors]
    row = {t: i for i, t in enumerate(tensors)}
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.28 * len(tensors) + 1.5))
    seen: dict[str, str] = {}
    for s in chosen:
        if s.tensor not in row:
            continue
        colour = COLOURS.get(s.phase, "#999999")
        seen[s.phase] = colour
        height = 0.8 if s.depth == 0 else 0.45
        y = row[s.tensor] - height / 2
        ax.broken_barh([((s.start - t0) * 1e3, max(s.duration * 1e3, 0.05))], (y, height), color=colour)
    for tensor, rank, t in marks:
        if tensor in row and (window is None or window[0] <= t <= window[1]):
            ax.plot([(t - t0) * 1e3], [row[tensor]], marker="|" if rank == 0 else "x", color="black", ms=7)
    ax.set_yticks(range(len(tensors)))
    ax.set_yticklabels([t[len(prefix):] if t.startswith(prefix) else t for t in tensors], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title or "Horovod timeline (rank 0's view)")
    ax.legend(handles=[Patch(color=c, label=p) for p, c in seen.items()], fontsize=7, loc="lower right")
    return ax
