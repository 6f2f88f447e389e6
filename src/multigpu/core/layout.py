"""The course's folders: one place that knows where the course is and what its parts are called.

A course root holds ``nbgrader_config.py`` and ``solutions/`` (the instructor's sources). From
them nbgrader releases the learner copies (``notebooks/`` for the labs, ``assessments/`` for the
assessment); ``grading/`` holds the gradebook and the submissions. :func:`course_root` finds the
root: ``$MULTIGPU_COURSE_ROOT`` when set, else the nearest folder above this package that is a
course (the checkout every ``make`` target and test uses), else the nearest one above the
current directory. Course tooling (release, bench, the grader's reference solution, the
certificate key check) takes the root from here, or as an argument.
"""

from __future__ import annotations

import os
from pathlib import Path

import multigpu

#: The instructor's sources, released by nbgrader.
SOLUTIONS = "solutions"
#: The nbgrader assignment of the labs (Labs 0-4) and of the assessment.
LABS = "notebooks"
ASSESSMENT = "assessments"
ASSIGNMENTS = (LABS, ASSESSMENT)
#: The gradebook, the collected submissions and what autograde makes of them.
GRADING = "grading"
#: The file that marks a course root (nbgrader reads it).
MARKER = "nbgrader_config.py"
#: The folder from which ``import multigpu`` works (``src/`` in a checkout): what worker
#: processes and the grading sandbox put on ``PYTHONPATH``.
IMPORT_ROOT = Path(multigpu.__file__).resolve().parent.parent


def is_course(folder: Path) -> bool:
    """Whether ``folder`` is a course root (``nbgrader_config.py`` and ``solutions/``)."""
    return (folder / MARKER).is_file() and (folder / SOLUTIONS).is_dir()


def course_root() -> Path:
    """The course root (see the module docstring); raises with what to do when there is none."""
    given = os.environ.get("MULTIGPU_COURSE_ROOT")
    if given:
        root = Path(given).expanduser().resolve()
        if not is_course(root):
            raise FileNotFoundError(f"MULTIGPU_COURSE_ROOT={given} is not a course root "
                                    f"(it needs {MARKER} and {SOLUTIONS}/)")
        return root
    for start in (Path(__file__).resolve().parent, Path.cwd().resolve()):
        for folder in (start, *start.parents):
            if is_course(folder):
                return folder
    raise FileNotFoundError(f"no course root above {Path(__file__).parent} or {Path.cwd()}: run from the "
                            f"course's folder or set MULTIGPU_COURSE_ROOT (a folder with {MARKER} and {SOLUTIONS}/)")


def reference_solution(root: Path | None = None) -> Path:
    """The instructor's converted assessment script (never released)."""
    return (root or course_root()) / SOLUTIONS / ASSESSMENT / "train.py"
