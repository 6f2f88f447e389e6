"""``make bench``: the course's performance figures on this machine, each against its target.

    multigpu bench [--quick] [--only SECTION ...] [--out bench/]

Sections, run in this order (``--only`` picks some):

- ``pipeline``: images/s of the JPEG read + decode + augment pipeline with the default
  DataLoader settings, against the read + decode bound (Pillow alone on the same files, in as
  many processes as the loader uses). Target: ratio >= 0.9.
- ``scaling``: aggregate images/s of the reference Horovod script and of the DDP script on 1, 2
  and 4 workers (synthetic in-memory data: compute and communication, no JPEG I/O), their
  efficiency against ``devices.ideal_factor(N)`` x one worker of the same launcher with one
  thread, and the time of one all-reduce of AlexNet-small's gradient with Horovod and with raw
  ``torch.distributed`` (Gloo). Targets: Horovod efficiency >= 0.85 at 2 workers and >= 0.80 at
  4; Horovod >= DDP at 2 and 4 workers; Horovod's all-reduce <= 1.10 x raw Gloo.
- ``levers``: Horovod's CPU levers (:data:`LEVERS`) one at a time at 2 and 4 workers, each
  against the one-thread ideal and pinned DDP of the same repeat, and the cores' own ceiling
  (two one-thread workers that never communicate). Targets on the course default as above.
- ``links``: the time of one all-reduce of 4 MiB on 2 Horovod workers (Gloo) behind emulated
  links of 100 Mb/s, 1 Gb/s, 10 Gb/s and the namespace's unlimited loopback
  (:mod:`multigpu.labs.lab4.links`), and measured / predicted by the link-only model. No target: it
  shows where the link, not the CPU, sets the time. Skipped, with the reason, where user
  namespaces are not allowed.
- ``sharding``: Lab 5's sharded optimizer (ZeRO stages 1 and 2 over Horovod, and stage 3 by
  hand) against plain data parallelism on 4 Horovod workers over Gloo, side by side in one job
  per comparison: optimizer state and gradient bytes held per rank (beside ZeRO's formula), bytes
  each rank sends per step (the kernel's count) and step time, as ratios. Targets: state 0.25 x
  (1/N); stage 2's gradient held <= 0.3 x; bytes 1.0 x for stage 2 and 1.5 x for stage 3, within
  10%; step time <= 1.3 x.
- ``course``: wall time of every solution notebook run top to bottom (papermill, default
  parameters; ``--quick``: quick parameters, labelled so) and their sum. One run each (n=1).
  Targets: whole course < 23 min, no notebook > 5 min.
- ``grading``: wall time to grade the reference assessment solution end to end, and the
  projected time of a 30-learner workshop graded one submission after another. Targets: one
  submission <= 3 min (median of 5), the workshop <= 1.5 h. Repeats stop early rather than push
  the run past its time budget.

Method: every figure is the median over repeats with its min-max spread; every comparison is
measured side by side in one run, interleaved (A, B, A, B, ...), because this machine's speed
drifts by a factor of several within minutes. A ratio's samples are the ratios of the pairs
measured next to each other. Targets are goals: a figure that misses one reads "NOT met" and
the run still exits 0. Only a measurement that crashes makes it exit 1 (the results of every
other section are still written).

The package: :mod:`~multigpu.course.bench.report` (the framework), one module per group of sections
(:mod:`~multigpu.course.bench.pipeline`, :mod:`~multigpu.course.bench.scaling`,
:mod:`~multigpu.course.bench.network`, :mod:`~multigpu.course.bench.sharding`, :mod:`~multigpu.course.bench.course`)
and, here, the run.

Writes ``OUT/results.json`` (machine, every sample, every figure) and ``OUT/results.md`` (the
same as tables), after each section, so an interrupted run leaves what it measured.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .course import (  # noqa: F401 - the bench's names, importable as multigpu.course.bench.X
    bench_course,
    bench_grading,
    run_notebook,
    solution_notebooks,
)
from .network import bench_links  # importable as multigpu.course.bench.bench_links
from .pipeline import (  # noqa: F401 - the bench's names, importable as multigpu.course.bench.X
    DecodeBound,
    bench_pipeline,
    decode_files,
)
from .report import (  # noqa: F401 - the bench's names, importable as multigpu.course.bench.X
    ALLREDUCE_WARMUP,
    CELL_TIMEOUT_S,
    DEFAULT,
    QUICK,
    REPO,
    SECTION_NAMES,
    WORKSHOP_LEARNERS,
    Figure,
    Plan,
    Section,
    Spread,
    Steps,
    Target,
    environ,
    figure_row,
    first_line,
    fmt,
    interleave,
    machine,
    machine_markdown,
    paired,
    range_text,
    report_markdown,
    section_markdown,
    spread,
    steps,
    write_results,
)
from .scaling import (  # noqa: F401 - the bench's names, importable as multigpu.course.bench.X
    CONCURRENT,
    LEVER_WORKERS,
    LEVERS,
    bench_levers,
    bench_scaling,
)
from .sharding import bench_sharding  # importable as multigpu.course.bench.bench_sharding
from .warmstart import bench_warm  # importable as multigpu.course.bench.bench_warm

# --------------------------------------------------------------------------- the run

#: Each section gets the plan and the run's deadline (``time.monotonic()`` seconds) and returns its
#: figures; an exception is recorded as the section's error.
SECTIONS: dict[str, Callable[[Plan, float], Section]] = {
    "pipeline": bench_pipeline,
    "warm": bench_warm,
    "scaling": bench_scaling,
    "levers": bench_levers,
    "links": bench_links,
    "sharding": bench_sharding,
    "course": bench_course,
    "grading": bench_grading,
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="multigpu bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="few repeats, quick notebook parameters (~2-3 minutes)")
    p.add_argument("--only", nargs="+", choices=SECTION_NAMES, metavar="SECTION",
                   help=f"run only these sections ({', '.join(SECTION_NAMES)})")
    p.add_argument("--out", type=Path, default=Path("bench"), help="folder for results.json and results.md")
    p.add_argument("--record-reference", action="store_true",
                   help="the course section's run becomes the reference run the notebooks print beside "
                        "the learner's figures (src/multigpu/figures/reference_runs/; commit them)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the selected sections; 1 when a measurement crashed, 0 otherwise (targets met or not)."""
    args = parse_args(argv)
    plan = QUICK if args.quick else DEFAULT
    if args.record_reference:
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        plan = replace(plan, record_reference=f"multigpu bench --only course --record-reference "
                       f"({'quick' if plan.quick else 'default'} parameters; load average at the start {load})")
    names = [n for n in SECTION_NAMES if not args.only or n in args.only]
    start = time.monotonic()
    deadline = start + plan.budget_s
    report: dict[str, Any] = {
        "command": " ".join(["multigpu bench", *(argv if argv is not None else sys.argv[1:])]),
        "quick": plan.quick, "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "duration_s": 0.0, "machine": machine(), "plan": asdict(plan),
    }
    print(machine_markdown(report["machine"]), flush=True)
    sections: list[Section] = []
    for name in names:
        print(f"\n== {name} ==", flush=True)
        t0 = time.monotonic()
        try:
            section = SECTIONS[name](plan, deadline)
        except Exception as exc:  # one crashed section must not lose the others' figures
            traceback.print_exc()
            section = Section(name, name, status="error", error=first_line(exc))
        section.seconds = time.monotonic() - t0
        sections.append(section)
        report["duration_s"] = time.monotonic() - start
        json_path, md_path = write_results(args.out, report, sections)
        print(section_markdown(section), flush=True)
    print(f"results: {json_path} and {md_path} ({fmt(report['duration_s'], 's')})")
    errors = [s.name for s in sections if s.status == "error"]
    if errors:
        print(f"measurement(s) crashed in: {', '.join(errors)}", file=sys.stderr)
    return 1 if errors else 0


