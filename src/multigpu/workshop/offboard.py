"""After the workshop: archive each learner's work and results, then remove their account
(``make hub-offboard``; ``multigpu workshop offboard --all``).

For every learner, one ``<login>.tar.gz`` in the archive folder (default
``ROOT/archive/<date>/``, root only) holding::

    home/                  the learner's home as it was (notebooks, their train.py, run records)
    submitted/<assignment>/   what the hub collected from them, autograded/ and feedback/ likewise
    results.json           the official grading result of their assessment, if any
    certificates/          their certificate files, if any
    grades.csv             their score per assignment from the instructor's gradebook

and ``grades.csv`` for the whole room beside them. An account is removed only after its archive
was written and read back (every member listed); if anything fails, the account stays and the
error says why. The sheet of one-time passwords (``make hub-learners``) is deleted with the last
account.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import os
import pwd
import tarfile
from pathlib import Path

from multigpu.workshop import accounts, layout
from multigpu.workshop.layout import Hub


class OffboardError(RuntimeError):
    """An archive could not be written or read back; the account was kept."""


def grade_rows(hub: Hub, student: str | None = None) -> list[dict[str, object]]:
    """``[{student, assignment, score, max_score}]`` from the instructor's gradebook."""
    from nbgrader.api import Gradebook

    if not hub.gradebook.is_file():
        return []
    rows: list[dict[str, object]] = []
    with Gradebook(hub.db_url) as gb:
        for assignment in gb.assignments:
            for sub in assignment.submissions:
                if student is None or sub.student.id == student:
                    rows.append({"student": sub.student.id, "assignment": assignment.name,
                                 "score": float(sub.score), "max_score": float(sub.max_score)})
    return rows


def csv_text(rows: list[dict[str, object]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, ["student", "assignment", "score", "max_score"])
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def archive(hub: Hub, login: str, folder: Path) -> Path:
    """Write and read back ``folder/<login>.tar.gz`` (see the module doc); returns its path."""
    path = folder / f"{login}.tar.gz"
    parts = [(Path(pwd.getpwnam(login).pw_dir), "home")]
    parts += [(hub.course / part / login, part) for part in ("submitted", "autograded", "feedback")]
    parts += [(hub.results / f"{login}.json", "results.json"), (hub.certificates / login, "certificates")]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            for src, name in parts:
                if src.exists():
                    tar.add(src, arcname=f"{login}/{name}")
            data = csv_text(grade_rows(hub, login)).encode()
            info = tarfile.TarInfo(f"{login}/grades.csv")
            info.size, info.mtime = len(data), int(dt.datetime.now().timestamp())
            tar.addfile(info, io.BytesIO(data))
        with tarfile.open(path, "r:gz") as tar:
            names = tar.getnames()
    except (OSError, tarfile.TarError) as e:
        raise OffboardError(f"{login}: the archive {path} could not be written or read back ({e}): "
                            "the account was kept") from None
    if f"{login}/home" not in names or f"{login}/grades.csv" not in names:
        raise OffboardError(f"{login}: the archive {path} lacks the home or the grades: the account was kept")
    return path


def default_folder(hub: Hub) -> Path:
    """``ROOT/archive/<date-time>/`` (``ROOT/archive`` is made root only)."""
    (hub.root / "archive").mkdir(mode=0o700, exist_ok=True)
    return hub.root / "archive" / dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def offboard(hub: Hub, logins: list[str], folder: Path) -> list[tuple[str, Path]]:
    """Archive, then remove, each of ``logins`` (workshop learner accounts only)."""
    learners = accounts.members(layout.LEARNERS_GROUP)
    strangers = [n for n in logins if n not in learners]
    if strangers:
        raise OffboardError(f"not workshop learner accounts: {', '.join(strangers)}: nothing was done")
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    (folder / "grades.csv").write_text(csv_text(grade_rows(hub)))
    done = []
    for login in logins:
        accounts.stop_processes(login)  # nothing writes to the home while it is archived
        path = archive(hub, login, folder)
        accounts.remove(login)
        done.append((login, path))
    if not accounts.members(layout.LEARNERS_GROUP):
        for sheet in hub.state.glob("learners-sheet*.csv"):
            sheet.unlink()
    return done


def remove_staff(hub: Hub) -> list[str]:
    """After the whole room: the instructor accounts (their homes; the hub's course and results stay
    in the hub's root, root's) and the grading account. Returns the logins removed."""
    removed = []
    for login in sorted(accounts.members(layout.INSTRUCTORS_GROUP)):
        accounts.remove(login, layout.INSTRUCTORS_GROUP)
        removed.append(login)
    if accounts.exists(layout.GRADER_USER):
        accounts.remove_service_user(layout.GRADER_USER)
        removed.append(layout.GRADER_USER)
    hub.instructor_sheet.unlink(missing_ok=True)
    return removed
