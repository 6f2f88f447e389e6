"""The per-rank run record of the course's training scripts, and what Lab 3 and the bench make of it.

``python -m multigpu.running.scripts.train_horovod --record --out DIR`` (and its DDP twin) makes every
rank write ``DIR/rank<R>.json``: its rank and world, thread count, weight checksums at the start
and the end, the data shard, local and averaged metrics, the training history, CPU and wall time.
:mod:`multigpu.labs.lab3.record_checks` verifies the facts of a correct run on them; :func:`scaling_rows` turns
runs into a scaling table (Lab 3, ``make bench``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class RunClock:
    """CPU and wall time of this process since it was made (the record's ``cpu_s``/``wall_s``)."""

    def __init__(self) -> None:
        self.cpu0, self.wall0 = time.process_time(), time.perf_counter()

    def as_dict(self) -> dict[str, float]:
        return {"cpu_s": time.process_time() - self.cpu0, "wall_s": time.perf_counter() - self.wall0}


def make_record(rank: int, facts: dict[str, Any], clock: RunClock) -> dict[str, Any]:
    """This rank's run record: its facts, its CPU and wall time, when and by which process."""
    return {"rank": rank, **facts, **clock.as_dict(), "time": time.time(), "pid": os.getpid()}


def record_path(out: str | Path, rank: int) -> Path:
    """Where rank ``rank`` writes its record: ``out/rank<R>.json`` (one file per rank, none shared)."""
    return Path(out) / f"rank{rank}.json"


def write_record(out: Path, rank: int, facts: dict[str, Any], clock: RunClock) -> Path:
    """Write this rank's run record ``out/rank<R>.json`` (read by :func:`read_records`). The Horovod
    script has its learner write it instead (step 9, ``save_record``)."""
    path = record_path(out, rank)
    path.write_text(json.dumps(make_record(rank, facts, clock)))
    return path


def read_records(out: str | Path, size: int) -> list[dict[str, Any]]:
    """The ``rank<R>.json`` records a ``--record`` run left in ``out``, in rank order."""
    records = []
    for rank in range(size):
        path = record_path(out, rank)
        if not path.exists():
            raise FileNotFoundError(
                f"rank {rank} left no record {path}: every rank writes its own record (save_record, step 9, "
                f"not on rank 0 only); did the script run with --record and --out {out}, and with {size} workers?"
            )
        record = json.loads(path.read_text())
        if record.get("rank") != rank:
            raise ValueError(f"{path} holds the record of rank {record.get('rank')}, not rank {rank}: name each "
                             "rank's file by its own hvd.rank()")
        records.append(record)
    return records


def throughput(records: Sequence[dict[str, Any]]) -> float:
    """Aggregate images/s of a run: the median over its epochs of rank 0's averaged figure."""
    values = sorted(v for v in records[0]["history"]["images_per_s"] if v)
    if not values:
        return 0.0
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def scaling_rows(runs: dict[tuple[str, int], Sequence[dict[str, Any]]], cores: int | None = None) -> list[dict[str, Any]]:
    """One row per run ``(label, workers) -> records``: throughput, speed-up over the 1-worker
    run of the same label (or any 1-worker run), the ideal ``min(workers, devices)`` and the
    efficiency = speed-up / ideal; time to accuracy when reached."""
    from multigpu.core import devices

    info = devices.detect()
    if cores is not None:
        info = devices.MachineInfo(info.mode, cores, info.gpus, info.gpu_names, info.torch_version)
    singles = {label: throughput(r) for (label, n), r in runs.items() if n == 1}
    any_single = next(iter(singles.values()), None)
    rows = []
    for (label, n), recs in runs.items():
        rate = throughput(recs)
        base = singles.get(label, any_single)
        ideal = devices.ideal_factor(n, info)
        speedup = rate / base if base else float("nan")
        rows.append({
            "run": label, "workers": n, "images_per_s": rate, "speedup": speedup, "ideal": ideal,
            "efficiency": speedup / ideal, "time_to_accuracy_s": recs[0]["history"].get("time_to_accuracy_s"),
            "final_val_acc": (recs[0]["history"]["val_acc"] or [None])[-1],
            "cpu_s_per_image": (sum(r.get("cpu_s", 0.0) for r in recs)
                                / max(1, sum(r["history"]["steps"] for r in recs) * recs[0]["args"]["batch_size"])),
        })
    return rows


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """A plain-text table of :func:`scaling_rows`."""
    head = f"{'run':<16}{'workers':>8}{'img/s':>9}{'speed-up':>10}{'ideal':>7}{'efficiency':>12}{'to target':>11}"
    lines = [head, "-" * len(head)]
    for r in rows:
        tta = f"{r['time_to_accuracy_s']:.1f} s" if r["time_to_accuracy_s"] else "-"
        lines.append(f"{r['run']:<16}{r['workers']:>8}{r['images_per_s']:>9.0f}{r['speedup']:>9.2f}x"
                     f"{r['ideal']:>6}x{r['efficiency']:>11.0%}{tta:>11}")
    return "\n".join(lines)


def plot_scaling(rows: Sequence[dict[str, Any]], ax: Any = None) -> Any:
    """Throughput against workers, one line per run label, with the ideal of this machine."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    labels = list(dict.fromkeys(r["run"] for r in rows))
    base = next((r["images_per_s"] / r["speedup"] for r in rows if r["speedup"] == r["speedup"] and r["speedup"]), None)
    workers = sorted({r["workers"] for r in rows})
    if base:
        ax.plot(workers, [base * max(1, min(w, r_ideal)) for w, r_ideal in
                          zip(workers, [max(x["ideal"] for x in rows if x["workers"] == w) for w in workers])],
                "k--", label="ideal on this machine")
    for label in labels:
        pts = sorted((r["workers"], r["images_per_s"]) for r in rows if r["run"] == label)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
    ax.set_xticks(workers)
    ax.set_xlabel("workers")
    ax.set_ylabel("images/s (all workers)")
    ax.set_ylim(bottom=0)
    ax.legend()
    return ax
