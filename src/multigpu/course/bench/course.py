"""Sections 3 and 4: every solution notebook top to bottom, and grading the reference."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from multigpu.core import layout
from multigpu.course.bench.report import (
    CELL_TIMEOUT_S,
    REPO,
    WORKSHOP_LEARNERS,
    Figure,
    Plan,
    Section,
    Target,
    environ,
    first_line,
    fmt,
    interleave,
    steps,
)

# --------------------------------------------------------------------------- 3. the course


def solution_notebooks(repo: Path = REPO) -> list[Path]:
    """Every notebook of the course: the labs, then the assessment."""
    return [p for folder in layout.ASSIGNMENTS for p in sorted((repo / layout.SOLUTIONS / folder).glob("*.ipynb"))]


def run_notebook(path: Path, *, quick: bool, record_reference: str = "") -> float:
    """Run a notebook top to bottom with papermill in a scratch copy of its folder; its wall time.

    Like ``tests/test_notebooks.py``: files the notebook writes never land in the repository.
    A cell that runs longer than :data:`CELL_TIMEOUT_S` raises. A ``record_reference`` (the command,
    for the files) makes the notebook's figures the new reference run (``figures.reference``).
    """
    import papermill

    with tempfile.TemporaryDirectory(prefix="multigpu-bench-nb-") as tmp:
        work = Path(tmp) / path.parent.name
        shutil.copytree(path.parent, work, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        with environ(MULTIGPU_QUICK="1" if quick else "0", MULTIGPU_RECORD_REFERENCE=record_reference):
            t0 = time.perf_counter()
            papermill.execute_notebook(
                str(work / path.name), str(Path(tmp) / f"executed-{path.name}"), cwd=str(work),
                kernel_name="python3", progress_bar=False, request_save_on_cell_execute=False,
                execution_timeout=CELL_TIMEOUT_S,
            )
            return time.perf_counter() - t0


def bench_course(plan: Plan, deadline: float) -> Section:
    """Section 3: every solution notebook top to bottom, one run each, and their sum."""
    section = Section("course", "The course: every solution notebook top to bottom")
    params = "quick parameters" if plan.quick else ""
    notebooks = solution_notebooks()
    if not notebooks:
        raise FileNotFoundError(f"no notebooks under {REPO / 'solutions'}")
    section.notes += [
        f"papermill, each notebook in a scratch copy of its folder, MULTIGPU_QUICK={int(plan.quick)} "
        f"({'QUICK parameters: not the course a learner runs' if plan.quick else 'default parameters'}); "
        "one run each (n=1). The assessment notebook runs the grader.",
    ]
    if not any(p.parent.name == layout.ASSESSMENT for p in notebooks):
        section.notes.append("solutions/assessments/ holds no notebook yet: the course total covers the labs only.")
    failed = []
    with steps("course", len(notebooks)) as log:
        for path in notebooks:
            name = str(path.relative_to(REPO / layout.SOLUTIONS))
            log.starting(f"{name} ({params or 'default parameters'})")
            figure = Figure(name, "s", target=Target("<", 5 * 60), note=params)
            try:
                figure.samples.append(run_notebook(path, quick=plan.quick, record_reference=plan.record_reference))
                log.finished(f"{name}: {fmt(figure.samples[0], 's')}")
            except Exception as exc:  # a failing notebook is reported, the others still run
                figure.error = first_line(exc)
                failed.append(name)
                log.finished(f"{name}: FAILED ({figure.error})")
            section.figures.append(figure)
    whole = Figure("whole course end to end", "s", target=Target("<", 23 * 60), note=params)
    if failed:
        whole.error = f"incomplete: {', '.join(failed)} failed"
        section.status, section.error = "error", whole.error
    else:
        whole.samples.append(sum(f.samples[0] for f in section.figures))
    section.figures.append(whole)
    return section


# --------------------------------------------------------------------------- 4. grading


def bench_grading(plan: Plan, deadline: float) -> Section:
    """Section 4: grading the reference solution, as often as ``plan`` and the ``deadline`` allow."""
    section = Section("grading", "Grading: the reference assessment solution, end to end")
    from multigpu.grading import grader, rules

    params = "quick parameters" if plan.quick else ""
    times: list[float] = []
    verdicts: list[str] = []
    # rules.settings() and the grader read MULTIGPU_QUICK: pin it to the parameters asked for
    with environ(MULTIGPU_QUICK="1" if plan.quick else "0"), steps("grading", plan.grading_repeats) as log:
        settings = rules.QUICK if plan.quick else rules.settings()
        for r, _ in interleave(["reference"], plan.grading_repeats):
            if times and time.monotonic() + times[-1] > deadline:
                section.notes.append(f"stopped after {len(times)} grading(s): another would pass the "
                                     f"{fmt(plan.budget_s, 's')} budget of the run.")
                break
            log.starting(f"grading the reference solution ({settings.profile} profile), "
                         f"repeat {r + 1}/{plan.grading_repeats}")
            t0 = time.perf_counter()
            result = grader.grade(grader.REFERENCE, settings, echo=False)
            times.append(time.perf_counter() - t0)
            verdicts.append(f"{'passed' if result.passed else 'FAILED'} (score {result.score})")
            log.finished(f"grade: {fmt(times[-1], 's')}, {verdicts[-1]}")
    section.notes += [
        f"`grader.grade(grader.REFERENCE, rules.{'QUICK' if plan.quick else 'settings()'})`, "
        f"profile `{settings.profile}`; verdicts: {', '.join(verdicts)}.",
        f"Workshop: {WORKSHOP_LEARNERS} x the grading time, graded one after another on this machine.",
    ]
    section.figures = [
        Figure("grade one submission", "s", times, Target("<=", 3 * 60), note=params),
        Figure(f"{WORKSHOP_LEARNERS}-learner workshop, sequential", "s", [WORKSHOP_LEARNERS * t for t in times],
               Target("<=", 90 * 60), note=params),
    ]
    return section


