"""The workshop hub's parts that need no hub: the queue on disk, the course layout per lab, the
account helpers, the core split, JupyterHub's settings. (tests/test_workshop_hub.py runs a hub.)"""

from __future__ import annotations

import os
import re
import time
import types
from pathlib import Path

import pytest

from conftest import REPO
from multigpu.workshop import accounts, course, hubconfig, jobs, layout, limits


def test_lab_assignment_groups_a_lab_and_its_b_part():
    assert layout.lab_assignment("00-welcome.ipynb") == "lab-00"
    assert layout.lab_assignment("02b-ring-allreduce.ipynb") == "lab-02"
    with pytest.raises(ValueError, match="lab number"):
        layout.lab_assignment("welcome.ipynb")


def test_one_assignment_per_lab_and_the_starter_for_the_assessment(repo):
    from multigpu.grading.grader import STARTER

    got = course.assignments(repo)
    labs = sorted(p.name for p in (repo / "solutions" / "notebooks").glob("*.ipynb"))
    assert [a for a in got if a != layout.ASSESSMENT] == sorted({layout.lab_assignment(n) for n in labs})
    assert sorted(p.name for files in got.values() for p in files if p.suffix == ".ipynb") == sorted(
        labs + ["assessment.ipynb"])
    # the learner's train.py is the starter, never the instructor's converted solution
    assert STARTER in got[layout.ASSESSMENT]
    assert not any(p.name == "train.py" for p in got[layout.ASSESSMENT])


def test_hub_sources_leave_the_repository_layout_alone(repo, tmp_path):
    before = sorted(str(p.relative_to(repo)) for p in (repo / "notebooks").iterdir())
    made = course.write_sources(layout.Hub(tmp_path), repo)
    assert made[-1] == layout.ASSESSMENT and made[0] == "lab-00"
    assert (tmp_path / "course" / "source" / "lab-02" / "02b-ring-allreduce.ipynb").is_file()
    starter = (tmp_path / "course" / "source" / "assessment" / "train.py").read_text()
    assert "hvd.init" not in starter, "the released train.py must be the unconverted starter"
    assert sorted(str(p.relative_to(repo)) for p in (repo / "notebooks").iterdir()) == before


def test_resubmission_replaces_a_waiting_job_and_a_full_queue_holds(tmp_path):
    q = jobs.Queue(tmp_path / "q.sqlite", limit=2)
    a1 = q.add("ana+lab-00+t1+x", "ana", "lab-00", "t1")
    b1 = q.add("ben+lab-00+t1+y", "ben", "lab-00", "t1")
    assert q.add("ana+lab-00+t1+x", "ana", "lab-00", "t1").id == a1.id, "a known submission is recorded once"
    a2 = q.add("ana+lab-00+t2+z", "ana", "lab-00", "t2")
    assert q.get(a1.id).state == "replaced" and "later submission" in q.get(a1.id).message
    assert (a2.state, q.position(a2), q.position(b1)) == ("queued", 2, 1)
    forged = q.add("ana+lab-00+t3+f", "ana", "lab-00", "t3", state="failed", message="made by another account")
    assert forged.state == "failed" and q.get(a2.id).state == "queued", "a refused submission replaces nothing"
    c1 = q.add("cy+lab-01+t1+w", "cy", "lab-01", "t1")
    assert c1.state == "held" and "queue is full" in c1.message and q.position(c1) == 3
    assert q.take().id == b1.id
    assert q.take().id == a2.id  # a place freed: the held job joins the queue
    assert q.get(c1.id).state == "queued"


def test_the_queue_survives_a_restart_and_gives_up_after_repeated_cuts(tmp_path):
    path = tmp_path / "q.sqlite"
    q = jobs.Queue(path)
    first = q.add("ana+lab-00+t1+x", "ana", "lab-00", "t1")
    later = q.add("ben+lab-00+t1+y", "ben", "lab-00", "t1")
    assert q.take().id == first.id
    q2 = jobs.Queue(path)  # the service restarted: a new process opens the same file
    assert [j.id for j in q2.recover()] == [first.id]
    assert q2.get(first.id).state == "queued" and "restarted" in q2.get(first.id).message
    assert q2.take().id == first.id, "a job cut off by a restart runs before later ones"
    for _ in range(jobs.MAX_ATTEMPTS - 2):  # two starts so far
        q2.recover()
        assert q2.take().id == first.id
    q2.recover()
    assert q2.get(first.id).state == "failed" and "cut off" in q2.get(first.id).message
    assert q2.get(later.id).state == "queued"
    q2.finish(later.id, "done", "ok", {"score": 1})
    assert q2.get(later.id).result == {"score": 1}
    with pytest.raises(ValueError):
        q2.finish(later.id, "queued", "")


