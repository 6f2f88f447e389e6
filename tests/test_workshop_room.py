"""What an operator expects of a hub left running for a day, in a real hub (``make test-hub``):
a login storm beyond the spawn limit waits its turn and none fails; a learner who fills their
memory limit loses only their own kernel; the idle culler stops idle servers and never one whose
kernel runs a job, and never cuts off a grading; and the room load test itself
(``make hub-load``) at the size of a test: every submission graded exactly once through a hub
restart. The hub here culls after 20 s (a day's default is an hour), starts one server at a
time and gives each learner 1.5 GB."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import threading
import time

import pytest
import requests

from multigpu.workshop import jobs, scratch
from multigpu.workshop.learnerclient import Learner
from test_workshop_hub import HUB_PY, WHY_NOT

pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")]

CULL_TIMEOUT_S = 20
BUSY_CELL_S = 75


class OpenTab(threading.Thread):
    """What an open JupyterLab tab does to its server: a request every few seconds (JupyterLab
    polls its kernels and files), activity the culler sees. ``keep`` holds the learners whose tab
    is open."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.keep: dict[str, Learner] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(3):
            for learner in list(self.keep.values()):
                try:
                    learner.api("GET", "api/kernels", timeout=30)
                except Exception:  # a tab whose server is gone or starting again polls on
                    pass


@pytest.fixture(scope="module")
def room():
    tag = f"mgr{os.getpid() % 100000}"
    settings = {"MULTIGPU_CULL_TIMEOUT": str(CULL_TIMEOUT_S), "MULTIGPU_CULL_EVERY": "5", "MULTIGPU_ACTIVITY_INTERVAL": "2",
                "MULTIGPU_BUSY_INTERVAL": "2", "MULTIGPU_SPAWN_LIMIT": "1", "MULTIGPU_LEARNER_MEM_GB": "1.5"}
    tabs = OpenTab()
    tabs.start()
    with scratch.scratch_hub(tag, [f"{tag}a", f"{tag}b", f"{tag}c"], python=str(HUB_PY), **settings) as hub:
        hub.release("lab-00")
        yield hub, {n: Learner(hub.base, n, pw) for n, pw in sorted(hub.learners.items())}, tabs
    tabs.stop.set()


def server_of(hub: scratch.ScratchHub, name: str) -> int | None:
    """The id of ``name``'s running server in the hub's own database (None: not running)."""
    db = sqlite3.connect(hub.hub.state / "jupyterhub.sqlite", timeout=30)
    try:
        row = db.execute("SELECT spawners.server_id FROM spawners JOIN users ON users.id = spawners.user_id "
                         "WHERE users.name = ? AND spawners.name = ''", (name,)).fetchone()
    finally:
        db.close()
    return row[0] if row else None


