"""Disk quotas (``multigpu.workshop.disks``) on real loop devices: a folder's files move into its own
ext4 image, writing past the image's size fails with ENOSPC there alone, JupyterLab's pre-save hook
refuses a save that does not fit with a message that says why, and the image survives an unmount
(the exchange's, after a reboot) or goes with its account (a learner's). The hub tests run them on
a real hub (tests/test_workshop_attacks.py, test 17)."""

from __future__ import annotations

import errno
import os
import types
from pathlib import Path

import pytest
from tornado.web import HTTPError

from multigpu.workshop import disks

pytestmark = [pytest.mark.slow, pytest.mark.skipif(disks.unavailable() is not None, reason=disks.unavailable() or "")]


def fill(path: Path, most_mb: int) -> tuple[int, int | None]:
    """Write 1 MB at a time into ``path``, at most ``most_mb``; (MB written, the errno that stopped it)."""
    written = 0
    try:
        with open(path, "wb") as f:
            while written < most_mb:
                f.write(b"\1" * 2**20)
                f.flush()
                os.fsync(f.fileno())
                written += 1
    except OSError as e:
        return written, e.errno
    return written, None


def test_a_folder_on_its_own_image_fills_alone_and_a_save_that_does_not_fit_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("MULTIGPU_DISKS_DIR", str(tmp_path / "disks"))
    folder, beside = tmp_path / "home", tmp_path / "beside"
    folder.mkdir()
    beside.mkdir()
    (folder / "notes.txt").write_text("kept")
    image = tmp_path / "disks" / "one.img"
    try:
        assert disks.attach(image, folder, 24, (os.getuid(), os.getgid()), 0o700)
        assert os.path.ismount(folder) and not disks.attach(image, folder, 24, (0, 0), 0o700), "mounted twice"
        assert (folder / "notes.txt").read_text() == "kept", "the folder's files were not copied in"
        assert not (folder / "lost+found").exists()
        assert oct(folder.stat().st_mode & 0o7777) == "0o700"
        assert image.stat().st_blocks * 512 < 12 * 2**20, "the image is not sparse"

        written, err = fill(folder / "big.bin", 64)
        assert err == errno.ENOSPC and 16 <= written <= 24, (written, err)
        assert fill(beside / "big.bin", 32) == (32, None), "a folder beside the image was stopped too"

        manager = types.SimpleNamespace(root_dir=str(folder))
        with pytest.raises(HTTPError) as refused:
            disks.refuse_when_full({"type": "file", "content": "x" * 1_000_000}, "new.txt", manager)
        assert refused.value.status_code == 507 and "home folder is full" in refused.value.log_message
        (folder / "big.bin").unlink()
        disks.refuse_when_full({"type": "file", "content": "x" * 1_000_000}, "new.txt", manager)  # fits again

        disks.detach(folder)
        assert not os.path.ismount(folder) and not (folder / "big.bin").exists()
        assert disks.attach(image, folder, 24, (0, 0), 0o700) and (folder / "notes.txt").read_text() == "kept", \
            "the image lost its files across an unmount"
    finally:
        disks.detach(folder)
    assert not os.path.ismount(folder)


def test_sizes_come_from_the_environment_and_nonsense_is_refused(monkeypatch):
    monkeypatch.setenv("MULTIGPU_LEARNER_DISK_MB", "512")
    assert disks.learner_mb() == 512
    for bad in ("lots", "8"):
        monkeypatch.setenv("MULTIGPU_EXCHANGE_DISK_MB", bad)
        with pytest.raises(disks.DiskError, match="MULTIGPU_EXCHANGE_DISK_MB"):
            disks.exchange_mb()