def test_submission_names():
    from multigpu.workshop import submissions

    got = submissions.parse("ana+lab-00+2026-11-25 19:36:28.863787 UTC+1e1R3iAbCdEf")
    assert (got.student, got.assignment, got.timestamp) == ("ana", "lab-00", "2026-11-25 19:36:28.863787 UTC")
    for bad in ("garbage", "ana+..+2026-11-25 19:36:28.863787 UTC+1e1R3iAbCdEf",
                "ana+lab-00/x+2026-11-25 19:36:28.863787 UTC+1e1R3iAbCdEf", "ana+lab-00+2026-11-25 19:36:28 UTC",
                "!\udcff\udcfe+lab-00+2026-11-25 19:36:28.863787 UTC+1e1R3iAbCdEf", "Ana+lab-00+yesterday+1e1R3iAbCdEf"):
        assert submissions.parse(bad) is None, bad
    assert submissions.valid_parts("ana", "lab-00") and not submissions.valid_parts("ana", "..")


def test_learners_take_turns_and_names_that_are_not_submissions_are_recorded_once(tmp_path):
    """A learner with five assignments waiting does not hold up one with a single submission."""
    q = jobs.Queue(tmp_path / "q.sqlite")
    many = [q.add(f"ana+lab-0{i}+t{i}+x", "ana", f"lab-0{i}", f"t{i}") for i in range(5)]
    ben = q.add("ben+lab-00+t9+y", "ben", "lab-00", "t9")
    assert q.position(ben) == 2, "ben's only job comes right after ana's first"
    order = [q.take().student for _ in range(6)]
    assert order == ["ana", "ben", "ana", "ana", "ana", "ana"], order
    assert {j.state for j in q.jobs()} == {"running"} and many[0].id < ben.id
    q.ignore("!\udcff+lab-00+x", "ben", "not a submission's name")
    q.ignore("!\udcff+lab-00+x", "ben", "not a submission's name")
    assert q.ignored() == (1, [("!\udcff+lab-00+x", "ben", "not a submission's name")])
    assert q.known("!\udcff+lab-00+x") and "!\udcff+lab-00+x" in q.seen() and "ana+lab-00+t0+x" in q.seen()


def test_a_submission_is_copied_only_as_its_learners_regular_files(tmp_path):
    """``safefiles.copy_tree`` (the copy the grading service takes of each submission): folders and
    regular files are copied; anything else refuses the whole copy with words for the learner,
    and nothing is left of it. (As a learner on a real hub: tests/test_workshop_attacks.py.)"""
    import os

    from multigpu.workshop import safefiles

    caps = safefiles.Caps(file_bytes=2**20, total_bytes=int(1.5 * 2**20), entries=6, depth=2)

    def submission(name: str) -> Path:
        src = tmp_path / name
        (src / "data").mkdir(parents=True)
        (src / "00-welcome.ipynb").write_text("{}")
        (src / "data" / "x.txt").write_text("x")
        return src

    got = safefiles.copy_tree(submission("ok"), tmp_path / "ok-copy", owner=os.getuid(), caps=caps)
    assert sorted(got) == ["00-welcome.ipynb", "data/x.txt"] and (tmp_path / "ok-copy" / "data" / "x.txt").read_text() == "x"
    key = tmp_path / "course-key"
    key.write_text("-----BEGIN PRIVATE KEY-----")
    attacks = {
        "a symbolic link": lambda d: (d / "k.html").symlink_to(key),
        "a FIFO": lambda d: os.mkfifo(d / "data" / "pipe"),
        "a hard link": lambda d: os.link(d / "00-welcome.ipynb", d / "again.ipynb"),
        "is 1024 MiB": lambda d: os.truncate(os.open(d / "big.bin", os.O_CREAT | os.O_WRONLY), 2**30),
        "larger than 1 MiB": lambda d: [(d / f"f{i}").write_bytes(b"x" * 600_000) for i in range(3)],
        "more than 6 files": lambda d: [(d / f"e{i}").touch() for i in range(6)],
        "nested more than 2": lambda d: (d / "data" / "a" / "b" / "c").mkdir(parents=True),
        "not UTF-8": lambda d: (d / os.fsdecode(b"n\xff")).touch(),
        "control characters": lambda d: (d / "a\nb").touch(),
        "another account": lambda d: os.chown(d / "data" / "x.txt", os.getuid() + 1, -1) if os.geteuid() == 0 else
        pytest.skip("needs root"),
    }
    for i, (words, make) in enumerate(attacks.items()):
        src = submission(f"bad{i}")
        make(src)
        with pytest.raises(safefiles.Refused, match=words):
            safefiles.copy_tree(src, tmp_path / f"bad{i}-copy", owner=os.getuid(), caps=caps)
        assert not (tmp_path / f"bad{i}-copy").exists(), f"{words}: a refused copy left files behind"
    assert "BEGIN PRIVATE KEY" not in "".join(p.read_text() for p in tmp_path.rglob("*-copy/**/*") if p.is_file())


