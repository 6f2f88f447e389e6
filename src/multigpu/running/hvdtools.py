"""Horovod helpers for Lab 3: an all-reduce timer, composing the learner's script, running it.

The run records the scripts write are read by :mod:`multigpu.running.run_records`.

Waiting for an all-reduce on a CPU-only machine: ``optimizer.step()`` waits for the gradients'
all-reduce in ``hvd.synchronize()``. Horovod 0.28.1 implements that wait as a poll-and-yield loop,
which on a GPU machine costs one otherwise idle core but on a CPU-only machine takes the core the
worker's own Horovod background thread (which runs the all-reduce) and the other workers need.
The project's patch of Horovod (``tools/horovod-0.28.1.patch``, item 4) makes the wait sleep until
the background thread reports the handle done, so a plain Horovod script needs nothing more.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import sys
import textwrap
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multigpu.running.launch import JobWrapper


def allreduce_times(numel: int, warmup: int, reps: int) -> list[float]:
    """In a Horovod worker (under horovodrun): seconds of each of ``reps`` timed in-place sums
    of ``numel`` float32, after ``warmup`` untimed ones (connections set up, buffers allocated),
    each waited for with ``hvd.synchronize`` as a training step waits. ``make bench`` and Lab 4's
    links time with it."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    tensor = torch.ones(numel)
    times = []
    for i in range(warmup + reps):
        t0 = time.perf_counter()
        hvd.synchronize(hvd.allreduce_async_(tensor, op=hvd.Sum, name="bench.allreduce"))
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


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
    "save_record",
)
REFERENCE_MODULE = "multigpu.running.scripts.train_horovod"
DDP_MODULE = "multigpu.running.scripts.train_ddp"


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
    header = f"# Written by multigpu.running.hvdtools.compose_script: {reference.name} with your {names}.\n"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + "".join(lines))
    ast.parse(path.read_text())  # fail here, not on every worker, if the result is not Python
    return path


def _command(script: str | Path | None, module: str | None) -> list[str]:
    if (script is None) == (module is None):
        raise ValueError("pass exactly one of script= or module=")
    return [sys.executable, str(script)] if script is not None else [sys.executable, "-m", module]  # type: ignore[list-item]


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
    link: JobWrapper | None = None,
) -> list[dict[str, Any]]:
    """Run a training script with ``np`` workers and ``--record --out out``; return its records.

    ``launcher``: ``"horovodrun"`` (Horovod scripts, any ``np``; MPI where Horovod has it),
    ``"horovodrun --gloo"`` (the same over Gloo), ``"torchrun"`` (the DDP script), or
    ``"python"`` (one plain process, ``np`` must be 1). Old records in ``out`` are
    removed first. Output is streamed live; a crash or a hang raises ``launch.WorkerError``.
    ``link``: a :class:`multigpu.labs.lab4.links.EmulatedLink` the workers' traffic crosses (horovodrun only;
    the job runs over Gloo).
    """
    from multigpu.running import launch, run_records

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("rank*.json"):
        old.unlink()
    if script is None and module is None:
        module = REFERENCE_MODULE
    argv = [*_command(script, module), *map(str, args), "--record", "--out", str(out)]
    if launcher in ("horovodrun", "horovodrun --gloo"):
        launch.horovodrun(argv, np, timeout=timeout, env=env, echo=echo, horovod_args=launcher.split()[1:], link=link)
    elif link is not None:
        raise ValueError("an emulated link carries a horovodrun job: launcher='horovodrun'")
    elif launcher == "torchrun":
        launch.torchrun(argv[1:], np, timeout=timeout, env=env, echo=echo)
    elif launcher == "python":
        if np != 1:
            raise ValueError("launcher='python' runs one process: np must be 1")
        launch.run_command(argv, label="python", what="the script", timeout=timeout, env=env, echo=echo)
    else:
        raise ValueError(f"unknown launcher {launcher!r}")
    return run_records.read_records(out, np)
