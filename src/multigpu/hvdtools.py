"""Horovod helpers for Lab 3: CPU-mode tuning, composing the learner's script, running and reading runs.

Why Horovod is slow on an oversubscribed CPU, and what :func:`patient_waits` does about it:
``optimizer.step()`` waits for the gradients' all-reduce in ``hvd.synchronize()``, which Horovod
implements as a busy loop (poll, ``std::this_thread::yield()``, poll ...). On a GPU machine that
costs one otherwise idle CPU core. In CPU mode the core it burns is the one the worker's own
Horovod background thread (which runs the Gloo all-reduce) and the other workers need: the
waiting makes the all-reduce slower. :func:`patient_waits` makes the optimizer poll with short
sleeps instead, then calls Horovod's own ``synchronize`` (which returns at once).
"""

from __future__ import annotations

import ast
import builtins
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

#: Seconds between two polls of an unfinished all-reduce in :func:`patient_waits`.
POLL_INTERVAL_S = 2e-4


def patient_waits(optimizer: Any, interval_s: float = POLL_INTERVAL_S) -> Any:
    """Make a Horovod ``DistributedOptimizer`` wait for its all-reduces without spinning.

    Replaces ``optimizer.synchronize`` (called by ``step()``) with one that first polls each
    pending handle with ``hvd.poll`` and sleeps ``interval_s`` between polls, then calls the
    original. Does nothing on an optimizer without Horovod handles or when
    ``MULTIGPU_HOROVOD_SPIN=1`` (Horovod's own busy wait, for comparison). Returns ``optimizer``.
    """
    if os.environ.get("MULTIGPU_HOROVOD_SPIN", "") not in ("", "0") or not hasattr(optimizer, "_handles"):
        return optimizer
    import horovod.torch as hvd

    original = optimizer.synchronize

    def synchronize() -> None:
        for handle, _ in list(optimizer._handles.values()):
            if handle is not None and not callable(handle):
                while not hvd.poll(handle):
                    time.sleep(interval_s)
        return original()

    optimizer.synchronize = synchronize
    return optimizer


# --------------------------------------------------------------------------- the learner's script

#: The conversion steps of Lab 3, in order: the functions of the reference script a learner writes.
STEPS: tuple[str, ...] = (
    "init_horovod",
    "worker_device",
    "make_train_loader",
    "lr_schedule",
    "distribute_optimizer",
    "broadcast_state",
    "average_metric",
    "save_checkpoint",
)
REFERENCE_MODULE = "multigpu.scripts.train_horovod"
DDP_MODULE = "multigpu.scripts.train_ddp"


def reference_path() -> Path:
    """The file of the reference Horovod script."""
    return Path(__file__).resolve().parent / "scripts" / "train_horovod.py"


