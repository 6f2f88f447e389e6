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

The exchange is nbgrader's, made so that no learner can take it over (:func:`make_exchange`):
the exchange root is world-writable with the sticky bit (1777: nobody moves or deletes what
another made), and the course's folder in it and its ``outbound``, ``inbound`` and ``feedback``
are made at setup, before any learner can, and belong to the instructor. The checkout the hub
serves is closed to learners except for what their servers run (:func:`close_checkout`).
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
# a submission's folder in the exchange is the learner's alone (nbgrader makes it 777)
c.ExchangeFactory.submit = "multigpu.workshop.exchange.PrivateSubmit"
'''

#: The checkout's entries learners' servers need (the package they import, their Jupyter config)
#: and the course's own environment (``make setup``: a grading run as root from it runs it in the
#: sandbox as an unprivileged account); every other entry (solutions/ first of all) is closed to
#: them by :func:`close_checkout`.
CHECKOUT_OPEN = ("src", "jupyter", ".venv")


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


def make_exchange(hub: Hub, uid: int, gid: int) -> None:
    """The exchange (module doc): root's, 1777; the course's folder and its three parts the
    instructor's (``uid:gid``), as nbgrader makes them but for ``inbound``, sticky (1733: a learner
    can add a submission, not list, rename or remove another's). A part that exists and belongs to
    anyone else is refused: someone made it before setup, and its contents cannot be trusted."""
    from multigpu.workshop.safefiles import DIR_FLAGS, opened

    course = hub.exchange / layout.COURSE_ID
    for folder, owner, mode in ((hub.exchange, 0, 0o1777), (course, uid, 0o755), (course / "outbound", uid, 0o755),
                                (course / "inbound", uid, 0o1733), (course / "feedback", uid, 0o711)):
        try:
            os.mkdir(folder, 0o700)
            new = True
        except FileExistsError:
            new = False
        with opened(os.open(folder, DIR_FLAGS)) as fd:  # a link in its place is refused here
            if new:
                os.fchown(fd, owner, gid if owner else 0)
            if os.fstat(fd).st_uid != owner:
                raise PermissionError(f"{folder} belongs to uid {os.fstat(fd).st_uid}, not {owner}: someone made it "
                                      "before the hub's setup; move it aside and run the setup again")
            os.fchmod(fd, mode)


def close_checkout(root: Path) -> list[str]:
    """Close the checkout the hub serves to every account but its owner's, except what learners'
    servers run (:data:`CHECKOUT_OPEN`): the folder itself 711 (enter, not list), every other entry
    without permissions for group and others. Returns the entries closed."""
    os.chmod(root, (root.stat().st_mode & 0o700) | 0o011)
    closed = []
    for entry in sorted(root.iterdir()):
        if entry.name in CHECKOUT_OPEN or entry.is_symlink():
            continue
        entry.chmod(entry.stat().st_mode & 0o700)
        closed.append(entry.name)
    return closed


def setup(hub: Hub, instructor: str = layout.INSTRUCTOR, course_root: Path | None = None) -> list[str]:
    """Lay out the hub's folders (idempotent; root): the course owned by ``instructor``, the
    exchange, the learners' config, the root-only state; the checkout closed. Returns the
    assignments."""
    from multigpu.workshop.safefiles import chown_tree

    hub.root.mkdir(parents=True, exist_ok=True)
    os.chmod(hub.root, 0o755)
    made = write_sources(hub, course_root)
    (hub.course / "nbgrader_config.py").write_text(COURSE_CONFIG.format(
        course=str(hub.course), course_id=layout.COURSE_ID, db_url=hub.db_url, exchange=str(hub.exchange),
        assessment=layout.ASSESSMENT))
    user = pwd.getpwnam(instructor)
    chown_tree(hub.course, user.pw_uid, user.pw_gid)
    os.chmod(hub.course, 0o700)
    make_exchange(hub, user.pw_uid, user.pw_gid)
    hub.learner_config.mkdir(parents=True, exist_ok=True)
    (hub.learner_config / "nbgrader_config.py").write_text(LEARNER_CONFIG.format(
        course_id=layout.COURSE_ID, exchange=str(hub.exchange)))
    for p in (hub.learner_config.parent, hub.learner_config, hub.learner_config / "nbgrader_config.py"):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    for p in (hub.state, hub.results, hub.certificates, hub.submissions, hub.scratch):
        p.mkdir(parents=True, exist_ok=True)
    os.chmod(hub.state, 0o700)
    os.chmod(hub.scratch, 0o711)
    close_checkout(course_root or course_layout.course_root())
    return made


def release(hub: Hub, assignment: str, instructor: str) -> None:
    """What the formgrader's Generate and Release buttons run, as ``instructor``, in the hub's course
    (``make hub-release``). Raises KeyError for an unknown account, RuntimeError with nbgrader's
    words when a step fails."""
    import subprocess
    import sys

    from multigpu.workshop import accounts

    try:
        pw = pwd.getpwnam(instructor)
    except KeyError:
        raise KeyError(f"no account {instructor!r}: make hub creates the instructor's") from None
    nbgrader = str(Path(sys.executable).parent / "nbgrader")
    env = {"HOME": pw.pw_dir, "USER": instructor,
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), accounts.SYSTEM_PATH])}
    for step in (["generate_assignment", assignment, "--force"], ["release_assignment", assignment]):
        done = subprocess.run(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", "--",
                               nbgrader, *step], cwd=hub.course, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"nbgrader {step[0]} {assignment} as {instructor} failed:\n{done.stdout}{done.stderr}")