def test_handing_a_tree_over_changes_links_not_what_they_point_to(tmp_path):
    import os

    from multigpu.workshop import safefiles

    target = tmp_path / "root-file"
    target.write_text("root's")
    tree = tmp_path / "tree"
    (tree / "d").mkdir(parents=True)
    (tree / "d" / "link").symlink_to(target)
    uid, gid = os.getuid(), os.getgid()
    safefiles.chown_tree(tree, uid, gid)  # the same owner: it runs without root, and must not follow
    assert (tree / "d" / "link").is_symlink() and target.read_text() == "root's"
    with pytest.raises(OSError):
        safefiles.chown_tree(tree / "d" / "link", uid, gid)  # a link given as the tree is refused
    with pytest.raises(ValueError):
        safefiles.open_dir(tree, "..")


def test_an_autograded_notebook_reaches_the_instructor_without_script_but_with_what_grading_reads():
    import nbformat

    from multigpu.workshop import autograde

    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {"state": "<script>w()</script>"}
    nb.cells = [nbformat.v4.new_markdown_cell("mine: <img src=x onerror=steal()> a < b"),
                nbformat.v4.new_raw_cell("<script>raw()</script>"),
                nbformat.v4.new_code_cell("1", outputs=[
                    nbformat.v4.new_output("display_data", data={"text/html": "<script>h()</script>",
                                                                 "application/javascript": "j()", "image/svg+xml": "<svg/>",
                                                                 "text/plain": "shown", "image/png": "iVBOR"}),
                    nbformat.v4.new_output("error", ename="AssertionError", evalue="no", traceback=["no"]),
                    nbformat.v4.new_output("execute_result", data={"text/plain": "0.5"}, execution_count=1)])]
    out = autograde.defang(nbformat.writes(nb).encode())
    for script in ("<img", "<script", "j()", "<svg", "widgets"):
        assert script not in out, script
    back = nbformat.reads(out, as_version=4)
    assert [o["output_type"] for o in back.cells[2].outputs] == ["display_data", "error", "execute_result"]
    assert back.cells[2].outputs[0]["data"] == {"text/plain": "shown", "image/png": "iVBOR"}
    assert "steal()" in back.cells[0].source, "the answer is still there, as text"
    assert nbformat.reads(autograde.defang(b"\xff not a notebook"), as_version=4).cells == []


def test_passwords_and_logins():
    pw = accounts.password()
    assert re.fullmatch(r"[a-z2-9]{4}-[a-z2-9]{4}-[a-z2-9]{4}", pw) and not set(pw) & set("01lo")
    assert len({accounts.password() for _ in range(50)}) == 50
    assert accounts.LOGIN.match("learner01") and not accounts.LOGIN.match("Root;rm") and not accounts.LOGIN.match("1abc")


def test_names_from_a_csv(tmp_path):
    f = tmp_path / "room.csv"
    f.write_text("name,login\nAna Lima,ana\n# late,x\nBen Ode,ben\n")
    assert accounts.names_from_csv(f) == ["ana", "ben"]
    f.write_text("ana\nben\n\n")
    assert accounts.names_from_csv(f) == ["ana", "ben"]
    f.write_text("")
    with pytest.raises(accounts.AccountError, match="no names"):
        accounts.names_from_csv(f)


def test_grading_cores_are_kept_apart_from_learners():
    assert limits.split_cores([0, 1]) == ([0], [1])
    assert limits.split_cores(list(range(8))) == (list(range(6)), [6, 7])
    assert limits.split_cores(list(range(64))) == (list(range(60)), [60, 61, 62, 63]), "a core per assessment worker"
    assert limits.split_cores([0, 1], reserved=0) == ([0, 1], [0, 1]), "0: grading shares the learners' cores"
    assert limits.split_cores([0]) == ([0], [0]), "one core cannot be split: grading shares it"
    assert limits.split_cores(list(range(8)), reserved=3) == ([0, 1, 2, 3, 4], [5, 6, 7])
    with pytest.raises(ValueError, match="at least one"):
        limits.split_cores([0, 1], reserved=2)


