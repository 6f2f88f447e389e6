"""Other copies of the course on the box whose solutions learners could read (a second clone with a
default umask): :func:`open_copies` finds them; ``make hub-check`` fails with their paths
(``preflight``), and the hub hides each from learners' servers (``namespaces --hide``) and from
the grading sandbox (``autograde.hidden_from_learners``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: Where other copies of the course may be kept: every folder at the top of the file system but the
#: system's own (:data:`SYSTEM_TOP`), these below them, every home folder, and
#: ``MULTIGPU_EXTRA_CHECKOUTS`` (folders separated by ``:``); and how deep to look.
SYSTEM_TOP = {"proc", "sys", "dev", "run", "boot", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc",
              "var", "lost+found", "snap", "home"}
CHECKOUT_ROOTS = (Path("/usr/local"), Path("/var/tmp"), Path("/var/www"), Path("/var/opt"))
CHECKOUT_DEPTH = 4
#: Folders looked at in all, at most (a home full of files must not stall the check).
CHECKOUT_VISITS = 50_000


def course_copies(roots: list[Path], depth: int = CHECKOUT_DEPTH) -> list[Path]:
    """Every copy of this course (a folder with ``nbgrader_config.py`` and ``solutions/``) at most
    ``depth`` folders below ``roots``; links are not followed."""
    from multigpu.core import layout as course_layout

    found: list[Path] = []
    frontier = [(r, 0) for r in roots if r.is_dir() and not r.is_symlink()]
    visits = 0
    while frontier and visits < CHECKOUT_VISITS:
        folder, level = frontier.pop()
        visits += 1
        if course_layout.is_course(folder):
            found.append(folder)
            continue
        if level >= depth:
            continue
        try:
            frontier += [(e, level + 1) for e in folder.iterdir() if e.is_dir() and not e.is_symlink()]
        except OSError:
            continue
    return sorted(set(found))


def readable_by_learners(path: Path) -> bool:
    """Whether an account that is neither root nor the owner reads ``path`` (a folder: lists and
    enters it): every folder above it lets others (or the learners' group) in."""
    import grp

    from multigpu.workshop import layout

    try:
        learners = grp.getgrnam(layout.LEARNERS_GROUP).gr_gid
    except KeyError:
        learners = None

    def allows(st: os.stat_result, bits: int) -> bool:
        return bool(st.st_mode & bits) or (st.st_gid == learners and bool(st.st_mode & (bits << 3)))

    try:
        for folder in reversed(path.resolve().parents):
            if not allows(folder.stat(), 0o001):
                return False
        st = path.stat()
    except OSError:
        return False
    return allows(st, 0o005 if path.is_dir() else 0o004)


def checkout_roots() -> list[Path]:
    """Where :func:`open_copies` looks: every home, ``/srv``, ``/opt``, the box's other top folders
    and ``MULTIGPU_EXTRA_CHECKOUTS``."""
    import pwd

    homes = sorted({Path(u.pw_dir) for u in pwd.getpwall() if u.pw_dir not in ("", "/")})
    extra = [Path(p) for p in os.environ.get("MULTIGPU_EXTRA_CHECKOUTS", "").split(":") if p]
    top = sorted(e for e in Path("/").iterdir() if e.name not in SYSTEM_TOP and e.is_dir() and not e.is_symlink())
    return [*homes, *CHECKOUT_ROOTS, *top, *extra]


def open_copies() -> list[Path]:
    """Copies of the course whose solutions a learner can read (the hub's own checkout is closed by
    ``make hub``; a second clone with a default umask is not). Learners' servers and the grading
    sandbox see each as an empty folder (``namespaces --hide``, ``autograde.hidden_from_learners``)."""
    # a clone's .git holds the solutions too, whatever the mode of its solutions/
    return [c for c in course_copies(checkout_roots())
            if readable_by_learners(c / "solutions") or ((c / ".git").exists() and readable_by_learners(c / ".git"))]


def to_hide() -> list[Path]:
    """:func:`open_copies` but the one the hub runs from (its package or its Python inside): hiding
    that would take the hub's own programs away; the sandbox hides its ``solutions/`` itself."""
    running = {Path(__file__).resolve(), Path(sys.executable).resolve(), Path(sys.executable).absolute()}
    return [c for c in open_copies() if not any(c in r.parents for r in running)]
