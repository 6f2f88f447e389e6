"""Workshop accounts are real Unix users, so each learner's server runs as its own user and the
kernel keeps learners out of each other's work (homes are mode 700).

    add_learners(["ana", "ben"]) or add_learners(count=30)  -> [(login, password), ...]

Each new account gets a random password, printed once on the instructor's sheet and stored
nowhere else (only its hash, in /etc/shadow); a learner can change it in a terminal with
``passwd``. The hub logs people in with PAM against these accounts (``hubconfig``). Only
accounts this module made (members of :data:`layout.LEARNERS_GROUP`) are ever changed or removed.
"""

from __future__ import annotations

import csv
import grp
import os
import pwd
import re
import secrets
import shutil
import subprocess
from pathlib import Path

from multigpu.workshop import layout
from multigpu.workshop.layout import SYSTEM_PATH

#: Login names useradd accepts everywhere (Debian's default NAME_REGEX, lower case).
LOGIN = re.compile(r"^[a-z_][a-z0-9_-]{0,30}$")
#: Letters and digits that read unambiguously on a printed sheet (no 0/O, 1/l/I).
ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"


class AccountError(RuntimeError):
    """An account cannot be made or removed; the message says why and what to do."""




def _run(argv: list[str], stdin: str | None = None) -> None:
    tool = shutil.which(argv[0], path=SYSTEM_PATH)
    if tool is None:
        raise AccountError(f"{argv[0]} not found in {SYSTEM_PATH}: workshop accounts need the system's user tools (passwd package)")
    proc = subprocess.run([tool, *argv[1:]], input=stdin, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AccountError(f"{argv[0]} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")


def _require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise AccountError(f"{what} needs root (it creates Unix users): run it with sudo on the workshop box")


def exists(login: str) -> bool:
    try:
        pwd.getpwnam(login)
        return True
    except KeyError:
        return False


def members(group: str) -> set[str]:
    """Users whose primary or supplementary group is ``group`` (empty when it does not exist)."""
    try:
        g = grp.getgrnam(group)
    except KeyError:
        return set()
    return set(g.gr_mem) | {p.pw_name for p in pwd.getpwall() if p.pw_gid == g.gr_gid}


def ensure_group(group: str) -> None:
    try:
        grp.getgrnam(group)
    except KeyError:
        _require_root(f"creating group {group}")
        _run(["groupadd", "--system", group])


def password(length: int = 12) -> str:
    """A random password of ``length`` unambiguous letters and digits, grouped by 4 for reading."""
    raw = "".join(secrets.choice(ALPHABET) for _ in range(length))
    return "-".join(raw[i:i + 4] for i in range(0, length, 4))


def _csv_rows(path: str | os.PathLike) -> tuple[list[str], list[list[str]]]:
    """(lower-case header or [], rows) of a CSV; blank lines and lines starting with # skipped."""
    rows = [r for r in csv.reader(Path(path).read_text().splitlines()) if r and r[0].strip()
            and not r[0].lstrip().startswith("#")]
    if not rows:
        raise AccountError(f"{path} holds no names")
    header = [h.strip().lower() for h in rows[0]]
    return (header, rows[1:]) if any(k in header for k in LOGIN_COLUMNS) else ([], rows)


#: Header names of the login column (``student_id``: nbgrader's and ngshare's student lists).
LOGIN_COLUMNS = ("login", "username", "student_id")


def names_from_csv(path: str | os.PathLike) -> list[str]:
    """Logins from a CSV: the column ``login`` (or ``username``, ``student_id``) when the header has
    one, else the first column; blank lines and lines starting with # are skipped."""
    header, rows = _csv_rows(path)
    col = next((header.index(k) for k in LOGIN_COLUMNS if k in header), 0)
    return [r[col].strip() for r in rows if len(r) > col and r[col].strip()]


def full_names_from_csv(path: str | os.PathLike) -> dict[str, str]:
    """``{login: "First Last"}`` from a CSV whose header has ``first_name`` and/or ``last_name``
    (the instructor's gradebook shows them); empty when it has neither."""
    header, rows = _csv_rows(path)
    if not header or not {"first_name", "last_name"} & set(header):
        return {}
    col = next(header.index(k) for k in LOGIN_COLUMNS if k in header)
    parts = [header.index(k) for k in ("first_name", "last_name") if k in header]
    return {r[col].strip(): " ".join(r[i].strip() for i in parts if len(r) > i and r[i].strip())
            for r in rows if len(r) > col and r[col].strip()}


def gradebook_names(login: str) -> dict[str, str]:
    """``{first_name, last_name}`` for nbgrader's gradebook: the account's full name (its GECOS
    field, from the room's CSV), else the login as the last name (the formgrader shows
    "last, first" and would show "None, None" for a student without them)."""
    try:
        full = pwd.getpwnam(login).pw_gecos.split(",")[0].strip()
    except KeyError:
        full = ""
    first, _, last = full.rpartition(" ")
    return {"first_name": first, "last_name": last} if last else {"first_name": "", "last_name": login}


def numbered(count: int, prefix: str = "learner") -> list[str]:
    """``count`` logins ``learner01``, ``learner02``, ... skipping ones that already exist."""
    if count < 1:
        raise AccountError("the number of learners must be at least 1")
    out: list[str] = []
    i = 1
    while len(out) < count:
        name = f"{prefix}{i:02d}"
        if not exists(name):
            out.append(name)
        i += 1
    return out


def create(login: str, group: str, secret: str | None = None, full_name: str = "") -> str:
    """Create the Unix user ``login`` in ``group`` with a private home (700), a password and
    ``full_name`` (its GECOS field); returns the password. An existing account is refused unless
    this module made it (it is in ``group``), and then only its password and name are set."""
    _require_root("creating accounts")
    if not LOGIN.match(login):
        raise AccountError(f"{login!r} is not a usable login: lower-case letters, digits, _ and -, "
                           "starting with a letter or _, at most 31 characters")
    ensure_group(group)
    if exists(login):
        if login not in members(group):
            raise AccountError(f"a user {login!r} already exists and is not a workshop account: pick another name")
    else:
        _run(["useradd", "--create-home", "--shell", "/bin/bash", "--gid", group, "-K", "UMASK=077", login])
    if full_name:
        _run(["usermod", "--comment", full_name.replace(",", " ").replace(":", " "), login])
    home = Path(pwd.getpwnam(login).pw_dir)
    os.chmod(home, 0o700)
    secret = secret or password()
    _run(["chpasswd"], stdin=f"{login}:{secret}\n")
    return secret


def add_learners(names: list[str], full_names: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """Create (or reset the password of) every learner in ``names``; ``[(login, password)]``."""
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise AccountError(f"names given twice: {', '.join(dupes)}")
    return [(n, create(n, layout.LEARNERS_GROUP, full_name=(full_names or {}).get(n, ""))) for n in names]


def remove(login: str, group: str = layout.LEARNERS_GROUP) -> None:
    """Delete a workshop account and its home (``userdel -r``); refuses any other account."""
    _require_root("removing accounts")
    if not exists(login):
        return
    if login not in members(group):
        raise AccountError(f"{login!r} is not a workshop account (not in group {group}): not removed")
    stop_processes(login)
    from multigpu.workshop import disks

    disks.detach_home(login)
    _run(["userdel", "--remove", login])
    from multigpu.workshop import serverlog

    (serverlog.BUDGETS / login).unlink(missing_ok=True)  # their server output's budget of the hour


def stop_processes(login: str) -> None:
    """Kill every process of ``login`` (their server, kernels and jobs)."""
    subprocess.run([shutil.which("pkill", path=SYSTEM_PATH) or "pkill", "-KILL", "-u", login], capture_output=True)


def ensure_service_user(login: str = layout.GRADER_USER) -> pwd.struct_passwd:
    """The unprivileged system account that runs learners' notebooks when they are autograded
    (no password, no login shell, no home of its own)."""
    _require_root("creating the grading account")
    if not exists(login):
        _run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
              "--shell", "/usr/sbin/nologin", login])
    return pwd.getpwnam(login)


def remove_service_user(login: str = layout.GRADER_USER) -> None:
    """Delete the grading account (a system account without home) and everything it still runs."""
    _require_root("removing the grading account")
    if exists(login):
        stop_processes(login)
        _run(["userdel", login])


def write_sheet(path: Path, rows: list[tuple[str, str]]) -> Path:
    """``login,password`` rows in ``path``, made root's alone (mode 600) before anything is in it."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("login,password\n" + "".join(f"{a},{b}\n" for a, b in rows))
    return path


def sheet(rows: list[tuple[str, str]], url: str) -> str:
    """The printable sheet of logins and one-time passwords."""
    width = max([len("login"), *(len(r[0]) for r in rows)])
    lines = [f"Workshop accounts for {url}", "Each password is shown only here: hand out one line per learner.", "",
             f"{'login':<{width}}  password", f"{'-' * width}  {'-' * 14}"]
    lines += [f"{login:<{width}}  {secret}" for login, secret in rows]
    return "\n".join(lines)