def test_hub_settings(monkeypatch, tmp_path):
    """What a workshop depends on: PAM with the workshop's groups, instructors as admins, the
    local process spawner that confines servers, localhost unless told, the grading service."""
    monkeypatch.setenv("MULTIGPU_HUB_ROOT", str(tmp_path))
    monkeypatch.setenv("MULTIGPU_HUB_INSTRUCTORS", "teach")
    monkeypatch.setenv("MULTIGPU_GRADING_CORES", "1")
    c = types.SimpleNamespace()

    class Section(types.SimpleNamespace):
        pass

    for name in ("JupyterHub", "ConfigurableHTTPProxy", "PAMAuthenticator", "Authenticator", "Spawner"):
        setattr(c, name, Section())
    hubconfig.configure(c)
    assert c.JupyterHub.authenticator_class == "multigpu.workshop.loginlimit.RoomAuthenticator"
    assert c.PAMAuthenticator.allowed_groups == {layout.LEARNERS_GROUP, layout.INSTRUCTORS_GROUP}
    assert c.Authenticator.admin_users == {"teach"}
    assert c.JupyterHub.spawner_class is hubconfig.WorkshopSpawner
    assert c.JupyterHub.bind_url.startswith("http://127.0.0.1:")
    assert Path(c.JupyterHub.db_url.removeprefix("sqlite:///")).parent == tmp_path / "state"
    culler, service = c.JupyterHub.services
    assert service["name"] == "grading" and service["command"][-1] == "multigpu.workshop.service"
    assert culler["name"] == "idle-culler" and "--timeout=3600" in culler["command"]
    learner_cores, grading_cores = limits.split_cores(reserved=1) if len(limits.os.sched_getaffinity(0)) > 1 else ([0], [0])
    assert service["environment"]["MULTIGPU_GRADING_CORES_LIST"] == limits.cpulist(grading_cores)
    env = hubconfig.server_env(layout.Hub(tmp_path), instructor=False)
    assert env["JUPYTER_CONFIG_PATH"].split(":")[0] == str(tmp_path / "etc" / "learner")
    assert env["JUPYTER_CONFIG_PATH"].split(":")[1:] == [str(REPO / "jupyter" / "learner"), str(REPO / "jupyter" / "hub-server")]


@pytest.mark.slow
def test_a_grading_that_crashes_or_hangs_fails_with_a_message_and_keeps_the_queue(tmp_path, monkeypatch):
    """The service's side of a grading: whatever the child does, the job ends done or failed
    with words for the learner, and the next job still runs."""
    import sys

    from multigpu.workshop import service

    hub = layout.Hub(tmp_path)
    q = jobs.Queue(hub.queue_db)
    q.add("ana+lab-00+t1+x", "ana", "lab-00", "t1")
    q.add("ben+lab-00+t1+y", "ben", "lab-00", "t1")
    monkeypatch.setattr(sys, "executable", "/bin/false")  # the grading process dies at once
    crashed = service.grade_one(hub, q, q.take(), timeout=60)
    assert crashed.state == "failed" and "crashed (exit 1)" in crashed.message and "kept" in crashed.message
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\nsleep 60\n")
    hang.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(hang))
    start = time.monotonic()
    slow = service.grade_one(hub, q, q.take(), timeout=2)
    assert time.monotonic() - start < 30
    assert slow.state == "failed" and "longer than 2 s" in slow.message
    assert q.take() is None


@pytest.mark.slow
def test_a_grading_cut_off_by_a_service_stop_stays_running_and_is_graded_again(tmp_path, monkeypatch):
    """The hub stops the service (SIGTERM) while a grading runs: the service kills the grading,
    and its job is left running, not failed, so the next start queues it again."""
    import sys
    import threading

    from multigpu.workshop import service

    hub = layout.Hub(tmp_path)
    q = jobs.Queue(hub.queue_db)
    q.add("ana+lab-00+t1+x", "ana", "lab-00", "t1")
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\nsleep 60\n")
    hang.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(hang))
    monkeypatch.setattr(service, "STOPPING", threading.Event())
    job, out = q.take(), []
    grading = threading.Thread(target=lambda: out.append(service.grade_one(hub, q, job, timeout=60)))
    grading.start()
    deadline = time.monotonic() + 30
    while job.id not in service.RUNNING and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job.id in service.RUNNING, "the grading never started"
    service.halt(15)
    grading.join(30)
    assert out and out[0].state == "running", out
    assert [j.id for j in q.recover()] == [job.id]
    assert q.take().id == job.id



