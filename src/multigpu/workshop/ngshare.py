"""ngshare, nbgrader's exchange on Kubernetes, as the grading service reads and answers it.

On one box the grading service reads nbgrader's file exchange, the folders learners submit into.
On Kubernetes no pod shares a folder with the learners' servers: submissions live in ngshare
(``deploy/kubernetes/ngshare.yaml``), behind the hub's login. With ``$MULTIGPU_NGSHARE_URL`` set
the service calls ngshare's REST API with its own hub token (``$JUPYTERHUB_API_TOKEN``), as one of
the course's instructors (the instructor adds it once, with the name and address ngshare wants
of every instructor: ``ngshare-course-management add_instructor multigpu grading -f Grading -l
Service -e grading@localhost``):

- :meth:`Ngshare.submissions`: every (learner, assignment, timestamp) submitted so far;
- :meth:`Ngshare.download`: one submission's files into a folder, every path checked so that
  nothing lands outside it, with nbgrader's ``timestamp.txt``;
- :meth:`Ngshare.upload_feedback`: the feedback's HTML files for that submission, which the
  learner's Assignments tab fetches (Fetch Feedback).

ngshare names each submitter by the hub token their server sent, so the file exchange's check
(the inbound folder's owner is the learner it names) is ngshare's own here.
"""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from multigpu.workshop import layout

URL_VAR = "MULTIGPU_NGSHARE_URL"
TOKEN_VAR = "JUPYTERHUB_API_TOKEN"
#: nbgrader's record of when a submission was made (autograde reads it for late penalties)
#: A learner's or an assignment's name as it may become a folder of the course (hub logins may
#: carry dots, dashes and an @; nothing that climbs or hides a path)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,99}")


class NgshareError(RuntimeError):
    """ngshare refused a request or could not be reached; the message says which and why."""


@dataclass(frozen=True)
class Submission:
    student: str
    assignment: str
    timestamp: str  # as ngshare writes it; the feedback is filed under the same string

    @property
    def name(self) -> str:
        """The queue's key for it, in the file exchange's form ``student+assignment+timestamp``."""
        return f"{self.student}+{self.assignment}+{self.timestamp}"


def safe_path(root: Path, path: str) -> Path:
    """``root / path`` for a relative path with no ``..``; :class:`NgshareError` for any other."""
    parts = PurePosixPath(path).parts
    if not parts or PurePosixPath(path).is_absolute() or ".." in parts or "\\" in path:
        raise NgshareError(f"a file named {path!r} in a submission: refused (only paths inside the assignment)")
    return root.joinpath(*parts)


def write_files(root: Path, files: list[dict[str, Any]], skip: tuple[str, ...] = ()) -> list[Path]:
    """ngshare's file list (``path``, base64 ``content``) written under ``root``; a file or folder
    named in ``skip`` is left out wherever it is. Every path is checked before anything is written."""
    targets = [(safe_path(root, f["path"]), f) for f in files]
    written = []
    for target, f in targets:
        if any(part in skip for part in target.relative_to(root).parts):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(base64.b64decode(f["content"]))
        written.append(target)
    return written


@dataclass(frozen=True)
class Ngshare:
    url: str  # where ngshare answers, e.g. http://ngshare:8080/services/ngshare (its service prefix)
    token: str
    course_id: str = layout.COURSE_ID
    timeout_s: float = 60.0

    @classmethod
    def from_env(cls) -> Ngshare | None:
        """The service's ngshare where ``$MULTIGPU_NGSHARE_URL`` is set (Kubernetes), else None."""
        url = os.environ.get(URL_VAR, "").rstrip("/")
        if not url:
            return None
        token = os.environ.get(TOKEN_VAR, "")
        if not token:
            raise NgshareError(f"${URL_VAR} is set but ${TOKEN_VAR} is not: the service has no token for ngshare")
        return cls(url, token)

    def call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """One request to ngshare's API; its JSON answer, or :class:`NgshareError` with its message."""
        import requests

        try:
            r = requests.request(method, f"{self.url}{path}", timeout=self.timeout_s,
                                 headers={"Authorization": f"token {self.token}"}, **kwargs)
        except requests.RequestException as e:
            raise NgshareError(f"ngshare at {self.url} cannot be reached: {e}") from None
        try:
            answer = r.json()
        except ValueError:
            answer = {}
        if not r.ok or not answer.get("success"):
            raise NgshareError(f"ngshare refused {method} {path}: {r.status_code} {answer.get('message', r.text[:200])}")
        return dict(answer)

    def assignments(self) -> list[str]:
        """The course's assignments in ngshare (each one the instructor released)."""
        return sorted(self.call("GET", f"/assignments/{self.course_id}")["assignments"])

    def submissions(self) -> list[Submission]:
        """Every submission of every assignment, oldest first within each; a learner or an
        assignment whose name could not be a folder of the course is left out."""
        found = []
        for assignment in filter(NAME.fullmatch, self.assignments()):
            listed = self.call("GET", f"/submissions/{self.course_id}/{assignment}")["submissions"]
            found += sorted((Submission(s["student_id"], assignment, s["timestamp"]) for s in listed
                             if NAME.fullmatch(s["student_id"])),
                            key=lambda s: s.timestamp)
        return found

    def download(self, sub: Submission, dest: Path, skip: tuple[str, ...] = ()) -> list[Path]:
        """``sub``'s files into ``dest`` (made; names in ``skip`` left out) and its ``timestamp.txt``."""
        answer = self.call("GET", f"/submission/{self.course_id}/{sub.assignment}/{sub.student}",
                           params={"timestamp": sub.timestamp})
        dest.mkdir(parents=True, exist_ok=True)
        written = write_files(dest, answer["files"], skip=(*skip, layout.STAMP_FILE))
        (dest / layout.STAMP_FILE).write_text(sub.timestamp)
        return written

    def upload_feedback(self, sub: Submission, folder: Path) -> list[str]:
        """The HTML files in ``folder`` (nbgrader's feedback of ``sub``) as its feedback in ngshare."""
        pages = sorted(folder.glob("*.html"))
        if not pages:
            raise NgshareError(f"no feedback to upload in {folder}")
        files = [{"path": p.name, "content": base64.b64encode(p.read_bytes()).decode()} for p in pages]
        self.call("POST", f"/feedback/{self.course_id}/{sub.assignment}/{sub.student}",
                  data={"timestamp": sub.timestamp, "files": json.dumps(files)})
        return [p.name for p in pages]
