"""Solution notebooks run top to bottom (papermill), each in a scratch copy of its folder, so
files it writes (scripts, checkpoints) never land in the repo.

`make course` (MULTIGPU_QUICK=0) runs every notebook here with the default parameters. In
`make test` (quick parameters) each lab notebook runs once, in the nbgrader round trip
(tests/test_nbgrader.py asserts that every cell of every autograded solution ran without an
error); only the assessment notebook runs here as well, because under autograde it leaves the
grading to the official grader and its learner path (the grader run from the kernel) would
otherwise never run.
"""

from __future__ import annotations

import os
import shutil
import time

import papermill
import pytest

from conftest import REPO

NOTEBOOKS = sorted(p for p in (REPO / "solutions").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
QUICK = os.environ.get("MULTIGPU_QUICK", "") not in ("", "0")
RUN_HERE = [p for p in NOTEBOOKS if not QUICK or p.parent.name == "assessments"]


def test_there_are_notebooks_to_run():
    assert any(p.name.startswith("00-") for p in NOTEBOOKS), "solutions/notebooks/00-welcome.ipynb is missing"
    assert any(p.parent.name == "assessments" for p in RUN_HERE), "solutions/assessments/ has no notebook"


@pytest.mark.slow
@pytest.mark.parametrize("notebook", RUN_HERE, ids=[str(p.relative_to(REPO / "solutions")) for p in RUN_HERE])
def test_solution_notebook_runs_top_to_bottom(notebook, tmp_path):
    work = tmp_path / notebook.parent.name
    shutil.copytree(notebook.parent, work, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    start = time.perf_counter()
    papermill.execute_notebook(
        str(work / notebook.name),
        str(tmp_path / f"executed-{notebook.name}"),
        cwd=str(work),
        kernel_name="python3",
        progress_bar=False,
        request_save_on_cell_execute=False,
        execution_timeout=900,  # a cell that hangs (a stuck kernel) fails instead of stalling CI
    )
    mode = "quick" if QUICK else "full"
    print(f"{notebook.name}: {time.perf_counter() - start:.0f} s ({mode} parameters)")
