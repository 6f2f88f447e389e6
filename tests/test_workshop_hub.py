"""A real workshop hub, end to end, as root on this machine (``make hub-deps`` first).

One hub for the module, in a temporary root with its own accounts (an instructor and two
learners, removed at the end): PAM logins, servers spawned as each learner's Unix user in their
own cgroup, nbgrader's exchange driven as each user (the instructor releases Lab 0, the learners
fetch and submit it, one twice), the grading service grading the queue with the hub restarted in
the middle of a grading, a score per lab in the instructor's gradebook, feedback that reaches only
its learner, and the kernel keeping each learner out of the other's home and submission.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import REPO
from multigpu.running import launch
from multigpu.workshop import jobs, layout, limits

PREFIX = Path(os.environ.get("MULTIGPU_HUB_PREFIX", "/opt/multigpu-hub"))
HUB_PY = PREFIX / "bin" / "python"
# A hub takes minutes on the 2-core machine (this module about 10, the browser test about 20):
# they run under `make test-hub` (MULTIGPU_TEST_HUB=1), not in every `make test`.
WHY_NOT = ("a hub test: run it with `make test-hub` (MULTIGPU_TEST_HUB=1)" if os.environ.get("MULTIGPU_TEST_HUB") != "1" else
           "needs root" if os.geteuid() != 0 else
           f"no hub environment at {PREFIX}: run `make hub-deps`" if not HUB_PY.exists() else
           "configurable-http-proxy is not installed: run `make hub-deps`" if not shutil.which("configurable-http-proxy")
           else None)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")]

START_S = 180  # hub up on a busy 2-core machine
GRADE_S = 900  # two lab gradings and a restart


@dataclass
class HubUnderTest:
    root: Path
    env: dict[str, str]
    base: str
    instructor: str
    learners: dict[str, str]  # login -> password
    proc: object = None
    log: Path = field(default_factory=Path)
    instructor_password: str = ""

    @property
    def hub(self) -> layout.Hub:
        return layout.Hub(self.root)

    def cli(self, *args: str) -> str:
        out = subprocess.run([str(HUB_PY), "-m", "multigpu.cli", "workshop", *args], env=self.env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"multigpu workshop {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}"
        return out.stdout

    def start(self) -> None:
        self.proc = launch.start(["sh", "-c", f'exec "$0" -m multigpu.cli workshop hub --instructor {self.instructor} '
                                  f'>>"{self.log}" 2>&1', str(HUB_PY)], env=self.env, capture=False)
        deadline = time.monotonic() + START_S
        import requests

        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the hub exited:\n{self.log.read_text()[-3000:]}"
            try:
                if requests.get(self.base + "/hub/api", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(1)
        raise AssertionError(f"the hub did not answer within {START_S} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def as_user(self, user: str, *argv: str, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
        """Run ``argv`` as ``user`` the way their server would: their uid and groups, their home,
        the hub's environment and, for learners, the learners' Jupyter config."""
        pw = pwd.getpwnam(user)
        env = {"HOME": pw.pw_dir, "USER": user, "PATH": f"{PREFIX / 'bin'}:/usr/bin:/bin", "MULTIGPU_QUICK": "1"}
        if user != self.instructor:
            env["JUPYTER_CONFIG_PATH"] = str(self.hub.learner_config)
        out = subprocess.run(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", "--", *argv],
                             cwd=cwd or pw.pw_dir, env=env, capture_output=True, text=True, timeout=300)
        if check:
            assert out.returncode == 0, f"{' '.join(argv)} as {user} failed:\n{out.stdout}\n{out.stderr}"
        return out

    def nbgrader(self, user: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
        return self.as_user(user, str(PREFIX / "bin" / "nbgrader"), *args, cwd=cwd)


def _sheet(text: str) -> dict[str, str]:
    return dict(re.findall(r"^(\S+)\s+([a-z2-9]{4}-[a-z2-9]{4}-[a-z2-9]{4})$", text, re.M))


@contextlib.contextmanager
def running_hub(tag: str, profile: str = "quick", **extra_env: str) -> Iterator[HubUnderTest]:
    """A hub in a temporary root with an instructor ``<tag>i`` and learners ``<tag>a``, ``<tag>b``;
    everything it made (accounts, servers, cgroups, folders) is removed at the end."""
    root = Path(tempfile.mkdtemp(prefix="multigpu-hub-test-", dir="/tmp"))
    os.chmod(root, 0o755)
    keys = Path(tempfile.mkdtemp(prefix="multigpu-hub-key-"))
    ports = [launch.free_port() for _ in range(4)]
    env = {"MULTIGPU_HUB_ROOT": str(root), "MULTIGPU_CERTIFICATE_KEY": str(keys / "course-key.pem"),
           "MULTIGPU_HUB_PORT": str(ports[0]), "MULTIGPU_HUB_INTERNAL_PORT": str(ports[1]),
           "MULTIGPU_PROXY_API_PORT": str(ports[2]), "MULTIGPU_GRADING_PORT": str(ports[3]),
           "MULTIGPU_HUB_INSTRUCTORS": f"{tag}i", "MULTIGPU_QUICK": "1", "MULTIGPU_GRADING_PROFILE": profile,
           "PATH": f"{PREFIX / 'bin'}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", **extra_env}
    h = HubUnderTest(root, env, f"http://127.0.0.1:{ports[0]}", f"{tag}i", {}, log=root / "hub.log")
    try:
        h.instructor_password = _sheet(h.cli("setup", "--instructor", h.instructor))[h.instructor]
        names = root / "room.csv"
        names.write_text(f"login\n{tag}a\n{tag}b\n")
        h.learners = _sheet(h.cli("add-learners", "--csv", str(names)))
        assert sorted(h.learners) == [f"{tag}a", f"{tag}b"], "the sheet lists every new login with its password"
        h.start()
        yield h
    finally:
        h.stop()
        subprocess.run([str(HUB_PY), "-m", "multigpu.cli", "workshop", "stop"], env=env, capture_output=True, timeout=120)
        subprocess.run([str(HUB_PY), "-m", "multigpu.cli", "workshop", "remove-learners", f"{tag}a", f"{tag}b"],
                       env=env, capture_output=True, timeout=120)
        if h.instructor in open("/etc/passwd").read():
            subprocess.run(["pkill", "-KILL", "-u", h.instructor], capture_output=True)
            subprocess.run(["userdel", "--remove", h.instructor], capture_output=True)
        for name in (f"{tag}a", f"{tag}b", h.instructor):
            limits.release(f"user-{name}")
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(keys, ignore_errors=True)


@pytest.fixture(scope="module")
def hub():
    with running_hub(f"mgt{os.getpid() % 100000}") as h:
        yield h


def _a_b(hub: HubUnderTest) -> tuple[str, str]:
    a, b = sorted(hub.learners)
    return a, b


def test_learners_cannot_read_each_others_home_or_the_course(hub):
    a, b = _a_b(hub)
    home_a = Path(pwd.getpwnam(a).pw_dir)
    hub.as_user(a, "sh", "-c", "echo my work > notes.txt")
    assert oct(home_a.stat().st_mode & 0o777) == "0o700"
    for argv in (["ls", str(home_a)], ["cat", str(home_a / "notes.txt")], ["ls", str(hub.hub.course)],
                 ["cat", str(hub.hub.course / "source" / "lab-00" / "00-welcome.ipynb")],
                 ["ls", str(hub.hub.state)], ["cat", str(hub.hub.queue_db)]):
        out = hub.as_user(b, *argv, check=False)
        assert out.returncode != 0 and "Permission denied" in out.stderr, f"{b} could run {argv}: {out.stdout}"


def test_release_fetch_submit_and_a_score_per_lab_through_a_hub_restart(hub):
    """The instructor releases Lab 0 (the formgrader's Generate and Release buttons run these
    nbgrader apps as the instructor); learner A submits a filled-in Lab 0, learner B a blank one,
    twice (the second replaces the first). The hub is restarted while A's grading runs: it runs
    again and nothing is lost."""
    a, b = _a_b(hub)
    course = hub.hub.course
    hub.nbgrader(hub.instructor, "generate_assignment", "lab-00", "--force", cwd=course)
    hub.nbgrader(hub.instructor, "release_assignment", "lab-00", cwd=course)
    for learner in (a, b):
        hub.nbgrader(learner, "fetch_assignment", "lab-00")
    # A fills in the exercise: the solution's cells in A's own copy
    mine = Path(pwd.getpwnam(a).pw_dir) / "lab-00" / "00-welcome.ipynb"
    shutil.copyfile(REPO / "solutions" / "notebooks" / "00-welcome.ipynb", mine)
    os.chown(mine, pwd.getpwnam(a).pw_uid, pwd.getpwnam(a).pw_gid)
    hub.nbgrader(a, "submit", "lab-00")
    hub.nbgrader(b, "submit", "lab-00")
    time.sleep(1.1)  # nbgrader's timestamps tell the two submissions apart
    hub.nbgrader(b, "submit", "lab-00")
    out = hub.as_user(b, "ls", str(hub.hub.inbound), check=False)
    assert out.returncode != 0, "a learner must not list the exchange's inbound folder (other submissions)"

    queue = jobs.Queue(hub.hub.queue_db)
    deadline = time.monotonic() + GRADE_S
    restarted = False
    while time.monotonic() < deadline:
        mine_jobs = {(j.student, j.state) for j in queue.jobs()}
        running = [j for j in queue.jobs() if j.state == "running"]
        if not restarted and running and running[0].student == a and time.time() - running[0].started > 5:
            hub.stop()  # the hub stops its service, which stops the grading under way
            assert queue.get(running[0].id).state == "running"
            hub.start()
            restarted = True
        if restarted and len([j for j in queue.jobs() if j.state in ("done", "failed")]) >= 2:
            break
        time.sleep(2)
    else:
        pytest.fail(f"the queue did not finish within {GRADE_S} s: {mine_jobs}\n{hub.log.read_text()[-3000:]}")
    assert restarted, "A's grading was never seen running"
    by = {(j.student, j.state): j for j in queue.jobs()}
    assert (a, "done") in by, f"A's job: {[vars(j) for j in queue.jobs(a)]}"
    assert by[(a, "done")].attempts == 2, "the grading cut off by the restart ran again"
    assert (b, "replaced") in by and (b, "done") in by, "B's second submission replaced the first"
    assert by[(a, "done")].result["autograde"]["score"] == by[(a, "done")].result["autograde"]["max_score"] > 0
    assert by[(b, "done")].result["autograde"]["score"] == 0

    from nbgrader.api import Gradebook

    with Gradebook(hub.hub.db_url) as gb:
        sa, sb = gb.find_submission("lab-00", a), gb.find_submission("lab-00", b)
        assert (sa.score, sb.score) == (sa.max_score, 0) and sa.max_score > 0
        assert gb.find_assignment("lab-00").name == "lab-00", "the gradebook has the lab as its own assignment"

    # feedback reaches each learner, and only theirs
    for learner in (a, b):
        hub.nbgrader(learner, "fetch_feedback", "lab-00")
    files = {ln: sorted(Path(pwd.getpwnam(ln).pw_dir).glob("lab-00/feedback/*/*.html")) for ln in (a, b)}
    assert files[a] and files[b], files
    assert "score" in files[a][0].read_text().lower()
    out = hub.as_user(b, "cat", str(files[a][0]), check=False)
    assert out.returncode != 0, "B must not read A's feedback"


def test_login_spawns_a_confined_server_and_the_grading_page_shows_only_ones_own(hub):
    import requests

    a, b = _a_b(hub)
    s = requests.Session()
    s.get(hub.base + "/hub/login")
    bad = s.post(hub.base + "/hub/login", data={"username": a, "password": "wrong", "_xsrf": s.cookies.get("_xsrf")})
    assert "Invalid username or password" in bad.text
    s.post(hub.base + "/hub/login", data={"username": a, "password": hub.learners[a], "_xsrf": s.cookies.get("_xsrf")})
    s.get(hub.base + "/hub/spawn")
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        r = s.get(hub.base + f"/hub/api/users/{a}", headers={"X-XSRFToken": s.cookies.get("_xsrf", "")})
        if r.status_code == 200 and r.json().get("server"):
            break
        time.sleep(2)
    else:
        pytest.fail(f"{a}'s server did not start:\n{hub.log.read_text()[-3000:]}")
    import psutil

    servers = [p for p in psutil.process_iter(["username", "cmdline"]) if p.info["username"] == a
               and any("jupyterhub-singleuser" in x for x in p.info["cmdline"] or [])]
    assert servers, f"no server process runs as {a}"
    learner_cores, grading_cores = limits.split_cores()
    assert set(servers[0].cpu_affinity()) == set(learner_cores), "a learner server runs off the grading cores"
    if limits.version():
        cgroups = Path(f"/proc/{servers[0].pid}/cgroup").read_text()
        assert f"multigpu/user-{a}" in cgroups, cgroups

    page = s.get(hub.base + "/services/grading/")
    assert page.status_code == 200 and f"Signed in as <b>{a}</b>" in page.text
    assert "lab-00" in page.text and b not in page.text, "a learner sees their own submissions only"
    status = s.get(hub.base + "/services/grading/status").json()
    assert {j["student"] for j in status} == {a}
    others = [j for j in jobs.Queue(hub.hub.queue_db).jobs(b) if j.state == "done"]
    r = s.get(hub.base + f"/services/grading/files/{others[0].id}/feedback/00-welcome.html")
    assert r.status_code == 404, "a learner cannot open another learner's feedback"
    own = [j for j in status if j["state"] == "done"][0]
    r = s.get(hub.base + f"/services/grading/files/{own['id']}/feedback/00-welcome.html")
    assert r.status_code == 200 and "00-welcome" in r.text
    json.dumps(status)
