"""The hub's nbgrader course: one assignment per lab and one for the assessment, and the exchange.

The repository's self-paced layout stays as it is (``make release``: the labs are one
assignment, ``notebooks``). For a hub, :func:`build` lays the same sources out again in the hub's
own course folder, one assignment per lab so the gradebook has a score per lab::

    course/source/lab-00/00-welcome.ipynb
    course/source/lab-02/02-alexnet-pipeline.ipynb, 02b-ring-allreduce.ipynb
    course/source/assessment/assessment.ipynb, train.py (the starter, never the solution)

The instructor releases them from the formgrader (nbgrader's generate and release, into the
exchange); learners fetch and submit from JupyterLab's Assignments tab. The course folder belongs
to the instructor's account (mode 700: hidden tests and solutions stay out of learners' reach).
"""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

from multigpu.core import layout as course_layout
from multigpu.workshop import layout
from multigpu.workshop.layout import Hub

#: Settings the hub course shares with the repository's nbgrader_config.py.
COURSE_CONFIG = '''"""nbgrader configuration of the workshop hub's course (written by multigpu workshop setup)."""
c = get_config()  # noqa: F821
c.CourseDirectory.root = {course!r}
c.CourseDirectory.course_id = {course_id!r}
c.CourseDirectory.db_url = {db_url!r}
c.Exchange.root = {exchange!r}
# training cells run for minutes; the assessment's grading cell leaves the grading to the hub's
# grading service (MULTIGPU_OFFICIAL_GRADING=1 during autograde)
c.Execute.timeout = 1800
c.Execute.interrupt_on_timeout = True
# a learner's edited training script must survive autograde
c.Autograde.exclude_overwriting = {{{assessment!r}: ["train.py"]}}
c.ClearSolutions.code_stub = {{"python": "# YOUR CODE HERE\\nraise NotImplementedError()"}}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
'''

LEARNER_CONFIG = '''"""nbgrader configuration of a workshop learner (written by multigpu workshop setup)."""
c = get_config()  # noqa: F821
c.CourseDirectory.course_id = {course_id!r}
c.Exchange.root = {exchange!r}
'''


def assignments(course_root: Path | None = None) -> dict[str, list[Path]]:
    """``{assignment: [source files]}``: each lab's notebooks by number, then the assessment's
    notebook and the starter script (the learner's ``train.py``)."""
    from multigpu.grading.grader import STARTER

    root = course_root or course_layout.course_root()
    out: dict[str, list[Path]] = {}
    for nb in sorted((root / course_layout.SOLUTIONS / course_layout.LABS).glob("*.ipynb")):
        out.setdefault(layout.lab_assignment(nb.name), []).append(nb)
    out[layout.ASSESSMENT] = sorted((root / course_layout.SOLUTIONS / course_layout.ASSESSMENT).glob("*.ipynb"))
    out[layout.ASSESSMENT].append(STARTER)
    return out


def labs(course_root: Path | None = None) -> list[str]:
    return [a for a in assignments(course_root) if a != layout.ASSESSMENT]


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    os.chown(path, uid, gid)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


def write_sources(hub: Hub, course_root: Path | None = None) -> list[str]:
    """(Re)write ``course/source/<assignment>/`` from the repository's solutions; other course
    folders (releases, submissions, the gradebook) are left as they are."""
    made = []
    for assignment, files in assignments(course_root).items():
        folder = hub.course / "source" / assignment
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        for f in files:
            shutil.copyfile(f, folder / ("train.py" if f.suffix == ".py" else f.name))
        made.append(assignment)
    return made


def setup(hub: Hub, instructor: str = layout.INSTRUCTOR, course_root: Path | None = None) -> list[str]:
    """Lay out the hub's folders (idempotent; root): the course owned by ``instructor``, the
    exchange, the learners' config, the root-only state. Returns the assignments."""
    hub.root.mkdir(parents=True, exist_ok=True)
    os.chmod(hub.root, 0o755)
    made = write_sources(hub, course_root)
    (hub.course / "nbgrader_config.py").write_text(COURSE_CONFIG.format(
        course=str(hub.course), course_id=layout.COURSE_ID, db_url=hub.db_url, exchange=str(hub.exchange),
        assessment=layout.ASSESSMENT))
    user = pwd.getpwnam(instructor)
    _chown_tree(hub.course, user.pw_uid, user.pw_gid)
    os.chmod(hub.course, 0o700)
    # nbgrader's documented exchange: world-writable, and what it creates inside keeps learners
    # from listing each other's submissions (inbound is -wx for them)
    hub.exchange.mkdir(exist_ok=True)
    os.chmod(hub.exchange, 0o777)
    hub.learner_config.mkdir(parents=True, exist_ok=True)
    (hub.learner_config / "nbgrader_config.py").write_text(LEARNER_CONFIG.format(
        course_id=layout.COURSE_ID, exchange=str(hub.exchange)))
    for p in (hub.learner_config.parent, hub.learner_config, hub.learner_config / "nbgrader_config.py"):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    for p in (hub.state, hub.results, hub.certificates, hub.scratch):
        p.mkdir(parents=True, exist_ok=True)
    os.chmod(hub.state, 0o700)
    os.chmod(hub.scratch, 0o711)
    return made
