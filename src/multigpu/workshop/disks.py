"""Disk quotas: each learner's home, and the hub's exchange, is a file system of its own of a fixed
size (an ext4 image on a loop device), so a learner who fills their home, or the exchange, meets
"No space left on device" there, and the box's disk, the hub's database and every other home go on.

    attach_home(login)     make the learner's image if needed (their home's files copied in) and mount it
    detach_home(login)     unmount it and delete the image (the account is being removed)
    attach_exchange(hub)   the same for the hub's exchange (its image in the hub's state)
    detach_exchange(hub)   unmount it, keep the image (a scratch hub's teardown removes the root)
    grading_space(hub, N)  one grading's folder ``scratch/job-N``, a file system of its own while it runs

Sizes: ``MULTIGPU_LEARNER_DISK_MB`` (default :data:`LEARNER_MB`), ``MULTIGPU_EXCHANGE_DISK_MB``
(default :data:`EXCHANGE_MB`) and ``MULTIGPU_GRADING_DISK_MB`` (default :data:`GRADING_MB`, the
grading service's), read when an image is made; a made image keeps its size. Images are
sparse: they take the disk space their files take, so the sizes may add up to more than the disk
(``make hub-check`` says when they do). The learners' images live in ``MULTIGPU_DISKS_DIR``
(default ``/var/lib/multigpu/disks``, root only): accounts belong to the box, not to one hub.
After a reboot nothing is mounted: ``make hub`` mounts every learner's image and the exchange's
again before it serves anyone. A learner's server sees their home mounted (it starts after), and
JupyterLab refuses a save that does not fit with a message that says why (:func:`refuse_when_full`).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from multigpu.workshop import safefiles
from multigpu.workshop.layout import SYSTEM_PATH, Hub

LEARNER_MB, EXCHANGE_MB, GRADING_MB = 4096, 2048, 4096
MOUNT_OPTIONS = "loop,nosuid,nodev,noinit_itable"


class DiskError(RuntimeError):
    """An image cannot be made, mounted or removed; the message says why."""


def _env_mb(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        mb = int(value) if value else default
    except ValueError:
        raise DiskError(f"{name}={value!r}: give a whole number of MB") from None
    if mb < 16:
        raise DiskError(f"{name}={mb}: at least 16 MB (ext4's own metadata takes a few)")
    return mb


def learner_mb() -> int:
    return _env_mb("MULTIGPU_LEARNER_DISK_MB", LEARNER_MB)


def exchange_mb() -> int:
    return _env_mb("MULTIGPU_EXCHANGE_DISK_MB", EXCHANGE_MB)


def grading_mb() -> int:
    return _env_mb("MULTIGPU_GRADING_DISK_MB", GRADING_MB)


def disks_dir() -> Path:
    return Path(os.environ.get("MULTIGPU_DISKS_DIR", "/var/lib/multigpu/disks"))


def _run(*argv: str) -> str:
    tool = shutil.which(argv[0], path=SYSTEM_PATH)
    if tool is None:
        raise DiskError(f"{argv[0]} not found in {SYSTEM_PATH}: disk quotas need util-linux and e2fsprogs")
    proc = subprocess.run([tool, *argv[1:]], capture_output=True, text=True)
    if proc.returncode != 0:
        raise DiskError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def unavailable() -> str | None:
    """Why this box cannot give quotas (not root, no tools, no loop device), or None."""
    if os.geteuid() != 0:
        return "not root (quotas mount a loop device per home)"
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool, path=SYSTEM_PATH) is None:
            return f"no {tool} (util-linux, e2fsprogs)"
    if not Path("/dev/loop-control").exists():
        return "no /dev/loop-control (a container without loop devices)"
    return None


def attach(image: Path, folder: Path, size_mb: int, owner: tuple[int, int], mode: int, journal: bool = True) -> bool:
    """Mount ``image`` (made first, of ``size_mb``, owned ``owner``, with ``folder``'s files copied
    in; without a journal where ``journal`` is False) on ``folder``; False when something is
    mounted there already."""
    if os.path.ismount(folder):
        return False
    folder.mkdir(parents=True, exist_ok=True)
    if not image.exists():
        image.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(image.parent, 0o700)
        made = image.with_suffix(".new")
        with open(made, "wb") as f:
            f.truncate(size_mb << 20)
        _run("mkfs.ext4", "-q", "-F", "-m", "0", *([] if journal else ["-O", "^has_journal"]),
             "-E", f"root_owner={owner[0]}:{owner[1]},lazy_itable_init=1", str(made))
        with tempfile.TemporaryDirectory(dir=image.parent) as staging:
            _run("mount", "-o", MOUNT_OPTIONS, str(made), staging)
            try:
                (Path(staging) / "lost+found").rmdir()
                _run("cp", "-a", "--", f"{folder}/.", staging)
                os.chmod(staging, mode)
            finally:
                _run("umount", staging)
        made.rename(image)
    _run("mount", "-o", MOUNT_OPTIONS, str(image), str(folder))
    return True


def detach(folder: Path) -> None:
    """Unmount ``folder`` (lazily if something still holds it: its loop device goes when freed)."""
    if os.path.ismount(folder):
        try:
            _run("umount", str(folder))
        except DiskError:
            _run("umount", "-l", str(folder))


def home_image(login: str) -> Path:
    return disks_dir() / f"{login}.img"


def attach_home(login: str) -> bool:
    user = pwd.getpwnam(login)
    return attach(home_image(login), Path(user.pw_dir), learner_mb(), (user.pw_uid, user.pw_gid), 0o700)


def detach_home(login: str) -> None:
    detach(Path(pwd.getpwnam(login).pw_dir))
    home_image(login).unlink(missing_ok=True)


def exchange_image(hub: Hub) -> Path:
    return hub.state / "disks" / "exchange.img"


def attach_exchange(hub: Hub) -> bool:
    return attach(exchange_image(hub), hub.exchange, exchange_mb(), (0, 0), 0o1777)


def detach_exchange(hub: Hub) -> None:
    detach(hub.exchange)


def grading_image(hub: Hub, job_id: int, run: str = "") -> Path:
    return hub.state / "disks" / f"grading-{job_id}{run}.img"


@contextlib.contextmanager
def grading_space(hub: Hub, job_id: int, gid: int, log: Callable[[str], None] = print,
                  run: str = "") -> Iterator[Path]:
    """One grading's folder, ``scratch/job-N`` (``job-N-slurmM`` with ``run`` "-slurmM": a grading
    in Slurm job M, ``autograde.run_suffix``; root's, group ``gid``, 710), for the grading's life:
    a file system of its own of ``MULTIGPU_GRADING_DISK_MB`` (no journal: it ends with the grading),
    so what a learner's notebook or train.py writes there (the autograde's course, the official
    run's folder) meets "No space left on device" at that size, not on the box's disk. Whatever a
    killed grading of the same job left is removed first; everything goes after. Where the box
    cannot mount images (:func:`unavailable`) the folder is a plain one, and the log says so."""
    folder, image = hub.scratch / f"job-{job_id}{run}", grading_image(hub, job_id, run)

    def remove() -> None:
        remove_gradings(hub, job_id, run)
        if folder.is_dir() and not os.path.ismount(folder):  # a plain folder (no loop devices): a learner's tree
            with safefiles.opened(os.open(folder.parent, safefiles.DIR_FLAGS)) as parent:
                safefiles.remove_entry(parent, folder.name)

    remove()
    why = unavailable()
    if why is None:
        try:
            folder.mkdir(mode=0o700)
            attach(image, folder, grading_mb(), (0, gid), 0o710, journal=False)
        except DiskError as e:
            why = str(e)
            remove()
    if why is not None:
        log(f"warning: this grading's folder has no size bound ({why})")
        folder.mkdir(mode=0o700)
    os.chown(folder, 0, gid)  # the mounted file system's root, or the plain folder
    os.chmod(folder, 0o710)
    try:
        yield folder
    finally:
        remove()


def remove_gradings(hub: Hub, job_id: int | None = None, run: str = "") -> int:
    """Unmount and delete the file systems gradings left (job ``job_id``'s of ``run``, or every
    job's, those of Slurm jobs included): a
    grading killed before its own clean-up (its time limit, a stop of the service or the hub). The
    service calls it after each grading and at its start, ``multigpu workshop stop`` at the end.
    Returns how many were mounted."""
    which = "*" if job_id is None else f"{job_id}{run}"
    mounted = 0
    if hub.scratch.is_dir():
        for folder in hub.scratch.glob(f"job-{which}"):
            if os.path.ismount(folder):
                detach(folder)
                mounted += 1
    for image in (hub.state / "disks").glob(f"grading-{which}.img"):
        image.unlink(missing_ok=True)
    return mounted


def when_full(space: Path) -> str:
    """Words for a learner whose grading failed while its folder ``space`` was full ("" when it
    was not): the cause, before the tool's own error."""
    disk = os.statvfs(space)
    if disk.f_bavail * disk.f_frsize >= 1 << 20:
        return ""
    return (f"the grading's folder is full ({disk.f_blocks * disk.f_frsize / 2**20:,.0f} MB: what your notebook or "
            "train.py wrote there while it was graded), so the grading could not go on; write less (or delete what "
            "you wrote) and submit again. What stopped: ")


def refuse_when_full(model: dict, path: str, contents_manager, **kwargs) -> None:
    """JupyterLab's pre-save hook on a hub: a save that does not fit in the learner's home is
    refused with a message that says so (HTTP 507), before a file is cut short on the disk."""
    from tornado.web import HTTPError

    content = model.get("content")
    needed = len(str(content).encode()) if content is not None else 0
    disk = os.statvfs(contents_manager.root_dir)
    free = disk.f_bavail * disk.f_frsize
    if needed + (256 << 10) > free:  # with room for the file's blocks and a checkpoint's copy
        total = disk.f_blocks * disk.f_frsize
        raise HTTPError(507, f"Your home folder is full ({(total - free) / 2**20:,.0f} MB of {total / 2**20:,.0f} MB "
                             f"used; {path} needs about {needed / 2**20:,.1f} MB): nothing was saved. Delete files you "
                             "no longer need (checkpoints, copies of data, old outputs) in a terminal (du -sh ~/* shows "
                             "the largest) and save again.")


def quota(attach: Callable[[], bool], what: str) -> None:
    """Mount one image (``attach``: :func:`attach_home` or :func:`attach_exchange` bound to theirs);
    say so, or why not, without stopping the hub: a box without loop devices serves without quotas."""
    why = unavailable()
    try:
        if why is None and attach():
            print(f"disk quota: {what} mounted")
    except DiskError as e:
        why = str(e)
    if why:
        print(f"warning: no disk quota for {what}: {why}", file=sys.stderr)

