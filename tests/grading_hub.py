"""A small workshop hub for tests that grade through the real grading job (``multigpu workshop
grade-job``): one lab, ``lab-00``, whose one notebook asks for a function and checks it in a graded
test cell (1 point), released into the hub course's gradebook by nbgrader; learners' submissions
placed where the service keeps the copy it takes on arrival, and queued. A grading of it is real:
nbgrader's autograde as the grading account in the grading sandbox, the scores read back and
recorded, the feedback released. A right answer scores 1/1, a wrong one 0/1, a slow one 1/1
after 40 s, one that sleeps runs until something stops it.

The hub lives in a folder of its own under /srv (``/tmp`` is hidden from the grading sandbox, and
a Slurm node of the test cluster sees the same file system), owned by root, which acts as the
instructor."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from pathlib import Path

from multigpu.workshop import course, jobs, layout, submissions
from multigpu.workshop.layout import Hub

ASSIGNMENT = "lab-00"
NOTEBOOK = "00-welcome"
PREFIX = "multigpu-grading-test-"
ANSWERS = {
    "right": "def double(x):\n    return 2 * x",
    "wrong": "def double(x):\n    return x + 1",
    "slow": "import time\ntime.sleep(40)\ndef double(x):\n    return 2 * x",
    "sleeps": "import time\ntime.sleep(3600)\ndef double(x):\n    return 2 * x",
}


def cell(kind: str, source: str, **nbgrader) -> dict:
    made = {"cell_type": kind, "id": nbgrader.get("grade_id", "intro"), "metadata": {}, "source": source}
    if nbgrader:
        made["metadata"]["nbgrader"] = {"schema_version": 3, "locked": False, "solution": False, "grade": False,
                                        "task": False, **nbgrader}
    if kind == "code":
        made.update(execution_count=None, outputs=[])
    return made


def notebook(answer: str) -> dict:
    cells = [cell("markdown", "Write `double(x)`."),
             cell("code", answer, grade_id="double", solution=True),
             cell("code", 'assert double(3) == 6, "double(3) should be 6"', grade_id="test_double", grade=True,
                  locked=True, points=1)]
    return {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                        "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}


def graded_outputs(hub: Hub, student: str) -> str:
    """The text the answer cell of ``student``'s autograded notebook printed."""
    nb = json.loads((hub.course / "autograded" / student / ASSIGNMENT / f"{NOTEBOOK}.ipynb").read_text())
    return "".join("".join(out.get("text", "")) for out in nb["cells"][1].get("outputs", []))


def make_hub(parent: str = "/srv") -> Hub:
    """The hub (module doc), its assignment generated into the instructor's gradebook."""
    from multigpu.workshop import autograde

    hub = Hub(Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent)))
    os.chmod(hub.root, 0o755)
    source = hub.course / "source" / ASSIGNMENT
    source.mkdir(parents=True)
    (source / f"{NOTEBOOK}.ipynb").write_text(json.dumps(notebook(ANSWERS["right"])))
    (hub.course / "nbgrader_config.py").write_text(course.COURSE_CONFIG.format(
        course=str(hub.course), course_id=layout.COURSE_ID, db_url=hub.db_url, exchange=str(hub.exchange),
        assessment=layout.ASSESSMENT))
    os.chmod(hub.course, 0o700)
    course.make_exchange(hub, 0, 0)
    for p in (hub.state, hub.results, hub.certificates, hub.submissions, hub.scratch):
        p.mkdir(parents=True, exist_ok=True)
    os.chmod(hub.state, 0o700)
    os.chmod(hub.scratch, 0o711)
    autograde.run_nbgrader(["generate_assignment", ASSIGNMENT, "--force"], hub.course,
                           what="nbgrader generate_assignment")
    return hub


def submit(hub: Hub, queue: jobs.Queue, student: str, answer: str, stamp: str = "2026-11-28 12:00:00.000000 UTC",
           source: str | None = None) -> jobs.Job:
    """``student``'s submission of the lab with ``answer`` (a key of :data:`ANSWERS`, or its name
    when ``source`` gives the answer cell): its copy where the service keeps one taken on arrival,
    and its job in the queue."""
    name = f"{student}+{ASSIGNMENT}+{stamp}+{answer}"
    copy = submissions.copy_path(hub, name)
    copy.mkdir(parents=True)
    nb = notebook(source or ANSWERS[answer])
    (copy / f"{NOTEBOOK}.ipynb").write_text(json.dumps(nb))
    (copy / "timestamp.txt").write_text(stamp)
    (copy / "submission_secret.txt").write_text(secrets.token_hex(64))  # as nbgrader submit writes it
    return queue.add(name, student, ASSIGNMENT, stamp)


def readable_copy(path: Path, parent: str = "/srv") -> Path:
    """A copy of ``path`` that every account can read, in a folder of its own outside the folders
    the grading sandbox hides."""
    folder = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
    os.chmod(folder, 0o755)
    copy = folder / path.name
    shutil.copyfile(path, copy)
    os.chmod(copy, 0o644)
    return copy


def remove_folder(folder: Path) -> None:
    """Remove a hub or a copy this module made (and nothing else)."""
    if folder.name.startswith(PREFIX):
        shutil.rmtree(folder, ignore_errors=True)


def remove_hub(hub: Hub) -> None:
    from multigpu.workshop import limits

    for group in limits.gradings_of(hub.tag):  # a grading Slurm killed skips its own clean-up
        limits.release(group)
    remove_folder(hub.root)
