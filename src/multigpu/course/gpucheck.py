"""``make gpu-check``: every path a GPU changes, run once on this machine, with a report.

A learner with a GPU is the course's likeliest user, and most of the course was written on
machines without one. This runs, in a few minutes on one GPU, each place where GPU mode takes
another road than CPU mode, and says for each: passed, failed (with the error) or not run (and
why: too few GPUs for the path, say). The checks, in order:

==============  ===============================================================================
``machine``     mode detection: CUDA seen, the device's name, the mode a 1-worker and a 4-worker
                job get (one worker per GPU, else CPU workers), ``devices.describe``
``horovod``     Horovod's build (NCCL or its CPU operations) and an all-reduce of CUDA tensors in a
                ``horovodrun`` job of one worker per GPU (at most 4)
``nccl``        torch.distributed's NCCL all-reduce of CUDA tensors (one process per GPU)
``lab0`` ...    the GPU notebooks top to bottom (papermill, default parameters unless ``--quick``):
                Lab 0 (mode and first all-reduce), Lab 1 and Lab 2b on the GPU, Lab 2's input
                pipeline and its mixed-precision, ``channels_last`` and ``torch.compile`` steps,
                Lab 5 (its workers stay CPU processes on every machine: it counts the bytes they
                send through sockets, which NCCL over NVLink does not use)
``pytest-gpu``  the tests marked ``gpu``
``grading``     the assessment's ``gpu`` grading profile on the reference solution where 4 GPUs
                exist; with fewer, the grader's profile choice and why the ``gpu`` profile cannot run
==============  ===============================================================================

Without CUDA ``gpu-check`` runs nothing and says so; ``--rehearse`` runs the same checks on the
CPU (quick parameters), which is how the harness itself is tested on machines without a GPU.
With ``--record`` each notebook's figures become the GPU reference run
(``figures/reference_runs/gpu/``), which notebooks in GPU mode print beside the learner's own.
The report goes to ``bench/gpu-check.md`` and ``bench/gpu-check.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from multigpu.core import devices, layout

REPO = layout.course_root()
REPORT = REPO / "bench" / "gpu-check"
#: The whole check should end within this on one GPU (the issue's budget).
BUDGET_S = 8 * 60
#: Notebooks whose paths change on a GPU (the 4-worker labs 3 and 4 run CPU workers below 4 GPUs).
NOTEBOOKS = ("00-welcome", "01-gd-vs-sgd", "02-alexnet-pipeline", "02b-ring-allreduce", "05-")
HOROVOD_WORKERS_MAX = 4


class NotRun(Exception):
    """A check that cannot run on this machine; the message says why and what ran instead."""


@dataclass
class Context:
    info: devices.MachineInfo
    rehearse: bool  #: no GPU: the same checks on the CPU, quick parameters
    quick: bool  #: notebooks with their quick parameters
    record: str  #: the command, when the notebooks' figures become the GPU reference run

    @property
    def device(self) -> str:
        return "cuda" if self.info.mode == "gpu" else "cpu"


@dataclass
class Outcome:
    name: str
    what: str
    status: str  #: "passed", "FAILED" or "not run"
    seconds: float
    detail: str


@dataclass
class Report:
    machine: str
    started: str
    rehearsal: bool
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "FAILED"]

    def markdown(self) -> str:
        total = sum(o.seconds for o in self.outcomes)
        kind = "REHEARSAL on the CPU (no GPU: nothing here is a GPU figure)" if self.rehearsal else "on the GPU"
        lines = [f"# make gpu-check, {kind}", "", f"- machine: {self.machine}", f"- started: {self.started}",
                 f"- total: {total:.0f} s (budget {BUDGET_S} s); {len(self.failed)} failed", "",
                 "| check | what | result | time | detail |", "|---|---|---|---:|---|"]
        for o in self.outcomes:
            detail = o.detail.replace("|", "\\|").replace("\n", "<br>")
            lines.append(f"| {o.name} | {o.what} | {o.status} | {o.seconds:.0f} s | {detail} |")
        return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------- the checks


def check_machine(ctx: Context) -> str:
    info = ctx.info
    one, four = devices.for_workers(1, info), devices.for_workers(4, info)
    want_one = "cpu" if ctx.rehearse else "gpu"
    if one.mode != want_one:
        raise AssertionError(f"a 1-worker job runs in {one.mode} mode; expected {want_one}")
    if not ctx.rehearse and (four.mode == "gpu") != (info.gpus >= 4):
        raise AssertionError(f"a 4-worker job on {info.gpus} GPU(s) runs in {four.mode} mode")
    names = ", ".join(info.gpu_names) or "no GPU"
    return (f"{names}; 1 worker: {one.mode} mode, 4 workers: {four.mode} mode; torch {info.torch_version}; "
            f"{info.cores} CPU cores")


def _horovod_allreduce(device: str) -> dict[str, Any]:
    import horovod.torch as hvd
    import torch

    hvd.init()
    if device == "cuda":
        torch.cuda.set_device(hvd.local_rank())
    x = torch.full((1 << 20,), float(hvd.rank() + 1), device=device)
    y = hvd.allreduce(x, op=hvd.Sum, name="gpu_check")
    return {"device": str(y.device), "value": float(y[0].item()), "size": hvd.size(), "nccl": bool(hvd.nccl_built()),
            "cuda": bool(hvd.cuda_built())}


def check_horovod(ctx: Context) -> str:
    from multigpu.running import launch

    build = devices.horovod_build()
    if not build["installed"]:
        raise AssertionError("Horovod is not installed (make setup, or tools/gpu_check_device.sh on a bare GPU image)")
    np = 2 if ctx.rehearse else max(1, min(ctx.info.gpus, HOROVOD_WORKERS_MAX))
    values = launch.run_horovod(_horovod_allreduce, np, args=(ctx.device,), timeout=240, echo=False)
    want = np * (np + 1) / 2
    wrong = [v for v in values if v["value"] != want or not v["device"].startswith(ctx.device)]
    if wrong:
        raise AssertionError(f"all-reduce of {np} ranks gave {wrong} (expected {want:g} on {ctx.device})")
    v = values[0]
    ops = "NCCL" if v["nccl"] else ("its CPU operations (no NCCL in this build)" if ctx.device == "cuda" else "MPI/Gloo")
    return f"horovodrun -np {np}: sum of {np} ranks' {ctx.device} tensors correct; Horovod's all-reduce ran over {ops}"


def _nccl_allreduce(rank: int, world: int, device: str) -> float:
    import torch
    import torch.distributed as dist

    if device == "cuda":
        torch.cuda.set_device(rank)
    x = torch.full((1 << 20,), float(rank + 1), device=device)
    dist.all_reduce(x)
    return float(x[0].item())


def check_nccl(ctx: Context) -> str:
    from multigpu.running import launch

    n = 2 if ctx.rehearse else max(1, min(ctx.info.gpus, HOROVOD_WORKERS_MAX))
    backend = "gloo" if ctx.rehearse else "nccl"
    values = launch.run(_nccl_allreduce, n, args=(ctx.device,), backend=backend, timeout=180, echo=False)
    want = n * (n + 1) / 2
    if any(v != want for v in values):
        raise AssertionError(f"{backend} all-reduce of {n} ranks gave {values}, expected {want:g}")
    return f"torch.distributed {backend}: {n} process(es), sum correct"


def notebook_check(stem: str) -> Callable[[Context], str]:
    def run(ctx: Context) -> str:
        from multigpu.course.bench.course import run_notebook

        found = sorted((REPO / layout.SOLUTIONS / layout.LABS).glob(f"{stem}*.ipynb"))
        if not found:
            raise NotRun(f"no solutions/{layout.LABS}/{stem}*.ipynb in this checkout")
        seconds = run_notebook(found[0], quick=ctx.quick or ctx.rehearse, record_reference=ctx.record)
        params = "quick" if ctx.quick or ctx.rehearse else "default"
        recorded = "; its figures recorded as the GPU reference run" if ctx.record else ""
        return f"{found[0].name} top to bottom, {params} parameters, {seconds:.0f} s{recorded}"
    return run


def check_pytest_gpu(ctx: Context) -> str:
    from multigpu.running import launch

    argv = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", str(REPO / "tests")]
    result = launch.run_command(argv, label="pytest", what="pytest -m gpu", timeout=300, echo=False, check=False)
    tail = [line for line in result.output if line.strip()][-1:] or ["(no output)"]
    if result.returncodes[0] not in (0,):
        raise AssertionError(f"pytest -m gpu exited {result.returncodes[0]}: {tail[0]}")
    if not ctx.rehearse and "skipped" in tail[0] and "passed" not in tail[0]:
        raise AssertionError(f"every gpu test was skipped on a GPU machine: {tail[0]}")
    return tail[0]


def check_grading(ctx: Context) -> str:
    from multigpu.grading import grader, rules

    chosen = rules.settings()
    if ctx.rehearse or ctx.info.gpus < rules.GPU.workers:
        why = (f"the gpu profile needs {rules.GPU.workers} GPUs (one per worker); this machine has {ctx.info.gpus}, "
               f"so the grader picks the '{chosen.profile}' profile here")
        if chosen.profile == "gpu":
            raise AssertionError(why + ": it should not")
        raise NotRun(why + " (the cpu profile's grading is calibrated on CPU machines: docs/calibration.md)")
    if chosen.profile != "gpu":
        raise AssertionError(f"{ctx.info.gpus} GPUs, but the grader picks the '{chosen.profile}' profile")
    result = grader.grade(grader.REFERENCE, chosen, echo=False)
    if not result.passed:
        raise AssertionError(f"the reference solution failed the gpu profile: {result.score}/{result.max_score}\n"
                             + result.report())
    return f"the reference solution passed the gpu profile: {result.score}/{result.max_score}"


@dataclass(frozen=True)
class Check:
    name: str
    what: str
    run: Callable[[Context], str]


CHECKS: tuple[Check, ...] = (  # the cheap and the most telling first: a cut-off run still says most
    Check("machine", "mode detection, device name", check_machine),
    Check("horovod", "Horovod all-reduce of CUDA tensors", check_horovod),
    Check("nccl", "torch.distributed NCCL all-reduce", check_nccl),
    Check("pytest-gpu", "tests marked gpu", check_pytest_gpu),
    Check("lab0", "Lab 0: mode, first all-reduce", notebook_check("00-welcome")),
    Check("lab2", "Lab 2: pipeline, AMP, channels_last, torch.compile", notebook_check("02-alexnet-pipeline")),
    Check("lab1", "Lab 1 on the GPU", notebook_check("01-gd-vs-sgd")),
    Check("lab2b", "Lab 2b: ring all-reduce", notebook_check("02b-ring-allreduce")),
    Check("lab5", "Lab 5 on a GPU machine (its workers stay CPU processes)", notebook_check("05-")),
    Check("grading", "the gpu grading profile", check_grading),
)


def run_checks(ctx: Context, names: list[str] | None = None, echo: Callable[[str], None] = print,
               after_each: Callable[[Report], Any] = lambda report: None) -> Report:
    """Run the checks (``names``, or all) in order; ``after_each`` sees the report after each one
    (``main`` saves it, so a run cut off by its time limit still leaves what it found)."""
    from multigpu.figures import reference

    report = Report(machine=reference.this_machine(), rehearsal=ctx.rehearse,
                    started=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    for check in CHECKS:
        if names and check.name not in names:
            continue
        echo(f"[gpu-check] {check.name}: {check.what} ...")
        t0 = time.perf_counter()
        try:
            status, detail = "passed", check.run(ctx)
        except NotRun as e:
            status, detail = "not run", str(e)
        except Exception as e:  # one failing path is reported; the others still run
            status = "FAILED"
            detail = f"{type(e).__name__}: {e}".strip()
            echo("".join(traceback.format_exception(e))[-2000:])
        outcome = Outcome(check.name, check.what, status, round(time.perf_counter() - t0, 1), detail)
        report.outcomes.append(outcome)
        after_each(report)
        echo(f"[gpu-check] {check.name}: {status} in {outcome.seconds:.0f} s: {detail.splitlines()[0] if detail else ''}")
    return report


def save(report: Report, stem: Path = REPORT) -> tuple[Path, Path]:
    stem.parent.mkdir(parents=True, exist_ok=True)
    md, js = stem.with_suffix(".md"), stem.with_suffix(".json")
    md.write_text(report.markdown())
    js.write_text(json.dumps(asdict(report), indent=2) + "\n")
    return md, js


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="multigpu gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rehearse", action="store_true", help="no GPU: run the same checks on the CPU")
    parser.add_argument("--quick", action="store_true", help="the notebooks with their quick parameters")
    parser.add_argument("--record", action="store_true", help="record the notebooks' figures as the GPU reference run")
    parser.add_argument("--only", nargs="+", choices=[c.name for c in CHECKS], help="run only these checks")
    parser.add_argument("--report", type=Path, default=REPORT, help="report path without suffix (default bench/gpu-check)")
    args = parser.parse_args(argv)
    info = devices.detect()
    if info.mode != "gpu" and not args.rehearse:
        print("gpu-check: no CUDA device here (or MULTIGPU_FORCE_CPU is set): nothing to check. "
              "`multigpu gpu-check --rehearse` runs the same checks on the CPU.", file=sys.stderr)
        return 2
    if args.record and args.rehearse:
        parser.error("--record makes GPU reference runs: not in a rehearsal on the CPU")
    record = "make gpu-check RECORD=1" if args.record else ""
    report = run_checks(Context(info, args.rehearse, args.quick, record), args.only,
                        after_each=lambda r: save(r, args.report))
    md, js = save(report, args.report)
    print(report.markdown())
    print(f"report: {md} and {js}")
    return 1 if report.failed else 0
