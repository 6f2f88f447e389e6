"""Root's file work on folders another account can write, done through file descriptors.

The grading job runs as root and reads a learner's submission, a grading's scratch course (written
by the grading account while a learner's notebook ran) and writes into the instructor's course.
Each of those folders belongs to someone root must not obey, so nothing here looks a path up twice
or follows a symbolic link:

- :func:`copy_tree` copies a folder entry by entry, each opened with ``O_NOFOLLOW`` relative to its
  parent's descriptor: only folders and regular files, each file with one link, owned by the
  account expected and under the size caps (:class:`Caps`). A symbolic link, a device, a FIFO, a
  socket, a hard link, a file past a cap or a name that is not text refuses the whole copy with
  words for the learner (:class:`Refused`); what is read is the file that was checked.
- :func:`chown_tree` hands a folder to an account by walking it with folder descriptors and
  changing each entry without following links: a folder swapped for a link mid-walk leads nowhere.
- :func:`private_dir` makes a folder whose owner and mode are set before anything is put in it.
- :func:`read_file` reads one file below a trusted folder, every step refusing links.
- :func:`remove_entry` removes one entry of a folder through the folder's descriptor: a link is
  removed, never followed.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
CHUNK = 1 << 20


class Refused(ValueError):
    """A folder cannot be copied as it is; the message says which entry and why, for the learner."""


@dataclass(frozen=True)
class Caps:
    """The most a copied folder may hold."""

    file_bytes: int
    total_bytes: int
    entries: int
    depth: int

    def describe(self) -> str:
        return (f"at most {self.file_bytes // 2**20} MiB a file, {self.total_bytes // 2**20} MiB and "
                f"{self.entries} files and folders in all")


#: A submission: a lab's notebooks with their outputs, the assessment's script, a few data files.
SUBMISSION = Caps(file_bytes=32 * 2**20, total_bytes=64 * 2**20, entries=500, depth=8)


@dataclass
class _Copy:
    owner: int | None
    caps: Caps
    skip: Sequence[str]
    entries: int = 0
    bytes: int = 0
    names: list[str] = field(default_factory=list)


def _kind(mode: int) -> str:
    return ("a symbolic link" if stat.S_ISLNK(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "not a regular file")


def _text_name(name: str, where: str) -> None:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise Refused(f"{where}: a file name that is not UTF-8 text") from None
    if not name.isprintable():
        raise Refused(f"{where}: a file name with control characters")


@contextmanager
def opened(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def open_dir(path: str | os.PathLike, *below: str) -> int:
    """A descriptor of the folder ``path`` (its last component not a link) or of ``path/below...``,
    each step of ``below`` opened without following a link (``..`` and ``/`` refused)."""
    fd = os.open(path, DIR_FLAGS)
    for part in below:
        if part in ("", ".", "..") or "/" in part:
            os.close(fd)
            raise ValueError(f"{part!r} is not a folder name")
        try:
            nxt = os.open(part, DIR_FLAGS, dir_fd=fd)
        finally:
            os.close(fd)
        fd = nxt
    return fd


def private_dir(path: Path, uid: int, gid: int, mode: int) -> Path:
    """Make the folder ``path`` (it must not exist; its parent is trusted) owned by ``uid:gid`` with
    ``mode`` before anything is written in it."""
    os.mkdir(path, 0o700)
    with opened(os.open(path, DIR_FLAGS)) as fd:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    return path


def copy_tree(src: str | os.PathLike | int, dest: Path, *, owner: int | None, caps: Caps,
              skip: Sequence[str] = ()) -> list[str]:
    """Copy the folder ``src`` (a path whose last component is not a link, or an open folder
    descriptor) to the new folder ``dest`` (mode 700, the caller's; file modes kept without
    write for others), checking every entry (module doc). ``owner``: the uid every entry must
    belong to (None: any). Entries named in ``skip`` are left out. Returns the files copied,
    relative to ``dest``. On :class:`Refused`, ``dest`` is removed."""
    import shutil

    state = _Copy(owner, caps, skip)
    sfd = src if isinstance(src, int) else os.open(src, DIR_FLAGS)
    try:
        st = os.fstat(sfd)
        if owner is not None and st.st_uid != owner:
            raise Refused("the submission's folder belongs to another account")
        os.mkdir(dest, 0o700)
        try:
            with opened(os.open(dest, DIR_FLAGS)) as dfd:
                _copy_dir(sfd, dfd, state, 0, "")
        except BaseException:
            shutil.rmtree(dest, ignore_errors=True)
            raise
    finally:
        if not isinstance(src, int):
            os.close(sfd)
    return state.names


def _copy_dir(sfd: int, dfd: int, state: _Copy, depth: int, where: str) -> None:
    if depth > state.caps.depth:
        raise Refused(f"{where}: folders nested more than {state.caps.depth} deep")
    for name in sorted(os.listdir(sfd)):
        if name in state.skip:
            continue
        rel = f"{where}/{name}" if where else name
        _text_name(name, rel)
        state.entries += 1
        if state.entries > state.caps.entries:
            raise Refused(f"more than {state.caps.entries} files and folders ({state.caps.describe()})")
        st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
        if state.owner is not None and st.st_uid != state.owner:
            raise Refused(f"{rel} belongs to another account")
        if stat.S_ISDIR(st.st_mode):
            with opened(os.open(name, DIR_FLAGS, dir_fd=sfd)) as child:
                _same(os.fstat(child), st, rel)
                os.mkdir(name, (st.st_mode & 0o755) | 0o700, dir_fd=dfd)
                with opened(os.open(name, DIR_FLAGS, dir_fd=dfd)) as out:
                    _copy_dir(child, out, state, depth + 1, rel)
        elif stat.S_ISREG(st.st_mode):
            _copy_file(sfd, dfd, name, st, state, rel)
        else:
            raise Refused(f"{rel} is {_kind(st.st_mode)}: a submission holds only folders and regular files")


def _same(got: os.stat_result, seen: os.stat_result, rel: str) -> None:
    if (got.st_dev, got.st_ino) != (seen.st_dev, seen.st_ino):
        raise Refused(f"{rel} changed while it was copied")


def _copy_file(sfd: int, dfd: int, name: str, seen: os.stat_result, state: _Copy, rel: str) -> None:
    with opened(os.open(name, FILE_FLAGS, dir_fd=sfd)) as fd:
        st = os.fstat(fd)
        _same(st, seen, rel)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{rel} is {_kind(st.st_mode)}")
        if st.st_nlink != 1:
            raise Refused(f"{rel} is a hard link ({st.st_nlink} names for one file): submit a copy instead")
        if state.owner is not None and st.st_uid != state.owner:
            raise Refused(f"{rel} belongs to another account")
        if st.st_size > state.caps.file_bytes:
            raise Refused(f"{rel} is {st.st_size / 2**20:.0f} MiB ({state.caps.describe()})")
        state.bytes += st.st_size
        if state.bytes > state.caps.total_bytes:
            raise Refused(f"the submission is larger than {state.caps.total_bytes // 2**20} MiB ({state.caps.describe()})")
        with opened(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                            st.st_mode & 0o755, dir_fd=dfd)) as out:
            left = st.st_size
            while True:
                chunk = os.read(fd, min(CHUNK, left + 1))
                if not chunk:
                    break
                left -= len(chunk)
                if left < 0:
                    raise Refused(f"{rel} grew while it was copied")
                os.write(out, chunk)
    state.names.append(rel)


def chown_tree(path: Path, uid: int, gid: int) -> None:
    """Give the folder ``path`` (last component not a link; its parent trusted) and everything in
    it to ``uid:gid`` (module doc). Links are changed themselves, never followed."""
    with opened(os.open(path, DIR_FLAGS)) as fd:
        os.fchown(fd, uid, gid)
        _chown_in(fd, uid, gid)


def _chown_in(dfd: int, uid: int, gid: int) -> None:
    for name in os.listdir(dfd):
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                os.chown(name, uid, gid, dir_fd=dfd, follow_symlinks=False)
                continue
            try:
                child = os.open(name, DIR_FLAGS, dir_fd=dfd)
            except OSError:  # swapped for a link since it was listed: change the entry itself
                os.chown(name, uid, gid, dir_fd=dfd, follow_symlinks=False)
                continue
        except FileNotFoundError:  # removed since it was listed: nothing to hand over
            continue
        with opened(child):
            os.fchown(child, uid, gid)
            _chown_in(child, uid, gid)


def read_file(folder: str | os.PathLike, *below: str, max_bytes: int) -> bytes:
    """The bytes of the regular file ``folder/below...`` (every step below ``folder`` opened without
    following a link), at most ``max_bytes`` (ValueError otherwise)."""
    *dirs, name = below
    with opened(open_dir(folder, *dirs)) as dfd, opened(os.open(name, FILE_FLAGS, dir_fd=dfd)) as fd:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{name} is not a regular file")
        data = b""
        while len(data) <= max_bytes:
            chunk = os.read(fd, CHUNK)
            if not chunk:
                return data
            data += chunk
    raise ValueError(f"{name} is larger than {max_bytes:,} bytes")


#: The deepest a removal goes before it moves a folder up to the top (one open descriptor a level).
REMOVE_DEPTH = 64


def remove_entry(folder_fd: int, name: str) -> None:
    """Remove ``name`` from the folder open as ``folder_fd``: a folder with all it holds, anything
    else (a link included, never followed) itself. No recursion, at most :data:`REMOVE_DEPTH`
    descriptors: a folder deeper than that is first moved up into the top folder (a learner's tree
    3000 folders deep stops Python's recursive ``shutil.rmtree`` with a RecursionError)."""
    st = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=folder_fd)
        return
    top = os.open(name, DIR_FLAGS, dir_fd=folder_fd)
    stack: list[list[Any]] = [[top, None, name]]  # [folder descriptor, its folders left to remove, its name]
    try:
        while stack:
            frame = stack[-1]
            fd = frame[0]
            if frame[1] is None:
                folders: list[str] = []
                for entry in os.listdir(fd):
                    if stat.S_ISDIR(os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mode):
                        folders.append(entry)
                    else:
                        os.unlink(entry, dir_fd=fd)
                frame[1] = folders
            if frame[1] and len(stack) >= REMOVE_DEPTH:
                up = f".removed-{secrets.token_hex(8)}"  # a name the tree's owner cannot have made ready
                os.rename(frame[1].pop(), up, src_dir_fd=fd, dst_dir_fd=top)
                stack[0][1].append(up)
            elif frame[1]:
                child = frame[1].pop()
                stack.append([os.open(child, DIR_FLAGS, dir_fd=fd), None, child])
            else:
                stack.pop()
                os.close(fd)
                os.rmdir(frame[2], dir_fd=stack[-1][0] if stack else folder_fd)
    finally:
        for frame in stack:
            os.close(frame[0])
