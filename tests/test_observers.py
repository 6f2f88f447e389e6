"""What the grader sees from outside a run (grading/reads.py, connections.py, observations.py):
real files opened through a real private view, real TCP connections between real processes in
the sandbox's own network namespace, and the verdicts and flags those facts give."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from array import array
from pathlib import Path

import pytest

from multigpu.grading import connections, observations, reads
from multigpu.grading import sandbox as sb
from multigpu.grading.connections import Link, Talk
from multigpu.grading.criteria import accuracy
from multigpu.grading.reads import EpochReads, ReadLog


def _files(root: Path, classes: int = 2, per_class: int = 5) -> list[str]:
    """An ImageFolder of small real files (``root/train/<class>/<i>.jpg``); their paths in index order."""
    paths = []
    for c in range(classes):
        folder = root / "train" / f"class{c}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            (folder / f"{i:03d}.jpg").write_bytes(bytes([c, i]) * 64)
            paths.append(str(folder / f"{i:03d}.jpg"))
    return paths




# ----------------------------------------------------------------------------- what was read


def test_the_watch_sees_each_open_through_the_view_and_none_through_another_link(tmp_path):
    cache = tmp_path / "cache"
    _files(cache)
    view = reads.private_view(cache, tmp_path / "view")
    samples = sorted(str(p) for p in (view / "train").rglob("*.jpg"))
    assert os.stat(samples[0]).st_ino == os.stat(cache / "train" / "class0" / "000.jpg").st_ino  # a link, not a copy
    ckpt = tmp_path / "run" / "checkpoints"
    watch = reads.ReadWatch(view / "train", samples, ckpt)
    assert ckpt.is_dir()  # made before the run, so that the first checkpoint's arrival is seen
    for i in (3, 7, 3):
        with open(samples[i], "rb") as f:
            f.read()
    (cache / "train" / "class1" / "004.jpg").read_bytes()  # the same file through the shared cache: not this grading's
    (ckpt / "rank-0-epoch-1.tmp").write_bytes(b"x")
    os.replace(ckpt / "rank-0-epoch-1.tmp", ckpt / "rank-0-epoch-1.pt")  # as save_checkpoint does
    (ckpt / "rank-1-epoch-1.pt").write_bytes(b"x")  # written in place
    (ckpt / "notes.txt").write_bytes(b"x")  # not a checkpoint
    with open(samples[9], "rb") as f:
        f.read()
    (ckpt / "rank-1-epoch-1.pt").write_bytes(b"y")  # written again: this one is what counts
    time.sleep(0.2)
    log = watch.stopped()
    assert log.lost == "" and list(log.indices) == [3, 7, 3, 9]
    assert log.arrivals == {(0, 1): 3, (1, 1): 4}  # rank 0's after the first three opens, rank 1's last after all
    assert log.between(0, 3) == {3, 7} and log.before(4) == {3, 7, 9}
    assert watch.fd == -1  # the watch is closed


def test_claims_are_set_against_reads_epoch_by_epoch():
    """Epoch 1 reads 0-9 (rank 1 reads 9 after rank 0 saved: still epoch 1's window); epoch 2
    reads 0-5 and claims 0-9 (6-9 read in epoch 1: from memory); epoch 3 claims 10-11, never read."""
    log = ReadLog(array("i", [*range(10), *range(6)]),
                  {(0, 1): 9, (1, 1): 10, (0, 2): 16, (1, 2): 16, (0, 3): 16, (1, 3): 16})
    assert reads.windows(log.arrivals, [1, 2, 3, 4]) == {1: (0, 10), 2: (9, 16), 3: (16, 16)}
    got = reads.epoch_reads(log, {1: set(range(10)), 2: set(range(10)), 3: {10, 11}})
    # epoch 2's window begins when rank 0 saved epoch 1: the open of 9 belongs to both windows
    assert got == [EpochReads(1, 10, 10, 10, 0, 0), EpochReads(2, 10, 7, 7, 3, 0), EpochReads(3, 2, 0, 0, 0, 2)]


def test_a_claim_never_read_fails_a_cache_is_held_and_images_count_only_what_was_read():
    honest = observations.Observed((EpochReads(1, 10, 10, 10, 0, 0), EpochReads(2, 10, 10, 10, 0, 0)), "", (), "mpi")
    assert observations.flags(honest) == [] and not honest.never_read()
    assert observations.seen_images(honest, {1: 10, 2: 10}) == {1: 10, 2: 10}
    cached = observations.Observed((EpochReads(1, 10, 10, 10, 0, 0), EpochReads(2, 10, 0, 0, 10, 0)), "", (), "mpi")
    (flag,) = observations.flags(cached)
    assert flag.kind == "reads" and flag.line == 0 and "epoch 2: 0 of 10" in flag.code and "cache" in flag.why
    assert observations.seen_images(cached, {1: 10, 2: 10}) == {1: 10, 2: 10}
    short = observations.Observed((EpochReads(1, 10, 7, 7, 0, 3), EpochReads(2, 10, 8, 8, 1, 1)), "", (), "mpi")
    assert [r.epoch for r in short.never_read()] == [1, 2] and observations.flags(short) == []  # sharded fails it
    assert observations.seen_images(short, {1: 10, 2: 10}) == {1: 7, 2: 9}
    lost = observations.Observed((EpochReads(1, 10, 7, 7, 0, 3),), "the queue overflowed", (), "mpi")
    assert not lost.never_read() and observations.seen_images(lost, {1: 10}) == {1: 10}  # no evidence against
    assert [f.kind for f in observations.flags(lost)] == ["reads"]


@pytest.mark.slow
def test_reads_inside_the_sandbox_are_seen_from_outside(tmp_path):
    if sb.unavailable():
        pytest.skip(sb.unavailable())
    view = tmp_path / "view"
    samples = _files(view)
    work = tmp_path / "work"
    watch = reads.ReadWatch(view / "train", samples, work / "checkpoints")
    reader = (f"import os\nfor p in {samples[2:5]!r}: open(p, 'rb').read()\n"
              "open('checkpoints/rank-0-epoch-1.pt', 'wb').close()\n"
              f"open({samples[6]!r}, 'rb').read()\n")
    for folder in (work, work / "checkpoints"):
        sb.give_workdir(folder)  # as root the run is an unprivileged account's, as in grading
    argv = sb.command([sys.executable, "-c", reader], workdir=work, readable=[view])
    subprocess.run(argv, check=True, timeout=60, env=sb.environment())
    time.sleep(0.2)
    log = watch.stopped()
    assert list(log.indices) == [2, 3, 4, 6] and log.arrivals == {(0, 1): 3}


# ----------------------------------------------------------------------------- who talked to whom


PEER = textwrap.dedent("""
    import os, socket, sys, time
    port = int(sys.argv[1])
    if os.environ["HOROVOD_RANK"] == "0":
        server = socket.socket(); server.bind(("127.0.0.1", port)); server.listen()
        conn, _ = server.accept()
    else:
        for _ in range(200):
            try:
                conn = socket.create_connection(("127.0.0.1", port)); break
            except OSError:
                time.sleep(0.05)
    print("connected", flush=True)
    time.sleep(30)
""")


@pytest.mark.slow
def test_a_connection_between_two_ranks_in_the_sandbox_is_seen_with_its_ranks(tmp_path):
    """Two processes told they are ranks 0 and 1 (as horovodrun --gloo tells them) connect over
    the sandbox's loopback; the grader, outside, names both ends."""
    if sb.unavailable():
        pytest.skip(sb.unavailable())
    script = tmp_path / "peer.py"
    script.write_text(PEER)
    runner = (f"import subprocess, os, sys\n"
              f"ps = [subprocess.Popen([sys.executable, {str(script)!r}, '29999'], stdout=subprocess.PIPE,\n"
              f"      env={{**os.environ, 'HOROVOD_RANK': str(r)}}) for r in (0, 1)]\n"
              f"[p.stdout.readline() for p in ps]\nprint('both', flush=True)\n[p.wait() for p in ps]\n")
    sb.give_workdir(tmp_path)
    argv = sb.command([sys.executable, "-c", runner], workdir=tmp_path, readable=[tmp_path])
    job = subprocess.Popen(argv, stdout=subprocess.PIPE, env=sb.environment(), start_new_session=True)
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == b"both"
        import psutil

        pids = {c.pid for c in psutil.Process(job.pid).children(recursive=True)}
        watch = connections.TalkWatch(every=0)
        watch.started(time.monotonic())
        watch.tick(pids, 1.0)
        talk = watch.stopped()
    finally:
        os.killpg(job.pid, 9)
        job.wait()
    assert [(x.a, x.b) for x in talk.links] == [("rank 0", "rank 1")], talk
    assert 29999 in (talk.links[0].a_port, talk.links[0].b_port)
    assert talk.horovod_ranks == []  # neither loaded Horovod
    assert connections.extra_links(talk, "mpi") == talk.links
    assert connections.extra_links(talk, "gloo") == talk.links  # no Horovod in them: not Horovod's


def test_a_connection_is_paired_by_its_two_ends_and_named_by_who_holds_them():
    """Both ends in the job's processes (here: this one, which no launcher gave a rank): one
    connection between two launchers, never one between ranks."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    port = server.getsockname()[1]
    try:
        found = [x for x in connections.snapshot({os.getpid()}) if port in (x[1], x[3])]
        assert connections.snapshot(set()) == []  # no process of the job: nothing is theirs
    finally:
        for s in (client, conn, server):
            s.close()
    assert len(found) == 1 and found[0][0].startswith("launcher") and found[0][2].startswith("launcher"), found


def _link(a: str, b: str, port: int = 1) -> Link:
    return Link(a, b, port, port + 1, 5.0)


def test_what_horovod_opens_is_not_flagged_and_the_rest_is():
    mesh = [_link(f"rank {i}", f"rank {j}", 100 * i + 10 * j + k) for i in range(4) for j in range(i + 1, 4)
            for k in range(connections.GLOO_LINKS_PER_PAIR)]
    to_launcher = [_link("launcher (horovodrun)", "rank 0")]
    four = ["rank 0", "rank 1", "rank 2", "rank 3"]
    horovod_gloo = Talk(mesh + to_launcher, 10, four)
    assert connections.extra_links(horovod_gloo, "gloo") == []
    assert connections.extra_links(Talk(to_launcher, 10, four), "mpi") == []
    ddp = [_link(f"rank {i}", f"rank {j}", 9000 + i * 10 + j) for i in range(4) for j in range(i + 1, 4)]
    assert connections.extra_links(Talk(mesh + ddp, 10, four), "gloo") == ddp  # one more per pair
    assert connections.extra_links(Talk(ddp, 10, []), "gloo") == ddp  # no rank loaded Horovod
    assert connections.extra_links(Talk(ddp, 10, four), "mpi") == ddp  # over MPI Horovod opens none
    seen = observations.Observed(None, "", tuple(ddp), "mpi")
    (flag,) = observations.flags(seen)
    assert flag.kind == "network" and "6 TCP connection(s)" in flag.why and "rank 0 (port 9001)" in flag.code


# ----------------------------------------------------------------------------- time to accuracy


def test_time_to_accuracy_is_the_first_epoch_after_which_accuracy_stays():
    times = {1: 30.0, 2: 55.0, 3: 80.0, 4: 104.0}
    assert accuracy.time_to_accuracy({1: 0.5, 2: 0.85, 3: 0.9, 4: 0.95}, times, 0.8) == (2, 55.0)
    assert accuracy.time_to_accuracy({1: 0.85, 2: 0.7, 3: 0.9, 4: 0.95}, times, 0.8) == (3, 80.0)  # it dipped
    assert accuracy.time_to_accuracy({1: 0.85, 2: 0.9, 3: 0.9, 4: 0.7}, times, 0.8) is None  # it did not stay
    assert accuracy.time_to_accuracy({}, times, 0.8) is None
