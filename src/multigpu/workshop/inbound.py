"""Each learner's submissions on their own disk: no learner can fill the exchange the room shares.

In a learner's server (its mount namespace, :mod:`namespaces`) the exchange's root is a small
tmpfs of the server's own, the course's folder is read-only, and nbgrader's inbound folder is a
folder of the learner's home, ``~/.nbgrader-inbound-<hub's tag>`` (:func:`folder_name`), bound over it: ``nbgrader
submit`` (the Assignments tab) writes there, inside the learner's own disk quota (:mod:`disks`), and
a learner who fills it meets "No space left on device" in their own home while everyone else
submits. The grading service (root, outside the namespaces) looks in the box's inbound folder and in
each learner's for this hub (:func:`open_folder`, by descriptor: the learner owns their home and may
have put a link or anything else there); the hub's tag in the name keeps a test hub beside another
on one box from grading the other's learners.
"""

from __future__ import annotations

import os
import pwd
import stat

from multigpu.workshop import accounts, layout
from multigpu.workshop.layout import Hub

#: The learner's inbound folder of a hub, in their home: this, then the hub's tag.
FOLDER = ".nbgrader-inbound-"
_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class NotTheirs(RuntimeError):
    """The folder is not a folder of the learner's own (a link, another account's): not used."""


def folder_name(hub: Hub) -> str:
    return FOLDER + hub.tag


def open_folder(user: pwd.struct_passwd, name: str, make: bool = False) -> int:
    """A descriptor of ``user``'s inbound folder ``name`` (:func:`folder_name`; made first, the learner's, 700, when ``make``:
    as root at their server's start). Refuses a home or a folder that is a link or another
    account's; FileNotFoundError when there is none."""
    home = os.open(user.pw_dir, _FLAGS)
    try:
        if os.fstat(home).st_uid != user.pw_uid:
            raise NotTheirs(f"{user.pw_dir} is not {user.pw_name}'s")
        if make:
            try:
                os.mkdir(name, 0o700, dir_fd=home)
            except FileExistsError:
                pass
        try:
            fd = os.open(name, _FLAGS, dir_fd=home)
        except OSError as e:
            if isinstance(e, FileNotFoundError):
                raise
            raise NotTheirs(f"~{user.pw_name}/{name} is not a folder ({e.strerror})") from None
    finally:
        os.close(home)
    st = os.fstat(fd)
    if st.st_uid not in (0, user.pw_uid) or not stat.S_ISDIR(st.st_mode):
        os.close(fd)
        raise NotTheirs(f"~{user.pw_name}/{name} belongs to uid {st.st_uid}")
    if make:
        os.fchown(fd, user.pw_uid, user.pw_gid)
        os.fchmod(fd, 0o700)
    return fd


def learners_folders(hub: Hub) -> list[tuple[str, int]]:
    """``(login, descriptor)`` of every learner's inbound folder of ``hub`` that exists and is
    theirs; the caller closes each."""
    found = []
    for login in sorted(accounts.members(layout.LEARNERS_GROUP)):
        try:
            found.append((login, open_folder(pwd.getpwnam(login), folder_name(hub))))
        except (KeyError, FileNotFoundError):
            continue
        except (NotTheirs, OSError) as e:
            print(f"grading service: {login}'s inbound folder is not looked at: {e}", flush=True)
    return found