def test_a_gradings_folder_is_a_file_system_of_its_own_while_it_runs_and_nothing_of_it_stays(tmp_path, monkeypatch):
    """``grading_space``: the job's folder is root's, group the grading account's, 710, on an image of
    MULTIGPU_GRADING_DISK_MB; writing in it meets ENOSPC there (its reserve is 0: root's writes
    stop there too); a killed grading's leftovers of the same job are removed first, and the
    folder, its mount and its image are gone after."""
    import pwd

    monkeypatch.setenv("MULTIGPU_GRADING_DISK_MB", "24")
    hub = types.SimpleNamespace(scratch=tmp_path / "scratch", state=tmp_path / "state")
    hub.scratch.mkdir()
    (hub.scratch / "job-7").mkdir()
    (hub.scratch / "job-7" / "left-by-a-killed-run").write_text("x")
    nobody = pwd.getpwnam("nobody")
    said: list[str] = []
    with disks.grading_space(hub, 7, nobody.pw_gid, said.append) as space:
        assert space == hub.scratch / "job-7" and os.path.ismount(space) and said == []
        st = space.stat()
        assert (st.st_uid, st.st_gid, oct(st.st_mode & 0o7777)) == (0, nobody.pw_gid, "0o710")
        assert os.listdir(space) == [], "a killed grading's files were kept"
        written, err = fill(space / "official.bin", 64)
        assert err == errno.ENOSPC and 16 <= written <= 24, (written, err)
    assert not hub.scratch.joinpath("job-7").exists() and not disks.grading_image(hub, 7).exists()
    mounts = Path("/proc/self/mounts").read_text()
    assert str(hub.scratch) not in mounts


def test_without_loop_devices_a_gradings_folder_is_a_plain_one_and_the_log_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(disks, "unavailable", lambda: "no /dev/loop-control (a container without loop devices)")
    hub = types.SimpleNamespace(scratch=tmp_path / "scratch", state=tmp_path / "state")
    hub.scratch.mkdir()
    said: list[str] = []
    with disks.grading_space(hub, 3, 0, said.append) as space:
        assert space.is_dir() and not os.path.ismount(space) and oct(space.stat().st_mode & 0o7777) == "0o710"
        (space / "x").write_text("x")
    assert said == ["warning: this grading's folder has no size bound (no /dev/loop-control (a container without "
                    "loop devices))"]
    assert not space.exists()


def test_a_grading_that_failed_in_a_full_folder_says_so_first(tmp_path):
    folder, image = tmp_path / "job-1", tmp_path / "job-1.img"
    folder.mkdir()
    try:
        disks.attach(image, folder, 16, (0, 0), 0o710, journal=False)
        assert disks.when_full(folder) == ""
        assert fill(folder / "big.bin", 64)[1] == errno.ENOSPC
        assert disks.when_full(folder).startswith("the grading's folder is full (1")
    finally:
        disks.detach(folder)


def test_a_grading_killed_before_its_clean_up_leaves_nothing_once_the_service_looks(tmp_path, monkeypatch):
    """A grading's process killed inside ``grading_space`` (its time limit, a stop): the context's
    clean-up never ran; ``remove_gradings`` (the service after each grading and at its start,
    ``workshop stop``) unmounts and deletes its file system, and only that job's when given one."""
    monkeypatch.setenv("MULTIGPU_GRADING_DISK_MB", "16")
    hub = types.SimpleNamespace(scratch=tmp_path / "scratch", state=tmp_path / "state")
    hub.scratch.mkdir()
    killed = [disks.grading_space(hub, n, 0, print) for n in (4, 5)]
    for space in killed:
        space.__enter__()  # and never left: the process died here
    assert all(os.path.ismount(hub.scratch / f"job-{n}") for n in (4, 5))
    assert disks.remove_gradings(hub, 4) == 1 and not os.path.ismount(hub.scratch / "job-4")
    assert os.path.ismount(hub.scratch / "job-5") and disks.grading_image(hub, 5).exists()
    assert disks.remove_gradings(hub) == 1 and not os.path.ismount(hub.scratch / "job-5")
    assert not list((hub.state / "disks").glob("grading-*"))
