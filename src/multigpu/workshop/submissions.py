"""Submissions arriving in the file exchange's inbound folder: checked one by one and copied once.

nbgrader's ``submit`` makes a folder ``login+assignment+timestamp+random`` in the course's
inbound folder. Anything else may be there too: a learner can make folders by hand, with any name
(not even UTF-8), any content (links to root's files, FIFOs, giant sparse files) and in any number.
So :func:`arrivals` looks at each entry on its own, and an entry that is not a submission never
stops the others:

- its name must be ``login+assignment+timestamp+random`` (:data:`NAME`) with an assignment the
  instructor released (:func:`released`: in the course and in the exchange's outbound folder,
  both the instructor's), and the folder must be a real folder made by that login's account;
- once nothing in it has changed for :data:`SETTLE_S` (nbgrader has finished writing it), what
  it holds is copied (:func:`take`, :mod:`safefiles`: regular files of that account only, under
  the caps) into ``state/submissions/``, root's, and the folder is closed to everyone but its
  owner. The grading reads that copy, never the folder again: what is graded is what was there
  when the submission arrived.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from multigpu.workshop import layout, safefiles
from multigpu.workshop.layout import Hub

#: A login (``accounts.LOGIN``) and an assignment name (``lab-00`` ... ``assessment``).
STUDENT = r"[a-z_][a-z0-9_-]{0,30}"
ASSIGNMENT = r"[a-z0-9][a-z0-9-]{0,30}"
#: A submission is taken once nothing in its folder changed for this long (seconds).
SETTLE_S = 2.0
#: nbgrader's inbound folder name: login, assignment, nbgrader's default timestamp, the random
#: part nbgrader adds (9 bytes, URL-safe base64, or a longer one).
NAME = re.compile(rf"(?P<student>{STUDENT})\+(?P<assignment>{ASSIGNMENT})"
                  r"\+(?P<timestamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,6})? [A-Z]{1,5})\+[A-Za-z0-9_-]{6,64}")


@dataclass(frozen=True)
class Arrival:
    """A submission folder that passed the checks of the module doc."""

    name: str
    student: str
    assignment: str
    timestamp: str


class NotASubmission(ValueError):
    """An entry of the inbound folder that is not graded; the message says why (for the log)."""


def valid_parts(student: str, assignment: str) -> bool:
    """Whether ``student`` and ``assignment`` can be a login and an assignment (no ``..``, no ``/``)."""
    return bool(re.fullmatch(STUDENT, student) and re.fullmatch(ASSIGNMENT, assignment))


def parse(name: str) -> Arrival | None:
    """The parts of a submission folder's name, or None when it is not one (a name that is not
    UTF-8 text arrives here with surrogates and matches nothing)."""
    m = NAME.fullmatch(name)
    return Arrival(name, m["student"], m["assignment"], m["timestamp"]) if m else None


def released(hub: Hub) -> set[str]:
    """The assignments learners may submit: in the hub course's sources and released (in the
    exchange's outbound folder), both of them the instructor's."""
    def folders(path: Path) -> set[str]:
        return {p.name for p in path.iterdir() if p.is_dir() and not p.is_symlink()} if path.is_dir() else set()

    return folders(hub.course / "source") & folders(hub.exchange / layout.COURSE_ID / "outbound")


def check(inbound_fd: int, name: str, assignments: set[str]) -> tuple[Arrival, int]:
    """``(arrival, folder descriptor)`` of the entry ``name`` of the inbound folder (the folder
    opened without following a link and belonging to the login it names), else
    :class:`NotASubmission`. The caller closes the descriptor."""
    arrival = parse(name)
    if arrival is None:
        raise NotASubmission("not a submission's name (login+assignment+timestamp+random)")
    if arrival.assignment not in assignments:
        raise NotASubmission(f"{arrival.assignment!r} is not a released assignment")
    try:
        uid = pwd.getpwnam(arrival.student).pw_uid
    except KeyError:
        raise NotASubmission(f"no account {arrival.student!r}") from None
    try:
        fd = os.open(name, safefiles.DIR_FLAGS, dir_fd=inbound_fd)
    except OSError as e:
        raise NotASubmission(f"not a folder ({e.strerror})") from None
    owner = os.fstat(fd).st_uid
    if owner != uid:
        os.close(fd)
        raise NotASubmission(f"made by {_login(owner)} in the name of {arrival.student}")
    return arrival, fd


def _login(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def owner_of(inbound_fd: int, name: str) -> str:
    """Who made the entry ``name`` (for the log of entries that are not submissions)."""
    try:
        return _login(os.stat(name, dir_fd=inbound_fd, follow_symlinks=False).st_uid)
    except OSError:
        return "?"


def settled(folder_fd: int, now: float) -> bool:
    """Whether nothing in the folder (its entries, their inode changes included) changed in the
    last :data:`SETTLE_S` seconds; looks at no more entries than a submission may hold."""
    pending = [folder_fd]
    seen, fd = 0, folder_fd
    try:
        while pending:
            fd = pending.pop()  # closed below, or by the finally when it returns from inside the loop
            if now - os.fstat(fd).st_ctime < SETTLE_S:
                return False
            for name in os.listdir(fd):
                seen += 1
                if seen > safefiles.SUBMISSION.entries:
                    return True  # too many to be a submission: the copy refuses it with the reason
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if now - st.st_ctime < SETTLE_S:
                    return False
                if stat.S_ISDIR(st.st_mode):
                    pending.append(os.open(name, safefiles.DIR_FLAGS, dir_fd=fd))
            if fd != folder_fd:
                os.close(fd)
            fd = folder_fd
    except OSError:
        return False
    finally:
        for left in {*pending, fd} - {folder_fd}:
            os.close(left)
    return True


def copy_path(hub: Hub, name: str) -> Path:
    """Where the copy of the submission ``name`` taken on arrival is kept (root's)."""
    return hub.submissions / hashlib.sha256(name.encode()).hexdigest()[:32]


def take(hub: Hub, arrival: Arrival, folder_fd: int) -> Path:
    """Close the submission's folder to everyone but its owner, then copy what it holds (owned by
    the submitter, regular files, under :data:`safefiles.SUBMISSION`) to :func:`copy_path`.
    Raises :class:`safefiles.Refused` with words for the learner."""
    os.fchmod(folder_fd, stat.S_IMODE(os.fstat(folder_fd).st_mode) & 0o700)
    dest = copy_path(hub, arrival.name)
    forget(hub, arrival.name)
    safefiles.copy_tree(folder_fd, dest, owner=pwd.getpwnam(arrival.student).pw_uid, caps=safefiles.SUBMISSION)
    if not (dest / layout.STAMP_FILE).is_file():
        forget(hub, arrival.name)
        raise safefiles.Refused(f"it has no {layout.STAMP_FILE} (the Assignments tab's Submit writes one)")
    return dest


def forget(hub: Hub, name: str) -> None:
    """Remove the copy of ``name`` (graded, failed or replaced: no longer needed)."""
    shutil.rmtree(copy_path(hub, name), ignore_errors=True)


#: New entries of the inbound folder looked at in one scan, at most (the others wait for the next),
#: and of one learner's (the login a name starts with), at most: a learner whose flood of folders
#: keeps changing (never settled, never refused) delays nobody else's submission.
SCAN_BATCH = 2000
PER_LEARNER = 20
#: Names read from the folder per scan, at most (the listing itself stays bounded).
SCAN_NAMES = 1_000_000


def pick(entries: Iterable[os.DirEntry], seen: set[str]) -> list[str]:
    """The new entries one scan looks at: learner by learner in turn (the login before the first
    ``+``), at most :data:`PER_LEARNER` each and :data:`SCAN_BATCH` in all, from the first
    :data:`SCAN_NAMES` names the folder lists."""
    by_learner: dict[str, list[str]] = {}
    for i, entry in enumerate(entries):
        if i >= SCAN_NAMES:
            break
        if entry.name not in seen:
            mine = by_learner.setdefault(entry.name.split("+", 1)[0], [])
            if len(mine) < PER_LEARNER:
                mine.append(entry.name)
    queues = list(by_learner.values())
    picked: list[str] = []
    for round_ in range(PER_LEARNER):
        picked += [q[round_] for q in queues if round_ < len(q)]
    return picked[:SCAN_BATCH]