def test_a_login_storm_beyond_the_spawn_limit_waits_and_none_fails(room):
    hub, learners, tabs = room
    waited, errors = {}, {}

    def arrive(learner: Learner) -> None:
        try:
            learner.login()
            waited[learner.name] = [m for m in learner.wait_ready() if m.startswith("Waiting to start")]
            tabs.keep[learner.name] = learner
        except Exception as e:
            errors[learner.name] = repr(e)

    threads = [threading.Thread(target=arrive, args=(lr,)) for lr in learners.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    assert not errors, errors
    assert sorted(waited) == sorted(learners), "every learner's JupyterLab opened"
    assert sum(bool(w) for w in waited.values()) >= 1, f"nobody was told to wait with a limit of 1: {waited}"
    assert "a busy kernel counts as activity" in hub.log.read_text()


def test_a_learner_filling_their_memory_limit_loses_only_their_own_kernel(room):
    hub, learners, _tabs = room
    a, b, _c = learners.values()
    mine, theirs = a.start_kernel(), b.start_kernel()
    assert b.execute(theirs, "x = 41").status == "ok"
    out = a.execute(mine, "hog = b'x' * (3 * 2**30)", timeout=300)
    assert out.status in ("died", "error"), f"3 GB fitted in a 1.5 GB limit: {out}"
    assert out.status == "died" or "MemoryError" in out.error, out
    assert requests.get(hub.base + "/hub/api", timeout=30).status_code == 200, "the hub still answers"
    assert b.execute(theirs, "print(x + 1)").output.strip() == "42", "the other learner's kernel kept its state"
    page = b.session.get(hub.base + "/services/grading/", timeout=60)
    assert page.status_code == 200 and "Signed in as" in page.text, "the grading service still answers"


def test_the_culler_stops_idle_servers_never_a_busy_kernel_nor_a_grading(room):
    """A runs a cell that prints nothing for longer than the culler's timeout; B and C leave
    their servers idle after submitting Lab 0. B's and C's servers are culled, A's is not; C's
    grading, queued or running when C's server went, is graded once all the same."""
    hub, learners, tabs = room
    a, b, c = learners.values()
    tabs.keep.clear()  # every tab closed: A's server has only its busy kernel to keep it
    for learner in (b, c):
        learner.assignment("fetch", "lab-00")
        learner.assignment("submit", "lab-00")
    kernel, result = a.start_kernel(), {}
    busy = threading.Thread(target=lambda: result.update(cell=a.execute(kernel, f"import time; time.sleep({BUSY_CELL_S})")))
    busy.start()
    queue, culled = jobs.Queue(hub.hub.queue_db), {}
    while busy.is_alive():
        for learner in (b, c):
            if learner.name not in culled and server_of(hub, learner.name) is None:
                culled[learner.name] = [j.state for j in queue.jobs(learner.name)]
        assert server_of(hub, a.name) is not None, f"A's server was culled while its kernel ran:\n{hub.tail()}"
        time.sleep(1)
    assert result["cell"].status == "ok", result
    assert sorted(culled) == sorted([b.name, c.name]), f"idle servers left running: {culled}\n{hub.tail()}"
    assert culled[c.name][0] in ("queued", "running"), f"C's server went before its grading ended: {culled}"
    deadline = time.monotonic() + 900
    while [j.state for j in queue.jobs(c.name)][0] not in ("done", "failed") and time.monotonic() < deadline:
        time.sleep(2)
    (job,) = queue.jobs(c.name)
    assert (job.state, job.attempts) == ("done", 1), f"C's grading: {job.state} after {job.attempts} start(s): {job.message}"
    assert "Culling server" in hub.log.read_text()


@pytest.mark.timeout(3600)  # four Lab 0 gradings one at a time and a hub restart: 25 min at a load of 15-20
def test_the_room_load_test_grades_every_submission_once_through_a_hub_restart(tmp_path):
    """``make hub-load`` at the size of a test: two learners, one server starting at a time, the
    hub restarted while it grades; the report says what docs/workshop.md quotes."""
    report = tmp_path / "load"
    env = dict(os.environ, MULTIGPU_SPAWN_LIMIT="1", PATH=f"{HUB_PY.parent}:/usr/local/bin:/usr/bin:/bin")
    out = subprocess.run([str(HUB_PY), "-m", "multigpu.cli", "workshop", "load", "--learners", "2", "--within", "2",
                          "--restart-hub", "--report", str(report)], env=env, capture_output=True, text=True, timeout=3600)
    assert out.returncode == 0, f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    said = [line for line in out.stderr.splitlines() if line.startswith("[room load ")]
    assert any("one learner alone first" in line for line in said) and any("wave 2" in line for line in said), said
    r = json.loads(report.with_suffix(".json").read_text())
    assert r["complete"] and r["graded_once"]["ok"] and r["failed_spawns"] == 0, (r["graded_once"], r["errors"])
    assert r["events"]["restart"]["proxy_kept"], "the hub restart left the proxy (and the learners' connections) alone"
    assert r["graded_once"]["restarted_job"] is not None and r["graded_once"]["starts"] == 5, r["graded_once"]
    assert r["login_to_ready_s"]["n"] == 2 and r["cell_s"]["n"] == 2 and r["idle_mb"]["median"] > 50
    assert "| login to JupyterLab ready" in report.with_suffix(".md").read_text()