@pytest.mark.slow
def test_a_notebook_that_sleeps_gives_the_grader_back_at_its_assignments_limit(tmp_path, monkeypatch):
    """Real nbgrader with the hub course's settings (a cell may run 30 minutes): a submitted notebook
    whose cell sleeps is stopped at the assignment's budget, per notebook, with a message, and
    nothing of it keeps running."""
    import json
    import subprocess

    from multigpu.workshop import autograde

    root = tmp_path / "course"
    (root / "source" / "lab-00").mkdir(parents=True)
    (root / "nbgrader_config.py").write_text(course.COURSE_CONFIG.format(
        course=str(root), course_id="multigpu", db_url=f"sqlite:///{root / 'gradebook.db'}",
        exchange=str(root / "no-exchange"), assessment=layout.ASSESSMENT))
    notebook = {"cells": [], "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                        "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    (root / "source" / "lab-00" / "00-welcome.ipynb").write_text(json.dumps(notebook))
    autograde.run_nbgrader(["generate_assignment", "lab-00", "--force"], root, what="nbgrader generate_assignment")
    submitted = root / "submitted" / "ana" / "lab-00"
    submitted.mkdir(parents=True)
    notebook["cells"] = [{"cell_type": "code", "execution_count": None, "id": "sleeps", "metadata": {}, "outputs": [],
                          "source": "import time\ntime.sleep(600)"}]
    (submitted / "00-welcome.ipynb").write_text(json.dumps(notebook))
    monkeypatch.setenv("MULTIGPU_GRADING_NOTEBOOK_S", "20")
    budget = autograde.autograde_budget(root / "release" / "lab-00")
    assert budget == 20
    start = time.monotonic()
    with pytest.raises(autograde.JobFailed, match="stopped after 20 s, its limit .* scores nothing"):
        autograde.run_nbgrader(["autograde", "lab-00", "--student", "ana", "--force"], root,
                               what="nbgrader autograde", timeout=budget)
    assert time.monotonic() - start < 60
    left = subprocess.run(["pgrep", "-f", str(root)], capture_output=True, text=True).stdout.split()
    assert not left, f"processes of the stopped grading still run (its kernel): {left}"


def test_a_flood_of_entries_in_the_inbound_folder_is_looked_at_in_bounded_batches_and_removed_past_a_share(
        tmp_path, monkeypatch):
    """A learner who makes thousands of folders in the exchange's inbound folder: each scan looks at a
    bounded number of new entries, the first of that account's entries are recorded as not graded,
    and the rest are removed, so neither the records nor the folder grow without end."""
    from multigpu.workshop import service, submissions

    hub = layout.Hub(tmp_path)
    hub.inbound.mkdir(parents=True)
    for i in range(130):
        (hub.inbound / f"junk-{i:03d}").mkdir()
    (hub.inbound / "junk-link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.setattr(submissions, "SCAN_BATCH", 50)
    monkeypatch.setattr(service, "JUNK_PER_ACCOUNT", 60)
    q = jobs.Queue(tmp_path / "q.sqlite")
    seen: set[str] = set()
    assert service.scan(hub, q, seen=seen) == [] and q.ignored()[0] == 50, "one batch a scan"
    for _ in range(3):
        service.scan(hub, q, seen=seen)
    assert q.ignored()[0] == 60 and q.ignored_by(next(iter(q.ignored()[1]))[1]) == 60
    assert len(list(hub.inbound.iterdir())) == 60, "the entries past the account's share were removed"
    assert q.dropped() == [(next(iter(q.ignored()[1]))[1], 71)]
    assert (tmp_path / "elsewhere").is_dir(), "a link is removed, never followed"


@pytest.mark.skipif(os.geteuid() != 0, reason="a submission must belong to the account it names: root's here")
def test_submissions_refused_or_replaced_on_arrival_count_against_the_share_and_a_good_one_is_still_graded(
        tmp_path, monkeypatch):
    """Folders with a valid submission's name that cannot be graded (a FIFO inside) or that a later
    one replaces at once used to be recorded without end, a row each (a learner's flood grew the
    queue and the pages by 20 entries a scan). Past the account's share they are removed unrecorded;
    a good submission after that is still queued."""
    from multigpu.workshop import gradingpage, service, submissions

    hub = layout.Hub(tmp_path)
    for folder in (hub.course / "source" / "lab-00", hub.exchange / layout.COURSE_ID / "outbound" / "lab-00",
                   hub.inbound, hub.submissions):
        folder.mkdir(parents=True)
    monkeypatch.setattr(service, "JUNK_PER_ACCOUNT", 3)

    def arrive(i: int, fifo: bool) -> str:
        name = f"root+lab-00+2026-11-28 05:00:{i:02d}.000000 UTC+flood{i:03d}"
        (hub.inbound / name).mkdir()
        if fifo:
            os.mkfifo(hub.inbound / name / "00-welcome.ipynb")
        else:
            (hub.inbound / name / "00-welcome.ipynb").write_text("{}")
        (hub.inbound / name / "timestamp.txt").write_text(f"2026-11-28 05:00:{i:02d}.000000 UTC")
        return name

    names = [arrive(i, fifo=True) for i in range(10)]
    time.sleep(submissions.SETTLE_S + 0.3)
    q = jobs.Queue(tmp_path / "q.sqlite")
    seen: set[str] = set()
    service.scan(hub, q, seen=seen)
    recorded = q.jobs("root")
    assert [j.state for j in recorded] == ["replaced"] * 3 and q.refused_of("root") == 3
    assert sorted(os.listdir(hub.inbound)) == names[:3], "the entries past the share were removed"
    good = arrive(30, fifo=False)
    time.sleep(submissions.SETTLE_S + 0.3)
    [job] = service.scan(hub, q, seen=seen)
    assert (job.submission, job.state) == (good, "queued")
    arrive(31, fifo=True)
    time.sleep(submissions.SETTLE_S + 0.3)
    assert service.scan(hub, q, seen=seen) == [] and q.total("root") == 4
    assert sorted(os.listdir(hub.inbound)) == sorted([*names[:3], good])
    assert q.dropped() == [("root", 8)], "the instructor is told how many were removed, and whose"
    assert "<li>root: 8</li>" in gradingpage.render(hub, q, "teach", True, "/g/")


@pytest.mark.skipif(os.geteuid() != 0, reason="a submission must belong to the account it names: root's here")
def test_a_stream_of_valid_resubmissions_stops_adding_rows_past_the_share_and_the_waiting_one_is_graded(
        tmp_path, monkeypatch):
    """A learner who submits a valid copy every few seconds: each replaced the waiting one and added a
    row, without end (a red-team pass: 80 rows in 4 minutes). Replacements before a grading count
    against the account's share; past it, a new submission while one waits is removed and counted,
    and once the waiting one is graded the next submission is queued as ever."""
    from multigpu.workshop import service, submissions

    hub = layout.Hub(tmp_path)
    for folder in (hub.course / "source" / "lab-00", hub.exchange / layout.COURSE_ID / "outbound" / "lab-00",
                   hub.inbound, hub.submissions):
        folder.mkdir(parents=True)
    monkeypatch.setattr(service, "JUNK_PER_ACCOUNT", 3)
    monkeypatch.setattr(submissions, "SETTLE_S", 0.1)
    q = jobs.Queue(tmp_path / "q.sqlite")
    seen: set[str] = set()

    def submit(i: int) -> list[jobs.Job]:
        name = f"root+lab-00+2026-11-28 23:00:{i:02d}.000000 UTC+resubmit{i:02d}"
        (hub.inbound / name).mkdir()
        (hub.inbound / name / "00-welcome.ipynb").write_text("{}")
        (hub.inbound / name / "timestamp.txt").write_text(f"2026-11-28 23:00:{i:02d}.000000 UTC")
        time.sleep(0.3)
        return service.scan(hub, q, seen=seen)

    for i in range(4):
        [job] = submit(i)
        assert job.state == "queued"
    assert q.refused_of("root") == 3 and q.total("root") == 4
    for i in range(4, 8):
        assert submit(i) == [], "past the share, a submission while one waits is not recorded"
    assert q.total("root") == 4 and q.dropped() == [("root", 4)]
    assert not any(n.endswith(("resubmit04", "resubmit07")) for n in os.listdir(hub.inbound))
    taken = q.take()
    assert taken is not None and taken.submission.endswith("resubmit03"), "the waiting submission stays queued"
    q.finish(taken.id, "done", "graded")
    [job] = submit(8)
    assert job.state == "queued" and q.total("root") == 5


@pytest.mark.skipif(os.geteuid() != 0, reason="a submission must belong to the account it names: root's here")
def test_a_submission_without_nbgraders_timestamp_is_refused_in_words_not_a_traceback(tmp_path, monkeypatch):
    """A folder made by hand with a submission's name but no timestamp.txt: nbgrader's autograde
    failed on it and the learner read its traceback (fifth red-team pass); now it is refused on
    arrival, saying what is missing and how to submit."""
    from multigpu.workshop import service, submissions

    hub = layout.Hub(tmp_path)
    for folder in (hub.course / "source" / "lab-00", hub.exchange / layout.COURSE_ID / "outbound" / "lab-00",
                   hub.inbound, hub.submissions):
        folder.mkdir(parents=True)
    monkeypatch.setattr(submissions, "SETTLE_S", 0.1)
    name = "root+lab-00+2026-11-28 23:10:00.000000 UTC+nostamp"
    (hub.inbound / name).mkdir()
    (hub.inbound / name / "00-welcome.ipynb").write_text("{}")
    time.sleep(0.3)
    [job] = service.scan(hub, jobs.Queue(tmp_path / "q.sqlite"), seen=set())
    assert job.state == "failed" and "no timestamp.txt" in job.message and "Submit" in job.message, job.message
    assert not submissions.copy_path(hub, name).exists()


def test_a_tree_too_deep_for_python_is_removed_and_stops_no_scan(tmp_path, monkeypatch):
    """A learner's entry past their share that is 3000 folders deep (Python's recursive rmtree stops
    at RecursionError, which aborted every scan): it is removed all the same, and the scan goes on."""
    from multigpu.workshop import safefiles, service

    hub = layout.Hub(tmp_path)
    hub.inbound.mkdir(parents=True)
    monkeypatch.setattr(service, "JUNK_PER_ACCOUNT", 1)
    (hub.inbound / "a-junk").mkdir()
    deep = hub.inbound / "z-deep"
    deep.mkdir()
    fd = os.open(deep, os.O_RDONLY)
    for _ in range(3000):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)
    q = jobs.Queue(tmp_path / "q.sqlite")
    try:
        assert service.scan(hub, q, seen=set()) == []
        assert sorted(os.listdir(hub.inbound)) == ["a-junk"], "the deep tree was not removed"
    finally:  # pytest's own clean-up of old temporary folders is recursive
        if deep.exists():
            with safefiles.opened(os.open(hub.inbound, os.O_RDONLY)) as inbound:
                safefiles.remove_entry(inbound, "z-deep")


def test_a_learners_flood_of_submission_like_folders_delays_nobody_elses(tmp_path):
    """Valid-looking folders that one learner keeps changing are never settled nor refused: each scan
    takes a few of each learner's new entries in turn, so another learner's submission is looked at
    in the first scan whatever the flood's size or place in the listing."""
    from multigpu.workshop import submissions

    class Entry:
        def __init__(self, name: str) -> None:
            self.name = name

    flood = [Entry(f"rtfa+lab-00+2026-11-28 05:00:00.{i:06d} UTC+junk{i}") for i in range(20_000)]
    mine = Entry("rtfb+lab-00+2026-11-28 05:00:01.000000 UTC+abc")
    picked = submissions.pick([*flood[:15_000], mine, *flood[15_000:]], seen=set())
    assert mine.name in picked[:2] and len(picked) == submissions.PER_LEARNER + 1
    assert submissions.pick([mine], seen={mine.name}) == []


def test_a_hub_under_a_folder_each_server_has_its_own_is_refused_with_where_to_put_it(monkeypatch, tmp_path):
    """Each learner's server sees its own empty /tmp, /var/tmp and /dev/shm: a hub or a checkout
    there would show its servers no course, no exchange and no package, so `multigpu workshop setup`
    (which `make hub` runs first) refuses it, saying why."""
    from multigpu.core import layout as course_layout

    for root in ("/tmp/multigpu-hub-x", "/var/tmp/hub", "/dev/shm/hub", "/tmp"):
        why = layout.Hub(Path(root)).hidden_from_servers()
        assert why is not None and "MULTIGPU_HUB_ROOT" in why and root.split("/")[1] in why
    for root in ("/srv/multigpu", "/tmpfoo/hub", "/srv/multigpu-scratch/multigpu-hub-x"):
        assert layout.Hub(Path(root)).hidden_from_servers() is None
    (tmp_path / course_layout.MARKER).write_text("")
    (tmp_path / course_layout.SOLUTIONS).mkdir()
    monkeypatch.setenv("MULTIGPU_COURSE_ROOT", str(tmp_path))
    why = layout.Hub(Path("/srv/multigpu")).hidden_from_servers()
    assert why is not None and f"the course's checkout {tmp_path}" in why and "clone the course elsewhere" in why


def test_looking_at_a_folder_that_keeps_changing_leaves_no_descriptor_open(tmp_path):
    """A learner's valid-looking folder whose inner file changes all the time: each scan finds it
    unsettled, and used to keep the inner folder's descriptor open (a red-team pass measured 100
    descriptors per 10 s from one learner: the service would stop at its limit for everyone)."""
    from multigpu.workshop import submissions

    inner = tmp_path / "sub" / "x"
    inner.mkdir(parents=True)
    (inner / "f").write_text("changing")
    time.sleep(submissions.SETTLE_S + 0.2)  # the folders settle; only the file changes from now on
    before = len(os.listdir("/proc/self/fd"))
    fd = os.open(tmp_path / "sub", os.O_RDONLY)
    try:
        for _ in range(50):
            (inner / "f").write_text("again")  # its inode changes now: the inner folder is not settled
            assert not submissions.settled(fd, time.time())
        assert submissions.settled(fd, time.time() + 60)
    finally:
        os.close(fd)
    assert len(os.listdir("/proc/self/fd")) == before, "a descriptor was left open"


def test_only_the_assignments_notebooks_and_their_feedback_come_back_from_a_grading(tmp_path):
    """A notebook that wrote 40 MB, another notebook and another page into its autograded and
    feedback folders while it ran: the instructor's course gets the assignment's notebook (defanged)
    and its feedback page, and beside them the submission's other files as the hub took them;
    a FIFO or an oversized file in place of the notebook fails the job with words."""
    import json

    from multigpu.workshop import autograde

    hub = layout.Hub(tmp_path / "hub")
    (hub.course / "source" / "lab-00").mkdir(parents=True)
    (hub.course / "source" / "lab-00" / "00-welcome.ipynb").write_text("{}")
    scratch = tmp_path / "scratch"
    graded, pages = scratch / "autograded" / "ana" / "lab-00", scratch / "feedback" / "ana" / "lab-00"
    for folder in (graded, pages):
        folder.mkdir(parents=True)
    notebook = {"cells": [{"cell_type": "markdown", "id": "a1", "metadata": {}, "source": "<script>x</script>"}],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (graded / "00-welcome.ipynb").write_text(json.dumps(notebook))
    (graded / "extra.ipynb").write_text(json.dumps(notebook))
    with open(graded / "written.bin", "wb") as f:
        f.write(os.urandom(1 << 20) * 40)
    (graded / "plot.png").write_bytes(b"written by the notebook")
    (pages / "00-welcome.html").write_text("<p>feedback</p>")
    (pages / "timestamp.txt").write_text("written by the notebook")
    (pages / "other.html").write_text("<p>not nbgrader's</p>")
    submitted = tmp_path / "taken"
    submitted.mkdir()
    (submitted / "00-welcome.ipynb").write_text("{}")
    (submitted / "plot.png").write_bytes(b"as submitted")
    (submitted / "timestamp.txt").write_text("2026-11-28 05:00:00.000000 UTC")
    (submitted / "submission_secret.txt").write_text("0f" * 32)
    job = jobs.Queue(tmp_path / "q.sqlite").add("ana+lab-00+t1+x", "ana", "lab-00", "t1")

    autograde.take_back(hub, job, scratch, submitted)
    back = hub.course / "autograded" / "ana" / "lab-00"
    assert sorted(os.listdir(back)) == ["00-welcome.ipynb", "plot.png", "submission_secret.txt", "timestamp.txt"]
    assert (back / "plot.png").read_bytes() == b"as submitted"
    assert "&lt;script&gt;" in (back / "00-welcome.ipynb").read_text()
    feedback = hub.course / "feedback" / "ana" / "lab-00"
    assert sorted(os.listdir(feedback)) == ["00-welcome.html", "submission_secret.txt", "timestamp.txt"]
    assert (feedback / "timestamp.txt").read_text() == "2026-11-28 05:00:00.000000 UTC", "the notebook's was taken"

    (submitted / "timestamp.txt").write_text("9" * 1000)
    with pytest.raises(autograde.JobFailed, match="feedback notebooks could not be taken back.*larger than 200"):
        autograde.take_back(hub, job, scratch, submitted)
    (submitted / "timestamp.txt").write_text("2026-11-28 05:00:00.000000 UTC")
    (graded / "00-welcome.ipynb").unlink()
    os.mkfifo(graded / "00-welcome.ipynb")
    with pytest.raises(autograde.JobFailed, match="autograded notebooks could not be taken back.*not a regular file"):
        autograde.take_back(hub, job, scratch, submitted)
    (graded / "00-welcome.ipynb").unlink()
    os.rename(graded / "written.bin", graded / "00-welcome.ipynb")
    with pytest.raises(autograde.JobFailed, match="larger than"):
        autograde.take_back(hub, job, scratch, submitted)
