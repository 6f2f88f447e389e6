"""Sizing a workshop box (multigpu workshop measure-labs): a notebook's CPU time, read from its own
control group (root) or from the children's rusage, and a room's needs at a stated pace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multigpu.workshop import roomsize
from multigpu.workshop.roomsize import LabUse

BURN_S = 1.5


def _notebook(path: Path, *sources: str) -> Path:
    cells = [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
              "source": src} for i, src in enumerate(sources)]
    path.write_text(json.dumps({"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                            "language": "python"}},
                                "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_room_turns_cpu_seconds_into_cores_per_learner_at_a_pace():
    uses = [LabUse("a.ipynb", cpu_s=300, wall_s=200, peak_cores=2.0, peak_mem_gb=1.0, ok=True),
            LabUse("b.ipynb", cpu_s=60, wall_s=90, peak_cores=0.5, peak_mem_gb=0.5, ok=True)]
    need = roomsize.room(uses, {"a.ipynb": 50, "b.ipynb": 10}, reruns=2, cores=16)
    # 2 x 360 CPU s over 60 minutes of work: 0.2 cores on average while a learner works
    assert need["average_cores_per_learner"] == pytest.approx(0.2)
    assert need["learners_per_core"] == pytest.approx(5.0)
    assert need["learners_on_box"] == pytest.approx(80.0)
    assert need["peak_cores_per_learner"] == 2.0


@pytest.mark.slow
def test_measure_counts_the_cpu_time_of_the_whole_process_tree(tmp_path):
    """The busy loop runs in a process the kernel starts: its CPU time is counted all the same."""
    burn = ("import subprocess, sys\n"
            f"subprocess.run([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
            f"while time.process_time() - t < {BURN_S}: pass'], check=True)")
    use = roomsize.measure(_notebook(tmp_path / "burn.ipynb", burn))
    assert use.ok, use.error
    assert use.cpu_s >= BURN_S * 0.95, use
    assert use.wall_s >= BURN_S * 0.95
    if use.peak_cores is not None:  # a control group was writable (root): the peak was sampled
        assert 0 < use.peak_cores <= len(__import__("os").sched_getaffinity(0)) + 0.5
        assert use.peak_mem_gb is not None and use.peak_mem_gb > 0


@pytest.mark.slow
def test_measure_reports_a_failing_notebook(tmp_path):
    use = roomsize.measure(_notebook(tmp_path / "broken.ipynb", "raise ValueError('the lab is broken')"))
    assert not use.ok and "the lab is broken" in use.error and use.cpu_s > 0


def test_a_failure_is_reported_by_its_exception_not_the_progress_printed_after_it():
    stderr = ("Traceback (most recent call last):\n  File 'x'\n"
              "papermill.exceptions.PapermillExecutionError: An error occurred while executing cell 12:\n"
              "AssertionError: the scaling check failed\n"
              "epoch 1/3 | train loss 2.140 acc 0.185\n")
    assert roomsize.last_error(stderr) == "AssertionError: the scaling check failed"
    assert roomsize.last_error("just a line\n") == "just a line"
    assert roomsize.last_error("") == "failed with no message"
