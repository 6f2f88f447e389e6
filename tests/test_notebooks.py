"""Every solution notebook runs top to bottom (papermill, quick mode unless MULTIGPU_QUICK=0).

Each notebook runs in a scratch copy of its folder, so files it writes (scripts, checkpoints)
never land in the repo. `make course` runs the same test with the default (full) parameters.
"""

from __future__ import annotations

import os
import shutil
import time

import papermill
import pytest

from conftest import REPO

NOTEBOOKS = sorted(p for p in (REPO / "solutions").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def test_there_are_notebooks_to_run():
    assert any(p.name.startswith("00-") for p in NOTEBOOKS), "solutions/notebooks/00-welcome.ipynb is missing"


@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[str(p.relative_to(REPO / "solutions")) for p in NOTEBOOKS])
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
    mode = "quick" if os.environ.get("MULTIGPU_QUICK", "") not in ("", "0") else "full"
    print(f"{notebook.name}: {time.perf_counter() - start:.0f} s ({mode} parameters)")