def _script_names(source: str) -> set[str]:
    """Names defined at the top level of a script (imports, functions, assignments)."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def compose_script(path: str | Path, functions: Iterable[Callable[..., Any]], *, reference: str | Path | None = None) -> Path:
    """Write the reference script to ``path`` with ``functions`` in place of its namesakes.

    Each function must be one of :data:`STEPS` and be defined in a file or notebook cell (its
    source is copied). A function that uses a global name the script does not define (e.g. a
    module imported only in the notebook) is refused with a message saying which name, because
    the script would otherwise fail later on every worker. Returns ``path``.
    """
    reference = Path(reference) if reference else reference_path()
    source = reference.read_text()
    known = _script_names(source) | set(dir(builtins))
    lines = source.splitlines(keepends=True)
    spans: dict[str, tuple[int, int]] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            spans[node.name] = (first - 1, node.end_lineno or node.lineno)
    replacements: list[tuple[int, int, str]] = []
    for fn in functions:
        name = fn.__name__
        if name not in STEPS or name not in spans:
            raise ValueError(f"{name!r} is not one of the script's steps {STEPS}")
        missing = sorted(n for n in inspect.getclosurevars(fn).globals if n not in known)
        if missing:
            raise NameError(
                f"{name}() uses {', '.join(missing)} from the notebook, which the script does not define. "
                f"Use only names the script imports ({', '.join(sorted(_script_names(source) - set(STEPS)))}), "
                "or import inside the function."
            )
        text = textwrap.dedent(inspect.getsource(fn))
        replacements.append((*spans[name], text if text.endswith("\n") else text + "\n"))
    for start, end, text in sorted(replacements, reverse=True):
        lines[start:end] = [text]
    names = ", ".join(fn.__name__ for fn in functions) if replacements else "none"
    header = f"# Written by multigpu.hvdtools.compose_script: {reference.name} with your {names}.\n"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + "".join(lines))
    ast.parse(path.read_text())  # fail here, not on every worker, if the result is not Python
    return path


def _command(script: str | Path | None, module: str | None) -> list[str]:
    if (script is None) == (module is None):
        raise ValueError("pass exactly one of script= or module=")
    return [sys.executable, str(script)] if script is not None else [sys.executable, "-m", module]  # type: ignore[list-item]


def torchrun(
    argv: Sequence[str],
    nproc: int,
    *,
    timeout: float = 300.0,
    env: dict[str, str] | None = None,
    echo: bool = True,
) -> Any:
    """Run ``torchrun --standalone --nproc-per-node=N argv`` bounded in time (like ``launch.horovodrun``).

    ``argv`` starts with the script (``["-m", "pkg.mod", ...]`` or ``["train.py", ...]``).
    """
    from multigpu import launch

    cmd = [launch._bin("torchrun"), "--standalone", f"--nproc-per-node={nproc}", *argv]
    run_env = launch.worker_env(env)
    run_env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.Popen(cmd, env=run_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    what = f"torchrun --nproc-per-node={nproc}"
    result = launch._supervise([proc], ["torchrun"], timeout, echo, what)
    if result.returncodes[0] != 0:
        tail = "\n".join(result.output[-30:])
        raise launch.WorkerError(f"{what} exited with code {result.returncodes[0]}. Last output:\n{tail}")
    return result


def worker_errors(output: Sequence[str], limit: int = 25) -> str:
    """The workers' own traceback lines from ``horovodrun`` output (``[R]<stderr>:...``),
    without horovodrun's traceback of itself, so the learner sees what went wrong in the script."""
    pattern = re.compile(r"^(?:\[horovodrun\] )?\[(\d+)\]<stderr>:(.*)$")
    first: str | None = None
    picked: list[str] = []
    for line in output:
        m = pattern.match(line)
        if not m:
            continue
        rank, text = m.groups()
        if first is None and text.startswith("Traceback"):
            first = rank
        if first == rank:
            picked.append(text)
    if not picked:
        return "Last output:\n" + "\n".join(output[-limit:])
    errors = [t for t in picked if re.match(r"^[A-Za-z_.]*(Error|Exception|Interrupt|Exit)\b", t)]
    summary = f"Rank {first} failed with: {errors[-1]}\n" if errors else ""
    return summary + f"Traceback of rank {first}:\n" + "\n".join(picked[-limit:])


def read_records(out: str | Path, size: int) -> list[dict[str, Any]]:
    """The ``rank<R>.json`` records a ``--record`` run left in ``out``, in rank order."""
    records = []
    for rank in range(size):
        path = Path(out) / f"rank{rank}.json"
        if not path.exists():
            raise FileNotFoundError(
                f"rank {rank} left no record {path}: did the script run with --record and --out {out}, "
                f"and with {size} workers?"
            )
        records.append(json.loads(path.read_text()))
    return records


def run_script(
    np: int,
    args: Sequence[str] = (),
    *,
    out: str | Path,
    script: str | Path | None = None,
    module: str | None = None,
    launcher: str = "horovodrun",
    timeout: float = 180.0,
    env: dict[str, str] | None = None,
    echo: bool = True,
) -> list[dict[str, Any]]:
    """Run a training script with ``np`` workers and ``--record --out out``; return its records.

    ``launcher``: ``"horovodrun"`` (Horovod scripts, any ``np``), ``"torchrun"`` (the DDP
    script), or ``"python"`` (one plain process, ``np`` must be 1). Old records in ``out`` are
    removed first. Output is streamed live; a crash or a hang raises ``launch.WorkerError``.
    """
    from multigpu import launch

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("rank*.json"):
        old.unlink()
    if script is None and module is None:
        module = REFERENCE_MODULE
    argv = [*_command(script, module), *map(str, args), "--record", "--out", str(out)]
    if launcher == "horovodrun":
        result = launch.horovodrun(argv, np, timeout=timeout, env=env, echo=echo, check=False)
        if result.returncodes[0] != 0:
            raise launch.WorkerError(
                f"horovodrun -np {np} failed (exit code {result.returncodes[0]}). "
                + worker_errors(result.output)
            )
    elif launcher == "torchrun":
        torchrun(argv[1:], np, timeout=timeout, env=env, echo=echo)
    elif launcher == "python":
        if np != 1:
            raise ValueError("launcher='python' runs one process: np must be 1")
        proc = subprocess.Popen(argv, env=launch.worker_env(env), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        result = launch._supervise([proc], ["python"], timeout, echo, "python")
        if result.returncodes[0] != 0:
            raise launch.WorkerError("the script exited with code "
                                     f"{result.returncodes[0]}. Last output:\n" + "\n".join(result.output[-30:]))
    else:
        raise ValueError(f"unknown launcher {launcher!r}")
    return read_records(out, np)


# --------------------------------------------------------------------------- reading runs


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
    from multigpu import devices

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
