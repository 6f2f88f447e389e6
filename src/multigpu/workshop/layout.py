"""Where a workshop hub keeps its things: everything under one root folder (``$MULTIGPU_HUB_ROOT``,
default ``/srv/multigpu``), so a test can run a whole hub in a temporary folder.

    ROOT/course/        the instructor's nbgrader course (owned by the instructor, mode 700):
                        source/lab-00 ... source/assessment, release/, submitted/, autograded/,
                        feedback/, gradebook.db, nbgrader_config.py
    ROOT/exchange/      nbgrader's exchange (root's, 1777); its course folder and that folder's
                        outbound, inbound (1733: learners write, never list) and feedback belong
                        to the instructor
    ROOT/etc/learner/   the learners' Jupyter config: nbgrader's exchange and course id
    ROOT/state/         root only (700): the hub's database and secrets, the grading queue,
                        the copy of each submission taken when it arrived (submissions/), the
                        official results, certificates
    ROOT/scratch/       one folder per grading (711; each job's folder is root's, group the
                        grading account, 710: the grading account enters the course in it;
                        a file system of its own size while the grading runs: disks.grading_space)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ROOT = "/srv/multigpu"
#: nbgrader's course id on the hub (the exchange's folder, the learners' Assignments tab).
COURSE_ID = "multigpu"
#: What nbgrader's submit writes into every submission: the time it was made (grading and feedback need it).
STAMP_FILE = "timestamp.txt"
#: The assessment's assignment on the hub (the labs are lab-00 ... lab-05).
ASSESSMENT = "assessment"
#: Unix groups: every learner account, the instructor accounts.
LEARNERS_GROUP = "multigpu-learners"
INSTRUCTORS_GROUP = "multigpu-instructors"
#: The unprivileged account that runs learners' notebooks during autograding.
GRADER_USER = "multigpu-grader"
#: The hub's default instructor account (the formgrader's owner, a hub admin).
INSTRUCTOR = "instructor"
#: The box's own addresses of a hub (on 127.0.0.1): its API, the proxy's API, the grading
#: service. Ports below 1024 (``net.ipv4.ip_unprivileged_port_start``), which only root may listen
#: on: the proxy keeps sending ``/hub/`` and ``/services/grading/`` there while the hub restarts,
#: and a learner's process listening on one meanwhile would answer on the hub's origin (a login
#: page of its own, its script) and be sent the proxy's token.
HUB_INTERNAL_PORT, PROXY_API_PORT, GRADING_PORT = 881, 882, 883
#: Where the system's tools live (a hub's PATH may leave out the sbin folders).
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
#: The box's folders every account may write into: each learner's server sees its own, empty
#: (``namespaces``), so nothing of the hub may live under them.
PRIVATE_FOLDERS = ("/dev/shm", "/tmp", "/var/tmp", "/run/lock")


def lab_assignment(notebook: str) -> str:
    """The hub assignment of a lab notebook: ``02b-ring-allreduce.ipynb`` belongs to ``lab-02``."""
    digits = ""
    for ch in notebook:
        if not ch.isdigit():
            break
        digits += ch
    if not digits:
        raise ValueError(f"{notebook} does not start with a lab number (NN-topic.ipynb)")
    return f"lab-{int(digits):02d}"


@dataclass(frozen=True)
class Hub:
    root: Path

    @classmethod
    def default(cls) -> Hub:
        return cls(Path(os.environ.get("MULTIGPU_HUB_ROOT", DEFAULT_ROOT)).resolve())

    def hidden_from_servers(self) -> str | None:
        """Why learners' servers could not see this hub's root or the course's checkout (each lies
        outside the folders a server has its own of), or None."""
        from multigpu.core import layout as course_layout

        for what, path, fix in (("the hub's root", self.root, f"set MULTIGPU_HUB_ROOT elsewhere (default {DEFAULT_ROOT})"),
                                ("the course's checkout", course_layout.course_root(), "clone the course elsewhere")):
            for folder in PRIVATE_FOLDERS:
                if path.is_relative_to(folder):
                    return (f"{what} {path} lies in {folder}, which every learner's server sees as an empty "
                            f"folder of its own: {fix}")
        return None

    @property
    def tag(self) -> str:
        """A short name of this hub, unique per root: its control groups' names end with it."""
        import hashlib

        return hashlib.sha256(str(self.root).encode()).hexdigest()[:8]

    @property
    def course(self) -> Path:
        return self.root / "course"

    @property
    def exchange(self) -> Path:
        return self.root / "exchange"

    @property
    def inbound(self) -> Path:
        return self.exchange / COURSE_ID / "inbound"

    @property
    def learner_config(self) -> Path:
        return self.root / "etc" / "learner"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def queue_db(self) -> Path:
        return self.state / "queue.sqlite"

    @property
    def instructor_sheet(self) -> Path:
        """The instructor account's one-time password (root only; ``make hub`` writes it)."""
        return self.state / "instructor-sheet.csv"

    @property
    def results(self) -> Path:
        return self.state / "results"

    @property
    def submissions(self) -> Path:
        return self.state / "submissions"

    @property
    def certificates(self) -> Path:
        return self.state / "certificates"

    @property
    def scratch(self) -> Path:
        return self.root / "scratch"

    @property
    def gradebook(self) -> Path:
        return self.course / "gradebook.db"

    @property
    def db_url(self) -> str:
        return f"sqlite:///{self.gradebook}"
