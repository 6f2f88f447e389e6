"""Issue 37: a learner with a terminal on the workshop hub (arbitrary code as their own uid) against
the hub, one test per hole, each performing the attack the way a learner would: as their Unix
account, with real files at the real places the hub uses, on a real hub (``test_workshop_hub``'s
``running_hub``: a temporary root, its accounts removed at the end). Where a hub adds nothing the
test drives the exact code path with real accounts, files and permissions instead.

Root, ``make hub-deps`` and ``MULTIGPU_TEST_HUB=1`` (``make test-hub``); about 15 minutes on the
2-core machine, most of it six Lab 0 gradings. docs/workshop.md's trust model lists each hole with
its test.
"""

from __future__ import annotations

import datetime
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import nbformat
import psutil
import pytest

from conftest import REPO
from multigpu.workshop import inbound, jobs, layout
from multigpu.workshop.scratch import ScratchHub
from test_workshop_hub import HUB_PY, WHY_NOT, running_hub

pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")]

GRADE_S = 900  # a Lab 0 grading on the busy 2-core machine, with one or two ahead of it
#: the hub's limits, small enough to reach on purpose (the learner servers' and the grading's)
LEARNER_PIDS, GRADING_PIDS, GRADING_MEM_GB = 160, 320, 3
#: the quotas of a learner's home and of the exchange, MB (small enough to fill in seconds)
LEARNER_DISK_MB, EXCHANGE_DISK_MB, GRADING_DISK_MB = 160, 160, 160
SOLUTION_MARK = "### BEGIN SOLUTION"


# ------------------------------------------------------------------------------------ helpers
def stamp() -> str:
    """nbgrader's submission timestamp (its default format)."""
    return f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S.%f %Z}"


def submission_name(student: str, assignment: str) -> str:
    return f"{student}+{assignment}+{stamp()}+{uuid.uuid4().hex[:12]}"


def learner_python(hub: ScratchHub, user: str, code: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return hub.as_user(user, str(HUB_PY), "-c", code, *args, check=check)


def wait_for(what: str, ready: Callable[[], object], timeout: float, hub: ScratchHub) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = ready()
        if got:
            return got
        time.sleep(2)
    queue = jobs.Queue(hub.hub.queue_db)
    pytest.fail(f"{what} within {timeout:.0f} s; queue: {[(j.id, j.student, j.assignment, j.state) for j in queue.jobs()]}"
                f"\n{hub.log.read_text()[-3000:]}")


def job_of(hub: ScratchHub, name: str) -> jobs.Job | None:
    return next((j for j in jobs.Queue(hub.hub.queue_db).jobs() if j.submission == name), None)


def finished(hub: ScratchHub, name: str, timeout: float = GRADE_S) -> jobs.Job:
    """The job of the submission ``name`` once it is done or failed."""
    return wait_for(f"{name} was not graded", lambda: (j := job_of(hub, name)) and j.state in ("done", "failed") and j,
                    timeout, hub)  # type: ignore[return-value]


def idle(hub: ScratchHub, timeout: float = GRADE_S) -> None:
    queue = jobs.Queue(hub.hub.queue_db)
    wait_for("the queue did not empty", lambda: not any(j.state in ("queued", "held", "running") for j in queue.jobs()),
             timeout, hub)


def submit(hub: ScratchHub, user: str) -> str:
    """``nbgrader submit lab-00`` as ``user``; the name of the folder it made in the inbound exchange."""
    before = set(os.listdir(hub.hub.inbound))
    time.sleep(1.1)  # nbgrader's timestamps tell two submissions apart
    hub.nbgrader(user, "submit", "lab-00")
    (name,) = [n for n in set(os.listdir(hub.hub.inbound)) - before if n.startswith(f"{user}+")]
    return name


def home(user: str) -> Path:
    return Path(pwd.getpwnam(user).pw_dir)


def write_as(user: str, path: Path, data: bytes) -> None:
    path.write_bytes(data)
    pw = pwd.getpwnam(user)
    os.chown(path, pw.pw_uid, pw.pw_gid)


def lab0(user: str) -> Path:
    return home(user) / "lab-00" / "00-welcome.ipynb"


def grader_processes() -> list[psutil.Process]:
    try:
        uid = pwd.getpwnam(layout.GRADER_USER).pw_uid
    except KeyError:
        return []
    return [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and uid in (p.info["uids"].real, p.info["uids"].effective)]


def files_holding(root: Path, needle: bytes, skip: set[Path]) -> list[str]:
    """Every regular file under ``root`` (links not followed) whose bytes hold ``needle``."""
    found = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            try:
                st = path.lstat()
                if path in skip or not stat.S_ISREG(st.st_mode) or st.st_size > 64 * 2**20:
                    continue
                if needle in path.read_bytes():
                    found.append(str(path))
            except OSError:
                continue
    return found


# ------------------------------------------------------------------------------------ the hub
@pytest.fixture(scope="module")
def hub():
    tag = f"mga{os.getpid() % 100000}"
    with running_hub(tag, MULTIGPU_LEARNER_PIDS=str(LEARNER_PIDS), MULTIGPU_GRADING_PIDS=str(GRADING_PIDS),
                     MULTIGPU_GRADING_MEM_GB=str(GRADING_MEM_GB), MULTIGPU_LEARNER_DISK_MB=str(LEARNER_DISK_MB),
                     MULTIGPU_EXCHANGE_DISK_MB=str(EXCHANGE_DISK_MB),
                     MULTIGPU_GRADING_DISK_MB=str(GRADING_DISK_MB)) as h:
        course = h.hub.course
        h.nbgrader(h.instructor, "generate_assignment", "lab-00", "--force", cwd=course)
        h.nbgrader(h.instructor, "release_assignment", "lab-00", cwd=course)
        for learner in h.learners:
            h.nbgrader(learner, "fetch_assignment", "lab-00")
            shutil.copyfile(lab0(learner), home(learner) / "blank-00-welcome.ipynb")
        yield h


def learners(hub: ScratchHub) -> tuple[str, str]:
    a, b = sorted(hub.learners)
    return a, b


def reset_lab0(user: str, cells: list[str] = (), solved: bool = False, markdown: list[str] = ()) -> None:
    """The learner's Lab 0 notebook: the blank release (or the solution's answers) plus ``cells``
    (code) and ``markdown`` cells."""
    nb = nbformat.read(REPO / "solutions" / "notebooks" / "00-welcome.ipynb" if solved
                       else home(user) / "blank-00-welcome.ipynb", as_version=4)
    nb.cells += [nbformat.v4.new_markdown_cell(m) for m in markdown] + [nbformat.v4.new_code_cell(c) for c in cells]
    write_as(user, lab0(user), nbformat.writes(nb).encode())


# 2 ---------------------------------------------------------------------------------------------
def test_2_a_learner_cannot_swap_the_course_exchange_for_their_own(hub):
    """Move the course's exchange folder (or a part of it) aside and put one's own in its place,
    then read later submissions, publish fake assignments, delete releases. What the learner
    managed is undone before the test fails (the tests after it need the exchange)."""
    a, _ = learners(hub)
    course_ex = hub.hub.exchange / layout.COURSE_ID
    done = []
    for folder in (course_ex, course_ex / "outbound", course_ex / "inbound", course_ex / "feedback"):
        aside = folder.with_name(folder.name + "-aside")
        if hub.as_user(a, "mv", str(folder), str(aside), check=False).returncode == 0:
            done.append(f"moved {folder.name} aside")
            os.rename(aside, folder)
    if hub.as_user(a, "mkdir", str(course_ex / "outbound" / "lab-99"), check=False).returncode == 0:
        done.append("published an assignment")
        os.rmdir(course_ex / "outbound" / "lab-99")
    assert not done, f"a learner {', '.join(done)}"
    owner = pwd.getpwnam(hub.instructor).pw_uid
    assert course_ex.stat().st_uid == owner and (course_ex / "outbound" / "lab-00").stat().st_uid == owner
    assert stat.S_IMODE(hub.hub.exchange.stat().st_mode) == 0o1777


# 1 ---------------------------------------------------------------------------------------------
def test_1_a_submission_of_links_to_the_signing_key_is_refused_and_nothing_leaks(hub):
    """A Lab 0 folder made by hand in the inbound exchange whose k.html is a link to the course's
    signing key (and another to the hub's cookie secret): graded, it would carry the key through
    submitted/, autograded/, feedback/ and the exchange's world-readable feedback."""
    a, _ = learners(hub)
    key = Path(hub.env["MULTIGPU_CERTIFICATE_KEY"])
    secret = hub.hub.state / "jupyterhub_cookie_secret"
    name = submission_name(a, "lab-00")
    folder = hub.hub.inbound / name
    learner_python(hub, a, "import os, shutil, sys; d = sys.argv[1]; os.mkdir(d); "
                   "shutil.copyfile(os.path.expanduser('~/blank-00-welcome.ipynb'), d + '/00-welcome.ipynb'); "
                   "os.symlink(sys.argv[2], d + '/k.html'); os.symlink(sys.argv[3], d + '/s.html'); "
                   "open(d + '/timestamp.txt', 'w').write(sys.argv[4]); "
                   "open(d + '/submission_secret.txt', 'w').write('0' * 128)",
                   str(folder), str(key), str(secret), name.split("+")[2])
    job = finished(hub, name)
    idle(hub)
    key_bytes = key.read_bytes().strip().splitlines()[1]  # a line of the key's base64 body
    leaks = files_holding(hub.root, key_bytes, skip=set()) + files_holding(hub.root, secret.read_bytes().strip()[:32],
                                                                          skip={secret})
    assert not leaks, f"the key or the cookie secret was copied into {leaks}"
    assert job.state == "failed" and "symbolic link" in job.message, f"{job.state}: {job.message}"


# 6 ---------------------------------------------------------------------------------------------
def test_6_a_folder_with_a_name_that_is_not_utf8_does_not_stop_the_queue(hub):
    """A folder whose name is not UTF-8 made every scan raise, so nothing after it was queued."""
    _, b = learners(hub)
    bad = os.fsdecode(os.fsencode(hub.hub.inbound) + b"/!\xff\xfe+lab-00+" + stamp().encode() + b"+x")
    learner_python(hub, b, "import os, sys; os.mkdir(sys.argv[1])", bad)  # the bytes as they are (surrogateescape)
    assert b"!\xff\xfe+lab-00" in b"".join(os.listdir(os.fsencode(hub.hub.inbound)))
    try:
        reset_lab0(b)
        name = submit(hub, b)
        wait_for("a good submission after a bad name was not queued", lambda: job_of(hub, name), 120, hub)
        assert "scanning the exchange failed" not in hub.log.read_text()[-20000:]
    finally:
        os.rmdir(os.fsencode(bad))  # the later tests need a working queue, whatever this one found


# 7 ---------------------------------------------------------------------------------------------
def test_7_bad_assignment_names_and_a_flood_neither_delete_work_nor_queue_jobs(hub):
    """``..`` as the assignment made the job's destination the whole ``course/submitted`` folder,
    which was then deleted; folders for 30 made-up assignments queued 30 jobs. (That learners take
    turns in the queue, whatever one of them submits: ``tests/test_workshop.py``.)"""
    a, b = learners(hub)
    idle(hub)
    submitted_b = hub.hub.course / "submitted" / b / "lab-00" / "00-welcome.ipynb"
    if not submitted_b.is_file():  # B's graded Lab 0: the work a '..' would delete
        reset_lab0(b)
        finished(hub, submit(hub, b))
    queue = jobs.Queue(hub.hub.queue_db)
    flood = [submission_name(a, f"lab-9{i:02d}") for i in range(30)]
    dotdot = submission_name(a, "..")
    for names in (flood, [dotdot]):  # the '..' after the flood: A has folders in the course by then
        learner_python(hub, a, "import os, shutil, sys\nfor d in sys.argv[2:]:\n    d = sys.argv[1] + '/' + d; os.mkdir(d)\n"
                       "    shutil.copyfile(os.path.expanduser('~/blank-00-welcome.ipynb'), d + '/00-welcome.ipynb')",
                       str(hub.hub.inbound), *names)
        wait_for("the service did not look at the made-up submissions", lambda: all(queue.known(n) for n in names),
                 120, hub)
        idle(hub)
    names = [*flood, dotdot]
    assert submitted_b.is_file(), "a submission named '..' deleted the course's submitted work"
    made_up = [j for j in queue.jobs(a) if j.submission in names]
    assert not made_up, f"{len(made_up)} jobs for made-up assignments: {[(j.assignment, j.state) for j in made_up[:3]]}"


# 12 --------------------------------------------------------------------------------------------
def test_12_no_one_else_reads_or_replaces_a_submission_and_the_copy_taken_at_submission_is_graded(hub):
    """nbgrader leaves a submission's folder mode 777: learner B, who learned the folder's name,
    read and replaced learner A's work before it was graded. And what is graded must be what was
    submitted, whatever happens to the folder afterwards."""
    a, b = learners(hub)
    idle(hub)
    reset_lab0(b, solved=True)
    blocker = submit(hub, b)  # keeps the grading busy while A's submission waits
    wait_for("B's submission did not start", lambda: (j := job_of(hub, blocker)) and j.state == "running", GRADE_S, hub)
    reset_lab0(a)
    mine = submit(hub, a)
    folder = hub.hub.inbound / mine
    assert hub.as_user(b, "cat", str(folder / "00-welcome.ipynb"), check=False).returncode != 0, "B read A's submission"
    out = hub.as_user(b, "sh", "-c", f'rm -f "{folder}/00-welcome.ipynb"; cp ~/blank-00-welcome.ipynb "{folder}/00-welcome.ipynb"',
                      check=False)
    assert out.returncode != 0 and (folder / "00-welcome.ipynb").stat().st_uid == pwd.getpwnam(a).pw_uid, \
        "B replaced A's submitted notebook"
    job = wait_for("A's submission was not queued", lambda: job_of(hub, mine), 120, hub)
    assert job.state == "queued", f"A's job is {job.state}: the test needs it waiting"
    swapped = time.time()
    reset_lab0(a, solved=True)  # A's own folder, changed after submitting: the solution's answers
    hub.as_user(a, "cp", str(lab0(a)), str(folder / "00-welcome.ipynb"))
    done = finished(hub, mine)
    assert done.started and done.started > swapped, "A's grading started before the folder changed: inconclusive"
    assert done.state == "done" and done.result["autograde"]["score"] == 0, \
        f"graded what the folder held later, not what was submitted: {done.message}"


# 3, 4, 5, 8, 9, 10 -----------------------------------------------------------------------------
HOSTILE_CELL = r'''
import json, os, subprocess, sys, time
report = {"uid": os.getuid(), "cwd": os.getcwd(), "leaks": []}
# 9: a solution notebook within reach: anywhere in this grading's scratch folder, or the checkout
mark = "### BEGIN " + "SOLUTION"
top = os.getcwd()
while os.path.dirname(top) != top and not os.path.basename(top).startswith("job-"):
    top = os.path.dirname(top)
candidates = [CHECKOUT_SOLUTION]
for dirpath, dirs, files in os.walk(top):
    candidates += [os.path.join(dirpath, f) for f in files if f.endswith(".ipynb")]
for path in candidates:
    try:
        if mark in open(path).read():
            report["leaks"].append(path)
    except OSError:
        pass
# 10: as many processes as it can, then as much memory
kids, error = [], None
for _ in range(FORKS):
    try:
        pid = os.fork()
    except OSError as e:
        error = e.strerror
        break
    if pid == 0:
        time.sleep(120)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
report["forks"], report["fork_error"] = len(kids), error
hog = "b = bytearray(HOG); b[::4096] = bytes(len(range(0, HOG, 4096))); print('allocated')".replace("HOG", str(HOG))
report["hog"] = subprocess.run([sys.executable, "-c", hog], capture_output=True, text=True).returncode
# 3 and 8: a daemon in a session of its own that outlives the cell and edits the scratch gradebook
up = os.getcwd()
while os.path.dirname(up) != up and not os.path.exists(os.path.join(up, "gradebook.db")):
    up = os.path.dirname(up)
report["gradebook"] = gradebook = os.path.join(up, "gradebook.db")
daemon = """
import sqlite3, sys, time
end = time.time() + 1200
while time.time() < end:
    try:
        con = sqlite3.connect(sys.argv[2], timeout=0.2)
        con.execute("UPDATE grade SET auto_score = 1000")
        con.commit()
        con.close()
    except Exception:
        pass
    time.sleep(0.05)
"""
subprocess.Popen([sys.executable, "-c", daemon, MARKER, gradebook], start_new_session=True, stdin=subprocess.DEVNULL,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print("HOSTILE " + json.dumps(report))
# 5: script for whoever renders this notebook's outputs (the instructor's formgrader)
from IPython.display import HTML, Javascript, display
display(HTML("<scr" + "ipt>window.MGA_" + TAG + "_html = 1</script>"))
display(Javascript("window.MGA_" + TAG + "_js = 1"))
'''

SPINNER = r'''
import json, os, sys, time
scratch, first, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3]
opened, held = set(), []
while not os.path.exists(stop):
    for k in range(first, first + 3):
        try:
            top = os.open(f"{scratch}/job-{k}", os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        opened.add(f"job-{k}")
        for sub in ("source", "gen", "course", "submitted"):  # descriptors kept after the folder is closed
            try:
                held.append((f"job-{k}/{sub}", os.open(sub, os.O_RDONLY | os.O_DIRECTORY, dir_fd=top)))
                opened.add(f"job-{k}/{sub}")
            except OSError:
                pass
        os.close(top)
read_later = []
for name, fd in held:  # the folders are closed now: what can the descriptors still reach?
    for dirpath, _dirs, files, dfd in os.fwalk(".", dir_fd=fd):
        for f in files:
            try:
                read_later.append(f"{name}/{dirpath}/{f}: {len(os.read(os.open(f, os.O_RDONLY, dir_fd=dfd), 1 << 20))} bytes")
            except OSError:
                pass
print(json.dumps({"opened": sorted(opened), "read_later": read_later}))
'''


@pytest.fixture(scope="module")
def hostile(hub):
    """Learner A submits Lab 0 with one added cell that tries holes 3, 8, 9 and 10 from inside the
    autograde, and a k.html of their own; learner A's terminal meanwhile tries to open the next
    gradings' scratch folders (hole 4). Yields what was observed."""
    a, _ = learners(hub)
    idle(hub)
    marker = f"hostile-daemon-{uuid.uuid4().hex}"
    tag = uuid.uuid4().hex[:8]
    cell = (HOSTILE_CELL.replace("CHECKOUT_SOLUTION", repr(str(REPO / "solutions" / "notebooks" / "00-welcome.ipynb")))
            .replace("FORKS", str(GRADING_PIDS + 100)).replace("HOG", str((GRADING_MEM_GB + 1) * 2**30))
            .replace("MARKER", repr(marker)).replace("TAG", repr(tag)))
    reset_lab0(a, [cell], markdown=[f"My answer. <script>window.MGA_{tag}_md = 1</script>"])
    write_as(a, home(a) / "lab-00" / "k.html", b"<script>document.title = 'stolen ' + document.cookie</script>")
    # a large file of the learner's own: root copies it while the scratch folder is being made,
    # which widens any moment in which that folder is open
    write_as(a, home(a) / "lab-00" / "pad.bin", os.urandom(24 * 2**20))
    queue = jobs.Queue(hub.hub.queue_db)
    first = max((j.id for j in queue.jobs()), default=0) + 1
    stop = Path(tempfile.mkdtemp(prefix="mga-stop-", dir="/tmp")) / "stop"
    stop.parent.chmod(0o755)
    pw = pwd.getpwnam(a)
    spinners = [subprocess.Popen(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", "--",
                                  str(HUB_PY), "-c", SPINNER, str(hub.hub.scratch), str(first), str(stop)],
                                 stdout=subprocess.PIPE, text=True, cwd="/") for _ in range(2)]
    try:
        time.sleep(1)
        name = submit(hub, a)
        job = finished(hub, name)
        after = {"grader_processes": [p.pid for p in grader_processes()],
                 "daemon": [p.pid for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]}
        stop.touch()
        spun = [json.loads(p.communicate(timeout=120)[0]) for p in spinners]
    finally:
        stop.touch()
        for p in spinners:
            p.kill()
        shutil.rmtree(stop.parent, ignore_errors=True)
    nb = nbformat.read(hub.hub.course / "autograded" / a / "lab-00" / "00-welcome.ipynb", as_version=4)
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    report = json.loads(next(line for line in outputs.splitlines() if line.startswith("HOSTILE "))[len("HOSTILE "):])
    yield {"job": job, "report": report, "spinner": spun, "tag": tag, **after}
    for pid in after["daemon"]:  # the code before the fix left it running: end it here
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def test_3_a_daemon_started_by_a_notebook_dies_with_its_grading(hub, hostile):
    assert hostile["job"].state == "done", hostile["job"].message
    assert hostile["report"]["uid"] == pwd.getpwnam(layout.GRADER_USER).pw_uid, "autograde ran as the grading account"
    assert not hostile["daemon"], "a setsid daemon of a learner's notebook outlived its grading"
    assert not hostile["grader_processes"], "processes of the grading account outlived the grading"


def test_4_no_scratch_folder_is_ever_open_to_a_learner(hub, hostile):
    """Two processes of the learner try, all through the grading, to open the next gradings' scratch
    folders and keep descriptors of what is inside, to read it once the folder is closed."""
    for spun in hostile["spinner"]:
        assert spun["opened"] == [] and spun["read_later"] == [], f"a learner opened {spun}"


def test_8_scores_are_recomputed_from_the_notebooks_not_taken_from_the_scratch_gradebook(hub, hostile):
    from nbgrader.api import Gradebook

    a, _ = learners(hub)
    assert hostile["report"]["gradebook"].endswith("gradebook.db")
    assert hostile["job"].result["autograde"]["score"] == 0, hostile["job"].result["autograde"]
    with Gradebook(hub.hub.db_url) as gb:
        sub = gb.find_submission("lab-00", a)
        assert sub.score == 0 and all(g.score <= g.max_score for nb in sub.notebooks for g in nb.grades)


def test_9_no_solution_is_within_reach_of_learner_code(hub, hostile):
    a, _ = learners(hub)
    assert hostile["report"]["leaks"] == [], f"the learner's notebook read solutions at {hostile['report']['leaks']}"
    for path in (REPO / "solutions" / "notebooks" / "00-welcome.ipynb", REPO / "solutions" / "assessments" / "train.py"):
        out = hub.as_user(a, "cat", str(path), check=False)
        assert out.returncode != 0 and SOLUTION_MARK not in out.stdout, f"a learner read {path} in the hub's checkout"
    out = learner_python(hub, a, "import multigpu.workshop.layout as l, multigpu.core.layout as c; print(c.course_root())")
    assert out.stdout.strip() == str(REPO), "the learners' servers still import the course package"


def test_10_autograde_is_bounded_in_processes_and_memory(hub, hostile):
    report = hostile["report"]
    assert report["fork_error"] and report["forks"] < GRADING_PIDS, f"{report['forks']} processes, then {report['fork_error']}"
    assert report["hog"] == -9, f"a {GRADING_MEM_GB + 1} GiB allocation ended with {report['hog']}, not killed"


def test_5_feedback_is_served_sandboxed_and_only_the_notebooks_feedback(hub, hostile):

    a, _ = learners(hub)
    job = hostile["job"]
    s = login(hub, a, hub.learners[a])
    page = s.get(hub.base + "/services/grading/")
    assert page.status_code == 200 and f"files/{job.id}/feedback/00-welcome.html" in page.text
    assert "feedback/k.html" not in page.text, "the page links a learner-named HTML file from the feedback folder"
    assert s.get(hub.base + f"/services/grading/files/{job.id}/feedback/k.html").status_code == 404
    r = s.get(hub.base + f"/services/grading/files/{job.id}/feedback/00-welcome.html")
    assert r.status_code == 200 and "00-welcome" in r.text
    policy = r.headers.get("Content-Security-Policy", "")
    assert "sandbox" in policy and "allow-scripts" not in policy and "allow-same-origin" not in policy, policy


def login(hub: ScratchHub, user: str, password: str):
    import requests

    s = requests.Session()
    s.get(hub.base + "/hub/login")
    s.post(hub.base + "/hub/login", data={"username": user, "password": password, "_xsrf": s.cookies.get("_xsrf")},
           allow_redirects=False)
    return s


def test_5_the_instructors_formgrader_runs_no_script_of_a_learner(hub, hostile):
    """The instructor opens learner A's autograded Lab 0 in nbgrader's formgrader (their own server,
    on the hub's origin): a script in A's markdown or outputs would act as the instructor there."""
    from nbgrader.api import Gradebook

    a, _ = learners(hub)
    with Gradebook(hub.hub.db_url) as gb:
        submission_id = gb.find_submission_notebook("00-welcome", "lab-00", a).id
    s = login(hub, hub.instructor, hub.instructor_password)
    s.get(hub.base + "/hub/spawn")
    url = f"{hub.base}/user/{hub.instructor}/formgrader/submissions/{submission_id}/"
    page = wait_for("the instructor's formgrader did not show A's notebook",
                    lambda: (r := s.get(url)).status_code == 200 and "00-welcome" in r.text and r, 300, hub)
    tag = hostile["tag"]
    assert f"window.MGA_{tag}_md" in page.text, "A's markdown answer is shown (as text)"  # type: ignore[attr-defined]
    for made in (f"<script>window.MGA_{tag}_md", f"window.MGA_{tag}_html", f"window.MGA_{tag}_js"):
        assert made not in page.text, f"the formgrader page carries A's script {made!r}"  # type: ignore[attr-defined]
    # A's k.html (autograde copies it into autograded/) and A's feedback page, through the hub's proxy
    r = s.get(url + "k.html")
    policy = r.headers.get("Content-Security-Policy", "")
    assert r.status_code == 404 or ("sandbox" in policy and "allow-scripts" not in policy), \
        f"the instructor's formgrader serves A's k.html on the hub's origin ({r.status_code}, {policy!r})"
    r = s.get(url + f"..%2F..%2F..%2Ffeedback%2F{a}%2Flab-00%2F00-welcome.html")
    assert r.status_code == 404, f"the instructor's formgrader serves A's feedback page ({r.status_code})"


def instructor_server(course: Path) -> tuple[str, dict[str, str], subprocess.Popen]:
    """The instructor's Jupyter server as the hub spawns it (the hub course's nbgrader config, then
    ``jupyter/instructor``), from the hub's environment: ``(base URL, auth headers, process)``."""
    import secrets
    import socket

    import requests

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    env = {"HOME": str(course), "PATH": f"{HUB_PY.parent}:/usr/bin:/bin",
           "JUPYTER_CONFIG_PATH": f"{course}:{REPO / 'jupyter' / 'instructor'}"}
    proc = subprocess.Popen([str(HUB_PY.parent / "jupyter-server"), "--allow-root", "--no-browser", "--ip=127.0.0.1",
                             f"--port={port}", f"--ServerApp.root_dir={course}", f"--IdentityProvider.token={token}"],
                            env=env, cwd=course, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if requests.get(base + "/api", timeout=5).ok:
                return base, {"Authorization": f"token {token}"}, proc
        except requests.RequestException:
            time.sleep(1)
    proc.kill()
    pytest.fail("the instructor's Jupyter server did not start")


def test_5_the_formgrader_serves_no_learner_page_as_the_instructors(tmp_path, monkeypatch):
    """Found by the red-team pass after the fixes: nbgrader's formgrader serves the files below
    ``/formgrader/submissions/<id>/`` (a notebook's images) as their names say, on the hub's origin,
    and with ``..%2F`` any file of the course. A's ``k.html`` submitted with Lab 0 is copied by
    autograde into ``autograded/``; with ``..%2F`` A's ``k.html`` in ``submitted/`` and nbgrader's
    feedback page of A's notebook (A's markdown as HTML) are reached too. A markdown link in A's
    notebook, relative to the formgrader's page of it, takes the instructor there. The exact files
    the grading leaves in the hub course, on the instructor's server as the hub spawns it."""
    import requests
    from nbgrader.api import Gradebook

    from multigpu.workshop import course as hub_course

    monkeypatch.setenv("PATH", f"{HUB_PY.parent}:{os.environ['PATH']}")  # nbgrader's gradebook runs alembic
    course = tmp_path / "course"
    course.mkdir()
    db_url = f"sqlite:///{course / 'gradebook.db'}"
    (course / "nbgrader_config.py").write_text(hub_course.COURSE_CONFIG.format(
        course=str(course), course_id=layout.COURSE_ID, db_url=db_url, exchange=str(tmp_path / "exchange"),
        assessment=layout.ASSESSMENT))
    learner = "learnera"
    with Gradebook(db_url) as gb:
        gb.add_assignment("lab-00")
        gb.add_notebook("00-welcome", "lab-00")
        gb.add_student(learner)
        gb.add_submission("lab-00", learner)
        submission_id = gb.find_submission_notebook("00-welcome", "lab-00", learner).id
    script = b"<script>document.title = 'stolen ' + document.cookie</script>"
    for part in ("autograded", "submitted", "feedback"):
        (course / part / learner / "lab-00").mkdir(parents=True)
        (course / part / learner / "lab-00" / "k.html").write_bytes(script)
    (course / "feedback" / learner / "lab-00" / "00-welcome.html").write_bytes(b"<p>My answer. " + script)
    (course / "autograded" / learner / "lab-00" / "plot.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    base, auth, proc = instructor_server(course)
    try:
        url = f"{base}/formgrader/submissions/{submission_id}/"
        for path in ("k.html", "plot.png"):  # autograded/: served, but never as the instructor's page
            r = requests.get(url + path, headers=auth, timeout=60)
            policy = r.headers.get("Content-Security-Policy", "")
            assert r.status_code == 200, f"{path}: {r.status_code}"
            assert "sandbox" in policy and "allow-scripts" not in policy and "allow-same-origin" not in policy, \
                f"the formgrader serves A's {path} on the instructor's origin ({r.headers.get('Content-Type')}, {policy!r})"
        for path in (f"submitted/{learner}/lab-00/k.html", f"feedback/{learner}/lab-00/00-welcome.html", "gradebook.db"):
            r = requests.get(url + "..%2F..%2F..%2F" + path.replace("/", "%2F"), headers=auth, timeout=60)
            assert r.status_code == 404, f"the formgrader serves the course's {path} below a submission ({r.status_code})"
    finally:
        proc.kill()
        proc.wait()


BIND = "import socket, sys\ntry:\n    socket.socket().bind(('127.0.0.1', int(sys.argv[1])))\n    print('bound')\nexcept OSError as e:\n    print(e.errno)"


def test_5_no_learner_can_take_the_hubs_own_ports_while_it_restarts(tmp_path, monkeypatch):
    """Found by the red-team pass after the fixes, on a real hub: while the hub restarts
    (docs/workshop.md: Ctrl-C, then make hub again) the proxy keeps sending ``/hub/`` and
    ``/services/grading/`` to the hub's and the grading service's ports on 127.0.0.1. A learner's
    process listening there meanwhile served its own login page and grading page, with its script,
    on the hub's origin (and the hub could not take its port back). Each of the box's own
    addresses of a hub configured by default (the hub's, the proxy's API, the grading service's)
    is refused to a learner's account."""
    import errno
    from urllib.parse import urlparse

    from traitlets.config import Config

    from multigpu.workshop import hubconfig

    monkeypatch.setenv("MULTIGPU_HUB_ROOT", str(tmp_path))
    for var in ("MULTIGPU_HUB_INTERNAL_PORT", "MULTIGPU_PROXY_API_PORT", "MULTIGPU_GRADING_PORT"):
        monkeypatch.delenv(var, raising=False)
    c = Config()
    hubconfig.configure(c)
    grading = next(s for s in c.JupyterHub.services if s["name"] == "grading")  # the culler is another
    ports = {what: urlparse(url).port for what, url in (("the hub", c.JupyterHub.hub_bind_url),
                                                         ("the proxy's API", c.ConfigurableHTTPProxy.api_url),
                                                         ("the grading service", grading["url"]))}
    learner = f"mgp{os.getpid() % 100000}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/false", learner], check=True)
    try:
        pw = pwd.getpwnam(learner)
        for what, port in ports.items():
            out = subprocess.run(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", "--",
                                  "/usr/bin/python3", "-c", BIND, str(port)], capture_output=True, text=True, timeout=60)
            assert out.stdout.strip() == str(errno.EACCES), \
                f"a learner may listen on {what}'s port {port} ({out.stdout.strip()}{out.stderr.strip()})"
    finally:
        subprocess.run(["userdel", learner], capture_output=True)


# 10 --------------------------------------------------------------------------------------------
BOMB = r'''
import os, sys, time
kids, error = [], None
for _ in range(int(sys.argv[1])):
    try:
        pid = os.fork()
    except OSError as e:
        error = e.strerror
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
print(len(kids), error)
'''


SHM_HOG = r'''
import os, sys
chunk = b"\1" * (64 * 2**20)
shm = open("/dev/shm/hold", "wb")
memfd = os.memfd_create("hold")
for i in range(int(sys.argv[1]) // 64):  # half in the sandbox's /dev/shm, half in a memory file never mapped
    if i % 2:
        shm.write(chunk)
        shm.flush()
    else:
        os.write(memfd, chunk)
    with open("progress", "a") as log:  # in the run folder: read after the run, whoever was killed
        print("held", (i + 1) * 64, file=log)
'''
RUN_HOG = r'''
import sys
from pathlib import Path
from multigpu.grading import rules, runner
work = Path(sys.argv[1])
rec = runner.run_untrusted(work / "train.py", work, workers=None, timeout=300, max_output_bytes=10**6, args=[sys.argv[2]],
                           max_memory_bytes=rules.settings().max_memory_bytes, sandbox={"hidden": []})
print(rec.tail, "memory_exceeded", rec.memory_exceeded, flush=True)
'''


def test_10_a_grading_job_is_bounded_in_memory_shared_memory_included(tmp_path, monkeypatch):
    """Found by the red-team pass after the fixes: the official run's memory bound counts its
    processes' RSS, and a train.py that writes into the sandbox's ``/dev/shm`` or ``/tmp`` (both
    memory) or into a memory file it never maps holds memory no RSS shows (1.5 GiB against a
    512 MiB bound, seen on this box), up to all the box has: the box's OOM killer then picks the
    hub, the grading service or the learners' kernels. A grading job's control group, set as
    ``grade_one`` sets it (``service.confine_job``), bounds all of it: 1 GiB here, the script asks for 2."""
    from multigpu.running import launch
    from multigpu.workshop import limits, service

    if limits.version() is None:
        pytest.skip("no writable cgroup hierarchy on this machine")
    work = tmp_path / "run"
    work.mkdir()
    (work / "train.py").write_text(SHM_HOG)
    group = f"grading-mga{os.getpid()}"
    monkeypatch.setenv("MULTIGPU_GRADING_JOB_MEM_GB", "1")  # read by confine_job in the child before it starts
    proc = launch.start([sys.executable, "-c", RUN_HOG, str(work), "2048"], env=dict(os.environ),
                        before_exec=lambda: service.confine_job(group, None))
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        proc.kill()
        limits.release(group)
    progress = work / "progress"
    held = [int(line.split()[1]) for line in (progress.read_text() if progress.exists() else "").splitlines()]
    assert held and max(held) >= 512, f"the submission did not run as far as half the bound:\n{out[-2000:]!r}"
    assert max(held) <= 1024, f"a submission held {max(held)} MiB of memory in a job bounded at 1 GiB:\n{out[-2000:]!r}"


def test_10_a_fork_bomb_in_a_learner_server_stops_at_its_limit(hub):
    """The bomb runs as the learner in their server's control groups, as a terminal of that
    server would (the spawner puts the server there; its children inherit them)."""

    a, _ = learners(hub)
    s = login(hub, a, hub.learners[a])
    s.get(hub.base + "/hub/spawn")

    def server() -> list[psutil.Process]:  # the server itself, not its namespaces' first process
        return [p for p in psutil.process_iter(["username", "cmdline"]) if p.info["username"] == a
                and any("jupyterhub-singleuser" in x for x in (p.info["cmdline"] or [])[:2])]

    (proc,) = wait_for(f"{a}'s server did not start", server, 300, hub)  # type: ignore[misc]
    groups = [line.split(":", 2) for line in Path(f"/proc/{proc.pid}/cgroup").read_text().splitlines()]
    pw = pwd.getpwnam(a)

    def enter() -> None:  # in the child, as root: the server's groups, then the learner's uid
        for _, controllers, path in groups:
            for c in controllers.split(",") if controllers else [""]:
                procs = Path("/sys/fs/cgroup") / c.removeprefix("name=") / path.lstrip("/") / "cgroup.procs"
                if c and not c.startswith("name=") and procs.exists():
                    procs.write_text(str(os.getpid()))
        os.initgroups(a, pw.pw_gid)
        os.setgid(pw.pw_gid)
        os.setuid(pw.pw_uid)

    out = subprocess.run([str(HUB_PY), "-c", BOMB, str(LEARNER_PIDS + 100)], preexec_fn=enter, capture_output=True,
                         text=True, timeout=300, cwd="/")
    forks, error = out.stdout.split(" ", 1)
    assert error.strip() != "None" and int(forks) < LEARNER_PIDS, f"{forks} processes, then {error.strip()}"


# 1 ---------------------------------------------------------------------------------------------
def test_1_fifos_and_giant_sparse_files_are_refused_without_hanging_the_grader(hub):
    a, _ = learners(hub)
    for make, words in (("open(d + '/big.bin', 'wb').truncate(2**30)", "MiB"),
                        ("os.mkfifo(d + '/data.bin')", "FIFO")):
        name = submission_name(a, "lab-00")
        learner_python(hub, a, "import os, shutil, sys; d = sys.argv[1]; os.mkdir(d); "
                       f"shutil.copyfile(os.path.expanduser('~/blank-00-welcome.ipynb'), d + '/00-welcome.ipynb'); {make}",
                       str(hub.hub.inbound / name))
        job = finished(hub, name, timeout=180)
        assert job.state == "failed" and words in job.message, f"{job.state}: {job.message}"


# 11 --------------------------------------------------------------------------------------------
OFFICIAL_PROBE = r'''
import json, os, socket, sys
places = json.loads(sys.argv[1])
got = {"uid": os.getuid(), "run": sorted(os.listdir("/run"))}
for name in ("shadow", "key", "solution"):
    try:
        with open(places[name], "rb") as f:
            got[name] = "read " + repr(f.read(16))
    except OSError as e:
        got[name] = f"refused: {e.strerror}"
try:
    s = socket.socket(socket.AF_UNIX)
    s.connect(places["socket"])
    got["socket"] = "connected"
except OSError as e:
    got["socket"] = f"refused: {e.strerror}"
print("PROBE " + json.dumps(got))
'''


def test_11_the_official_grading_runs_the_script_unprivileged_without_run_keys_or_solutions(tmp_path, monkeypatch):
    """The hub's official grading (as root) of a train.py that reads what root can: /etc/shadow,
    the operator's signing key kept outside root's HOME (``MULTIGPU_CERTIFICATE_KEY``), a root-only
    socket under /run, the checkout's solutions. The exact sandbox and hidden folders of
    ``workshop.grading.official`` (``autograde.hidden_from_learners``), with the real files at real places."""
    import socket

    from multigpu.core import data
    from multigpu.grading import preparation, rules, runner
    from multigpu.workshop import autograde

    tag = uuid.uuid4().hex[:8]
    key_dir = Path("/etc") / f"multigpu-test-{tag}"
    sock_path = Path("/run") / f"multigpu-test-{tag}.sock"
    server = socket.socket(socket.AF_UNIX)
    try:
        key_dir.mkdir(mode=0o700)
        key = key_dir / "course-key.pem"
        key.write_text("-----BEGIN PRIVATE KEY-----\nthe operator's, kept outside root's HOME\n")
        key.chmod(0o600)
        monkeypatch.setenv("MULTIGPU_CERTIFICATE_KEY", str(key))
        server.bind(str(sock_path))
        sock_path.chmod(0o600)
        server.listen()
        hub = layout.Hub(tmp_path / "hub")
        hub.root.mkdir()
        train_root = data.ensure_dataset(train_per_class=rules.QUICK.train_per_class,
                                         val_per_class=rules.QUICK.val_per_class, progress=False)
        work = tmp_path / "work"
        work.mkdir()
        (work / "train.py").write_text(OFFICIAL_PROBE)
        places = {"shadow": "/etc/shadow", "key": str(key), "socket": str(sock_path),
                  "solution": str(REPO / "solutions" / "assessments" / "train.py")}
        rec = runner.run_untrusted(work / "train.py", work, workers=None, timeout=120, max_output_bytes=100_000,
                                   args=[json.dumps(places)],
                                   sandbox=preparation.sandbox_rules(train_root, autograde.hidden_from_learners(hub)))
    finally:
        server.close()
        sock_path.unlink(missing_ok=True)
        shutil.rmtree(key_dir, ignore_errors=True)
    assert rec.returncode == 0 and rec.sandboxed, rec.tail
    got = json.loads(next(x for x in rec.tail.splitlines() if x.startswith("PROBE "))[len("PROBE "):])
    assert got["uid"] != 0, f"the sandboxed script ran as root: {got}"
    for name in ("shadow", "key", "solution", "socket"):
        assert got[name].startswith("refused"), f"{name}: {got[name]}"
    assert got["run"] == [], f"/run is visible: {got['run']}"


# 3 ---------------------------------------------------------------------------------------------
RACE = r'''
import os, sys
os.chdir(sys.argv[1])
while not os.path.exists(sys.argv[3]):
    try:
        os.rename("d", "d.real")
        os.symlink(sys.argv[2], "d")
        os.unlink("d")
        os.rename("d.real", "d")
    except OSError:
        pass
'''


def test_8_the_assessments_points_come_from_the_official_grading_alone(tmp_path, monkeypatch):
    """Found by the red-team pass after the fixes: the assessment notebook's test cells run in the
    learner's kernel, so its autograded copy can show every test passed (a cell of the learner's
    replaces the deferred RESULT). The official grading's points replace those (nbgrader's manual
    scores), but only once it ran: a submission without train.py (or one whose official step
    fails) kept the notebook's own 10/10 in the instructor's gradebook, and a resubmission wiped
    an earlier official result the same way. The scores the job records from the autograded
    assessment notebook (``autograde.record_scores``, with real files and a real gradebook) are 0."""
    from nbgrader.api import Gradebook

    from multigpu.workshop import autograde

    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # nbgrader's gradebook runs alembic
    hub = layout.Hub(tmp_path)
    hub.course.mkdir()
    nb = nbformat.read(REPO / "solutions" / "assessments" / "assessment.ipynb", as_version=4)
    learner = "learnera"
    with Gradebook(hub.db_url) as gb:
        gb.add_assignment(layout.ASSESSMENT)
        gb.add_notebook("assessment", layout.ASSESSMENT)
        for cell in nb.cells:
            if cell.metadata.get("nbgrader", {}).get("grade"):
                gb.add_grade_cell(cell.metadata.nbgrader["grade_id"], "assessment", layout.ASSESSMENT,
                                  max_score=cell.metadata.nbgrader["points"], cell_type="code")
        gb.add_student(learner)
    for cell in nb.cells:  # what the learner's kernel leaves in each test cell: it printed, raised nothing
        if cell.cell_type == "code":
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="ok\n")]
    folder = hub.course / "autograded" / learner / layout.ASSESSMENT
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / "assessment.ipynb")
    job = jobs.Job(1, f"{learner}+{layout.ASSESSMENT}+x", learner, layout.ASSESSMENT, "x", "running", 0.0, None, None,
                   1, "", None)
    claimed = autograde.notebook_scores(folder)
    assert sum(claimed["assessment"].values()) == 10, f"the forged notebook claims every test: {claimed}"
    recorded = autograde.record_scores(hub, job, claimed)
    with Gradebook(hub.db_url) as gb:
        score = gb.find_submission(layout.ASSESSMENT, learner).score
    assert recorded["score"] == 0 and score == 0, \
        f"the assessment's points in the gradebook ({score}) come from the learner's own kernel, not the official grading"


def test_3_handing_a_folder_over_never_follows_a_link_swapped_in_mid_walk():
    """Root gives a scratch folder to the grading account while a process of that account (a
    learner's daemon) swaps a folder inside it for a link to a folder of root's, again and again:
    root's files must stay root's (``safefiles.chown_tree``, which every hand-over uses)."""
    from multigpu.workshop import safefiles

    nobody = pwd.getpwnam("nobody")
    base = Path(tempfile.mkdtemp(prefix="mga-chown-", dir="/tmp"))
    base.chmod(0o755)
    stop = base / "stop"
    names = [f"f{i:03d}" for i in range(100)]
    try:
        victim = base / "victim"
        victim.mkdir()
        for n in names:
            (victim / n).write_text("root's")
        tree = base / "tree"
        (tree / "d").mkdir(parents=True)
        for n in names:
            (tree / "d" / n).write_text("the grading's")
        safefiles.chown_tree(tree, nobody.pw_uid, nobody.pw_gid)
        racer = subprocess.Popen(["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
                                  "--", str(HUB_PY), "-c", RACE, str(tree), str(victim), str(stop)], cwd="/")
        try:
            for _ in range(300):
                safefiles.chown_tree(tree, nobody.pw_uid, nobody.pw_gid)
        finally:
            stop.touch()
            racer.wait(30)
        taken = [n for n in names if (victim / n).stat().st_uid != 0]
        assert not taken, f"root's files given to the racing account: {taken}"
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------------------ issue 48: one learner, another's
_SERVERS: dict[str, object] = {}


def server(hub: ScratchHub, user: str):
    """``user``'s own JupyterLab on the hub (logged in, server started), as their browser drives it."""
    from multigpu.workshop.learnerclient import Learner

    if user not in _SERVERS:
        learner = Learner(hub.base, user, hub.learners[user])
        learner.login()
        learner.wait_ready()
        _SERVERS[user] = learner
    return _SERVERS[user]


def in_kernel(hub: ScratchHub, user: str, code: str, timeout: float = 300) -> str:
    """Run ``code`` in a kernel of ``user``'s server, as a notebook cell; its output (the cell must pass)."""
    learner = server(hub, user)
    kernel = learner.start_kernel()
    ran = learner.execute(kernel, code, timeout=timeout)
    learner.api("DELETE", f"api/kernels/{kernel}")
    assert ran.status == "ok", f"{user}'s cell failed: {ran.error}\n{ran.output[-2000:]}"
    return ran.output


#: A job the way a learner runs one from a terminal: plain horovodrun --gloo with the kernel's own
#: environment (the hub token in it), its rendezvous port told, a pause in which others may look.
GLOO_JOB = """
import json, os, subprocess, sys, tempfile, textwrap
script = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
script.write(textwrap.dedent('''
    import os, time, horovod.torch as hvd, torch
    hvd.init()
    if hvd.rank() == 0:
        print("RENDEZVOUS", os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT"), flush=True)
    time.sleep({pause})
    print("SUM", float(hvd.allreduce(torch.ones(1), name="s", op=hvd.Sum)), flush=True)
'''))
script.close()
job = subprocess.Popen(["horovodrun", "--gloo", "-np", "2", "-H", "localhost:2", sys.executable, script.name],
                       stdout=open(os.path.expanduser("~/gloo-job.log"), "w"), stderr=subprocess.STDOUT,
                       start_new_session=True)  # it outlives the cell's kernel, as a terminal's job would
print(json.dumps({{"pid": job.pid, "token": os.environ["JUPYTERHUB_API_TOKEN"]}}))
"""


def start_gloo_job(hub: ScratchHub, user: str, pause: float) -> dict:
    out = in_kernel(hub, user, GLOO_JOB.format(pause=pause))
    return json.loads(out.strip().splitlines()[-1])


def gloo_log(user: str) -> str:
    path = home(user) / "gloo-job.log"
    return path.read_text() if path.exists() else ""


SCAN = """
import os, json
token = {token!r}
mine = os.getuid()
found, others, seen = [], set(), 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    seen += 1
    try:
        uid = os.stat(f"/proc/{{pid}}").st_uid
        if uid != mine:
            others.add(uid)
        for part in ("cmdline", "environ"):
            try:
                with open(f"/proc/{{pid}}/{{part}}", "rb") as f:
                    if token.encode() in f.read():
                        found.append((pid, part))
            except OSError:
                pass
    except OSError:
        pass
print(json.dumps({{"found": found, "other_uids": sorted(others), "seen": seen}}))
"""


def test_13_no_learner_reads_anothers_hub_token_while_they_run_a_gloo_job(hub):
    """B runs a Gloo job from their server as a learner would (horovodrun --gloo, whose workers get
    their environment on a 'sh -c env ...' command line, B's hub token in it). A scans every
    /proc/*/cmdline and /proc/*/environ meanwhile: no token of B, no process of anyone else. (Before:
    A read B's token there and acted as B through the hub.) B itself sees its job, so the scan looks."""
    a, b = learners(hub)
    job = start_gloo_job(hub, b, pause=25)
    deadline = time.monotonic() + 120
    while "RENDEZVOUS" not in gloo_log(b) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "RENDEZVOUS" in gloo_log(b), f"B's job did not start:\n{gloo_log(b)[-2000:]}"
    seen_by_a = json.loads(in_kernel(hub, a, SCAN.format(token=job["token"])).strip().splitlines()[-1])
    seen_by_b = json.loads(in_kernel(hub, b, SCAN.format(token=job["token"])).strip().splitlines()[-1])
    assert seen_by_b["found"], "B's own scan did not find its token: the scan proves nothing"
    assert seen_by_a["found"] == [], f"A read B's hub token in {seen_by_a['found']}"
    assert pwd.getpwnam(b).pw_uid not in seen_by_a["other_uids"], "A saw B's processes"
    wait_for("B's job did not finish", lambda: "SUM 2.0" in gloo_log(b), 180, hub)


RENDEZVOUS_ATTACK = """
import json, socket, urllib.request
port = {port}
tried = {{}}
try:
    socket.create_connection(("127.0.0.1", port), timeout=3).close()
    tried["connect"] = "connected"
except OSError as e:
    tried["connect"] = type(e).__name__
try:
    req = urllib.request.Request(f"http://127.0.0.1:{{port}}/global/rank_0", data=b"garbage", method="PUT")
    tried["put"] = urllib.request.urlopen(req, timeout=3).status
except Exception as e:
    tried["put"] = type(e).__name__
print(json.dumps(tried))
"""


def test_14_no_learner_reaches_anothers_rendezvous_and_the_job_finishes(hub):
    """B's Gloo rendezvous listens on every address of B's network namespace, unauthenticated; A
    connects and PUTs garbage to its port from A's server: refused (A's loopback is A's alone), and B's
    job sums right. (Before: the PUT answered 200 and B's rank died.)"""
    a, b = learners(hub)
    start_gloo_job(hub, b, pause=20)
    deadline = time.monotonic() + 120
    while "RENDEZVOUS" not in gloo_log(b) and time.monotonic() < deadline:
        time.sleep(0.5)
    port = int(gloo_log(b).split("RENDEZVOUS", 1)[1].split()[0])
    tried = json.loads(in_kernel(hub, a, RENDEZVOUS_ATTACK.format(port=port)).strip().splitlines()[-1])
    assert tried == {"connect": "ConnectionRefusedError", "put": "URLError"}, tried
    wait_for("B's job did not finish", lambda: "SUM 2.0" in gloo_log(b), 180, hub)


SHARED_MEMORY = """
import ctypes, json, os, pwd
libc = ctypes.CDLL(None, use_errno=True)
segment = libc.shmget(0, 64 * 2**20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600: 64 MB nobody removes
folder = "/dev/shm/open-to-all-" + pwd.getpwuid(os.getuid()).pw_name
os.makedirs(folder, exist_ok=True)
os.chmod(folder, 0o1777)
with open(folder + "/held", "wb") as f:
    f.write(b"x" * 32 * 2**20)
print(json.dumps({"segment": segment, "listing": sorted(os.listdir("/dev/shm"))}))
"""


def segments_of(uid: int) -> list[str]:
    """The System V segments the box lists for ``uid`` (ipcs -m; a learner's own are in their namespace)."""
    out = subprocess.run(["ipcs", "-m", "-c"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()[3:] if line.split() and str(uid) in line.split()[2:4]]


def test_15_shared_memory_and_system_v_segments_go_with_the_learners_server(hub):
    """A leaves a 64 MB System V segment and a 32 MB file in a world-writable folder of /dev/shm,
    and a file in /run/lock (world-writable, on the box's disk), then A's server stops: nothing of
    it is left on the box, and B never saw any of it. (Before: all of it outlived the server, make
    hub-stop and make hub-offboard, counted against no one; the red-team pass of 2026-11-28 planted
    a file in /run/lock that another learner read.)"""
    a, b = learners(hub)
    uid = pwd.getpwnam(a).pw_uid
    folder, lock = Path(f"/dev/shm/open-to-all-{a}"), Path(f"/run/lock/planted-by-{a}")
    in_kernel(hub, a, f"open({str(lock)!r}, 'w').write('x' * 2**20)")
    assert not lock.exists(), "A's /run/lock is the box's"
    seen = json.loads(in_kernel(hub, b, "import os, json; print(json.dumps(os.listdir('/run/lock')))").strip())
    assert lock.name not in seen, "B sees what A left in /run/lock"
    made = json.loads(in_kernel(hub, a, SHARED_MEMORY).strip().splitlines()[-1])
    assert made["segment"] >= 0 and folder.name in made["listing"]
    assert not folder.exists(), "A's /dev/shm is the box's"
    listing = json.loads(in_kernel(hub, b, "import os, json; print(json.dumps(os.listdir('/dev/shm')))").strip())
    assert folder.name not in listing, "B sees A's shared memory"
    assert not segments_of(uid), "A's segment is in the box's IPC namespace"
    stop_server_of(a)  # as the spawner stops it (SIGINT to the server's process, the hub's stop button)
    _SERVERS.pop(a)
    wait_for(f"{a}'s processes outlived the server", lambda: not [p for p in psutil.process_iter(["uids"])
                                                                   if p.info["uids"] and p.info["uids"].real == uid], 60, hub)
    assert not segments_of(uid) and not folder.exists()


SQUAT = """
import http.server, json, socket, threading
class Squat(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"squatted")
    def log_message(self, *a):
        pass
import time
deadline = time.monotonic() + {seconds}
while True:  # as soon as the port is free (B's server gone), take it
    try:
        s = http.server.HTTPServer(("127.0.0.1", {port}), Squat)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.2)
threading.Thread(target=s.serve_forever, daemon=True).start()
time.sleep(max(0, deadline - time.monotonic()))
s.shutdown()
print("done")
"""


def server_process(user: str) -> psutil.Process:
    """``user``'s JupyterLab server (its own process, not what started it)."""
    uid = pwd.getpwnam(user).pw_uid
    for p in psutil.process_iter(["cmdline", "uids"]):
        if p.info["uids"] and p.info["uids"].real == uid and \
                any("jupyterhub-singleuser" in x for x in (p.info["cmdline"] or [])[:2]):
            return p
    raise AssertionError(f"no server of {user} runs")


def stop_server_of(user: str) -> None:
    """Stop ``user``'s server as the hub's stop does (SIGINT, the server shuts down)."""
    import signal

    proc = server_process(user)
    proc.send_signal(signal.SIGINT)
    proc.wait(60)


def server_port(user: str) -> int:
    """The port ``user``'s server listens on (on the box, the proxy reaches it there)."""
    from urllib.parse import urlparse

    return int(urlparse(server_process(user).environ()["JUPYTERHUB_SERVICE_URL"]).port)


def test_16_no_learner_takes_the_route_of_a_server_that_died_while_the_hub_was_down(hub):
    """The hub is down (restarting) and B's server dies; the proxy keeps B's route (cleanup_proxy off)
    to 127.0.0.1:<B's port>. A's server listens on that port: in A's own network namespace, which the
    proxy never reaches, so B's route leads nowhere instead of to A's page."""
    import threading

    a, b = learners(hub)
    learner_b = server(hub, b)
    port = server_port(b)
    squat = threading.Thread(target=in_kernel, args=(hub, a, SQUAT.format(port=port, seconds=40)), daemon=True)
    squat.start()
    time.sleep(10)  # A's cell waits for the port
    hub.stop()
    try:
        uid = pwd.getpwnam(b).pw_uid
        for p in psutil.process_iter(["uids", "cmdline"]):  # B's server dies while the hub is down
            if "multigpu.workshop.namespaces" in (p.info["cmdline"] or []) and b in p.info["cmdline"] \
                    or (p.info["uids"] and p.info["uids"].real == uid):
                p.kill()
        time.sleep(4)  # A takes the port where it can
        r = learner_b.session.get(f"{hub.base}/user/{b}/api/status", timeout=30)
        assert "squatted" not in r.text, "the proxy took B's route to A's server"
    finally:
        _SERVERS.pop(b, None)
        squat.join(60)
        hub.start()


FILL = """
import errno, json, os
written, err, chunk = 0, None, 2**20
fd = os.open({path!r}, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
while written < {most} * 2**20:
    try:
        written += os.write(fd, b"\\1" * chunk)
        os.fsync(fd)
    except OSError as e:
        if chunk > 4096:  # the last blocks, 4 KB at a time: the disk is full, not nearly
            chunk //= 16
            continue
        err = errno.errorcode.get(e.errno, str(e.errno))
        break
os.close(fd)
print(json.dumps({{"written_mb": written // 2**20, "error": err}}))
"""


def test_17_a_learner_who_fills_their_home_or_the_exchange_stops_at_its_quota(hub):
    """A fills their home from a kernel: "No space left on device" at their quota, not the box's
    disk; JupyterLab then refuses A's save with a message that says the home is full, while B saves
    and writes as before; A deletes the file and saves again. A file written into the exchange stops
    at the exchange's quota. (Before: one home or the exchange filled the box's disk, the hub's
    database and every other learner's home with it.)"""
    from multigpu.workshop.learnerclient import LearnerError

    a, b = learners(hub)
    for folder in (home(a), home(b), hub.hub.exchange):
        assert os.path.ismount(folder), f"{folder} is not a file system of its own"
    big = home(a) / "big.bin"
    filled = json.loads(in_kernel(hub, a, FILL.format(path=str(big), most=2 * LEARNER_DISK_MB)).strip().splitlines()[-1])
    assert filled["error"] == "ENOSPC" and filled["written_mb"] <= LEARNER_DISK_MB, filled
    notebook = {"type": "notebook", "content": {"cells": [{"cell_type": "markdown", "metadata": {}, "source": "x" * 2**20}],
                                                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}}
    try:
        with pytest.raises(LearnerError, match="HTTP 507.*home folder is full"):
            server(hub, a).api("PUT", "api/contents/full.ipynb", json=notebook)
        server(hub, b).api("PUT", "api/contents/fine.ipynb", json=notebook)
        wrote = json.loads(in_kernel(hub, b, FILL.format(path=str(home(b) / "some.bin"), most=8)).strip().splitlines()[-1])
        assert wrote == {"written_mb": 8, "error": None}, f"B was stopped by A's full home: {wrote}"
    finally:
        big.unlink(missing_ok=True)
        (home(b) / "some.bin").unlink(missing_ok=True)
    server(hub, a).api("PUT", "api/contents/full.ipynb", json=notebook)

    junk = hub.hub.inbound / f"{a}+junk"
    try:
        out = learner_python(hub, a, FILL.format(path=str(junk), most=2 * EXCHANGE_DISK_MB)).stdout
        filled = json.loads(out.strip().splitlines()[-1])
        assert filled["error"] == "ENOSPC" and filled["written_mb"] <= EXCHANGE_DISK_MB, filled
        before = set(os.listdir(hub.hub.inbound))
        refused = hub.as_user(b, str(Path(hub.python).parent / "nbgrader"), "submit", "lab-00", check=False)
        assert refused.returncode != 0 and "exchange is full" in refused.stdout + refused.stderr, refused
        assert set(os.listdir(hub.hub.inbound)) == before, "a half-copied submission was left to grade"
    finally:
        junk.unlink(missing_ok=True)


#: From a learner's kernel: write into the exchange (read-only there), then fill the inbound folder
#: as the kernel sees it (the learner's own, in their home).
EXCHANGE_PROBE = """
import errno, json, os
said = {{}}
for name, path in (("root", {exchange!r} + "/x.bin"), ("course", {course!r} + "/x.bin")):
    try:
        with open(path, "wb") as f:
            f.write(b"x" * 2**22)
        said[name] = "written"
    except OSError as e:
        said[name] = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps(said))
"""
#: nbgrader submit from a learner's kernel, as the Assignments tab runs it in their server.
SUBMIT = """
import os, subprocess, sys
p = subprocess.run([sys.executable, "-m", "nbgrader", "submit", "lab-00"], cwd=os.path.expanduser("~"),
                   capture_output=True, text=True)
print(p.returncode, p.stdout[-500:], p.stderr[-1500:])
"""
#: A Lab 0 cell that fills the folder the grading runs it in (the grading's own disk), then
#: removes what it wrote so that the grading goes on.
FILL_GRADING = FILL.replace("{path!r}", "os.path.abspath('fill.bin')") + "os.remove('fill.bin')\n"


def test_17_from_their_server_a_learner_fills_only_their_own_inbound_and_a_grading_only_its_own_disk(hub):
    """From A's kernel: the exchange is read-only (its root a 1 MB tmpfs of A's server's own), and
    nbgrader's inbound folder there is A's own, in A's home: filling it stops at A's quota while the exchange's disk takes nothing. B then
    submits from B's kernel (nbgrader submit, as the Assignments tab does), the service finds the
    submission in B's inbound folder and grades it; B's notebook fills the folder the grading runs
    it in, and stops at the grading's own disk (MULTIGPU_GRADING_DISK_MB), not the box's. After the
    grading no image or mount of it is left. (Before: one learner's file filled the exchange, and
    every learner's Submit failed until the instructor removed it; a grading's notebook or train.py
    wrote on the box's disk without a bound.)"""
    a, b = learners(hub)
    exchange_used = shutil.disk_usage(hub.hub.exchange).used
    course = hub.hub.inbound.parent
    probe = json.loads(in_kernel(hub, a, EXCHANGE_PROBE.format(exchange=str(hub.hub.exchange), course=str(course)))
                       .strip().splitlines()[-1])
    # the exchange's root is a 1 MB tmpfs of A's server's own; the course's folder is read-only
    assert probe == {"root": "ENOSPC", "course": "EROFS"}, f"A's server writes into the exchange: {probe}"
    assert not (hub.hub.exchange / "x.bin").exists()
    own = home(a) / inbound.folder_name(hub.hub)
    try:
        filled = json.loads(in_kernel(hub, a, FILL.format(path=str(hub.hub.inbound / "junk.bin"),
                                                          most=2 * EXCHANGE_DISK_MB)).strip().splitlines()[-1])
        assert filled["error"] == "ENOSPC" and filled["written_mb"] <= LEARNER_DISK_MB, filled
        assert (own / "junk.bin").stat().st_size >= filled["written_mb"] * 2**20, "the file is not in A's own folder"
        assert shutil.disk_usage(hub.hub.exchange).used - exchange_used < 2**20, "the exchange's disk took A's file"
    finally:
        (own / "junk.bin").unlink(missing_ok=True)

    reset_lab0(b, cells=[FILL_GRADING.format(most=2 * GRADING_DISK_MB)])
    time.sleep(1.1)  # nbgrader's timestamps tell two submissions apart
    out = in_kernel(hub, b, SUBMIT)
    assert out.strip().startswith("0 "), f"B's submit from their server failed: {out}"
    names = [n for n in os.listdir(home(b) / inbound.folder_name(hub.hub)) if n.startswith(f"{b}+lab-00+")]
    assert names, "B's submission is not in B's own inbound folder"
    job = finished(hub, max(names))
    assert job.state == "done", f"{job.state}: {job.message}"
    graded = nbformat.read(hub.hub.course / "autograded" / b / "lab-00" / lab0(b).name, as_version=4)
    shown = "".join(o.get("text", "") for c in graded.cells if c.cell_type == "code" for o in c.get("outputs", []))
    filled = json.loads(next(line for line in shown.splitlines() if line.startswith('{"written_mb"')))
    assert filled["error"] == "ENOSPC" and filled["written_mb"] <= GRADING_DISK_MB, filled
    assert not list((hub.hub.state / "disks").glob("grading-*")), "a grading's image was left"
    assert str(hub.hub.scratch) not in Path("/proc/self/mounts").read_text(), "a grading's disk is still mounted"


#: From a learner's kernel: as many requests with 8 KB paths at the hub as 8 threads send in the
#: time given (the hub's API, which the server's namespace reaches), then how many were sent.
LOG_FLOOD = """
import http.client, json, os, threading, time, urllib.parse
api = urllib.parse.urlsplit(os.environ["JUPYTERHUB_API_URL"])
sent, until = [0] * 8, time.monotonic() + {seconds}

def flood(i):
    conn = http.client.HTTPConnection(api.hostname, api.port, timeout=10)
    while time.monotonic() < until:
        conn.request("GET", "/hub/no-such-page/" + "x" * 8000 + "?token=" + str(sent[i]))
        conn.getresponse().read()
        sent[i] += 1

threads = [threading.Thread(target=flood, args=(i,)) for i in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps({{"sent": sum(sent)}}))
"""


def test_18_a_flood_of_long_urls_adds_a_bounded_number_of_short_lines_to_the_hubs_log(hub):
    """From A's kernel, 8 threads send 404s with 8 KB paths at the hub for 15 s. The hub's log grows
    by at most its rate (``accesslog``: 600 bytes a second after a burst of 100 KB, about 2 MB an
    hour, each path cut at 200 characters, no query), and says once how many requests it left out,
    and whose. (Before: the red-team pass grew the log 250 MB in 20 s from one kernel; a later pass,
    at 20 lines a second, 23 MB an hour.)"""
    from multigpu.workshop import accesslog

    a, _b = learners(hub)
    before = hub.log.stat().st_size
    began = time.monotonic()
    sent = json.loads(in_kernel(hub, a, LOG_FLOOD.format(seconds=15)).strip().splitlines()[-1])["sent"]
    took = time.monotonic() - began
    time.sleep(1)
    with open(hub.log, "rb") as f:
        f.seek(before)
        added = f.read().decode(errors="replace")
    assert sent > 1000, f"the flood sent only {sent} requests: it tests nothing"
    floods = [line for line in added.splitlines() if "/hub/no-such-page/" in line]
    assert floods and all(len(line) < 450 for line in floods), max(floods or [""], key=len)[:600]
    grown = sum(len(line.encode()) + 1 for line in floods)
    assert grown < accesslog.BURST + accesslog.RATE * took + 20 * 450, \
        f"the flood's lines took {grown} bytes of the log for {sent} requests of 8 KB in {took:.0f} s"
    assert not [line for line in floods if "token" in line], "a query (where tokens travel) was logged"
    said = [line for line in added.splitlines() if "requests in the last" in line and "were not logged" in line]
    assert len(said) == 1 and "the most from: " in said[0], said  # once in a minute


#: From a learner's kernel: 400 000 empty lines, then 12 MB of 200-character lines, on the
#: server's own output (which the hub logs).
OUTPUT_FLOOD = """
import os
os.write(1, b"\\n" * 400_000)
line = b"y" * 199 + b"\\n"
for _ in range(60):
    os.write(2, line * 1000)
print("flooded")
"""


def stop_like_the_spawner(user: str) -> None:
    """Stop ``user``'s server the way JupyterHub's local spawner does: SIGINT, SIGTERM after 10 s,
    SIGKILL after 5 more."""
    import signal

    proc = server_process(user)
    for sig, wait_s in ((signal.SIGINT, 10), (signal.SIGTERM, 5), (signal.SIGKILL, 30)):
        proc.send_signal(sig)
        try:
            proc.wait(wait_s)
            return
        except psutil.TimeoutExpired:
            continue
    raise AssertionError(f"{user}'s server outlived SIGKILL")


def logged_in_again(hub: ScratchHub, user: str) -> bool:
    """``user`` logged in with a server again, once the hub has seen the last one stop (until then
    the login answers 503)."""
    from multigpu.workshop.learnerclient import LearnerError

    try:
        server(hub, user)
    except LearnerError as e:
        if "HTTP 503" in str(e):
            return False
        raise
    return True


def test_19_a_learners_server_output_fills_at_most_their_hours_budget_of_the_hubs_log_restart_or_not(hub):
    """A's kernel writes 400 000 empty lines and 12 MB of text to the server's output, then A's server
    is restarted and A writes again: the hub's log takes at most the learner's 10 MB an hour in all
    (``serverlog``; before: the empty lines alone grew it 19 times their size, and each restart gave
    a fresh 10 MB). A second copy of the course on the box with solutions learners could read is an
    empty folder in A's (restarted) server."""
    from multigpu.workshop import serverlog

    a, _b = learners(hub)
    copy = Path("/srv") / f"multigpu-copy-{uuid.uuid4().hex[:8]}"
    try:
        (copy / "solutions").mkdir(parents=True)
        (copy / "nbgrader_config.py").write_text("c = get_config()\n")
        (copy / "solutions" / "00-welcome.ipynb").write_text(SOLUTION_MARK)
        for p in (copy, copy / "solutions"):
            p.chmod(0o755)
        before = hub.log.stat().st_size
        in_kernel(hub, a, OUTPUT_FLOOD)  # the cell ends "ok" (its own output may lose lines: the kernel drops past its limit)
        stop_like_the_spawner(a)
        _SERVERS.pop(a)
        wait_for(f"{a} could not log in again", lambda: logged_in_again(hub, a), 180, hub)
        seen = json.loads(in_kernel(hub, a, f"import json, os; print(json.dumps(os.listdir({str(copy)!r})))").strip())
        assert seen == [], f"A reads another copy of the course: {seen}"
        in_kernel(hub, a, OUTPUT_FLOOD)  # the cell ends "ok" (its own output may lose lines: the kernel drops past its limit)
        time.sleep(2)
        with open(hub.log, "rb") as f:
            f.seek(before)
            added = f.read().decode(errors="replace")
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    mine = [line for line in added.splitlines() if line.startswith(f"[server of {a}]")]
    grown = sum(len(line.encode()) + 1 for line in mine)
    assert grown <= serverlog.LOG_BYTES + 4096, f"A's server wrote {grown} bytes of the hub's log"
    assert not [line for line in mine if line == f"[server of {a}] "], "an empty line was logged"
    assert sum("is not logged" in line for line in mine) == 1, "the budget's end was not said once"


def test_20_a_flood_at_a_dead_route_adds_at_most_the_proxys_budget_to_its_log(hub):
    """A route whose server is gone (a learner killed their own server; the hub notices within a
    poll): every request to it is a 503 line in the proxy's log, with the whole URL. 8 threads send
    requests with 12 KB URLs at such a route for 15 s: the proxy's log grows at most its 10 MB an
    hour, each line cut (``serverlog`` between the proxy and its log). (Before: 37.9 MB in 15 s.)"""
    import threading
    import urllib.request

    from multigpu.running import launch
    from multigpu.workshop import serverlog

    api = f"http://127.0.0.1:{hub.env['MULTIGPU_PROXY_API_PORT']}/api/routes/user/deadroute"
    token = (hub.hub.state / "proxy-token").read_text().strip()
    add = urllib.request.Request(api, method="POST", data=json.dumps({"target": f"http://127.0.0.1:{launch.free_port()}"})
                                 .encode(), headers={"Authorization": f"token {token}"})
    urllib.request.urlopen(add, timeout=30).close()
    log = hub.hub.state / "proxy.log"
    before = log.stat().st_size if log.exists() else 0
    sent, until = [0] * 8, time.monotonic() + 15

    def flood(i: int) -> None:
        while time.monotonic() < until:
            try:
                urllib.request.urlopen(f"{hub.base}/user/deadroute/{'x' * 6000}?q={'y' * 6000}", timeout=10).close()
            except Exception:
                pass
            sent[i] += 1

    threads = [threading.Thread(target=flood, args=(i,)) for i in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        urllib.request.urlopen(urllib.request.Request(api, method="DELETE", headers={"Authorization": f"token {token}"}),
                               timeout=30).close()
    time.sleep(1)
    grown = log.stat().st_size - before
    with open(log, "rb") as f:
        f.seek(before)
        lines = f.read().decode(errors="replace").splitlines()
    assert sum(sent) > 300, f"only {sum(sent)} requests: the flood tests nothing"
    assert [line for line in lines if "deadroute" in line], "the proxy logged none of them: the test sees nothing"
    assert grown <= serverlog.LOG_BYTES + 4096 and all(len(line) <= 2100 for line in lines), (grown, max(map(len, lines)))


#: From a learner's kernel: 100 threads log in as another learner with wrong passwords for
#: {seconds} s, each POST claiming a made-up sender in X-Forwarded-For.
LOGIN_FLOOD = """
import http.client, json, os, random, re, threading, time, urllib.parse
api = urllib.parse.urlsplit(os.environ["JUPYTERHUB_API_URL"])
tried, until, status, slowest = [0] * 100, time.monotonic() + {seconds}, {{}}, [0.0]

def flood(i):
    while time.monotonic() < until:
        claimed = f"10.9.{{i}}.{{random.randint(1, 254)}}"  # the same for the form and its POST (xsrf)
        conn = http.client.HTTPConnection(api.hostname, api.port, timeout=120)
        conn.request("GET", "/hub/login", headers={{"X-Forwarded-For": claimed}})
        page = conn.getresponse()
        body = page.read().decode(errors="replace")
        cookies = "; ".join(v.split(";")[0] for k, v in page.getheaders() if k.lower() == "set-cookie")
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', body)
        conn.request("POST", "/hub/login", body=f"_xsrf={{xsrf.group(1) if xsrf else ''}}&username={victim}&password=wrong{{i}}",
                     headers={{"Content-Type": "application/x-www-form-urlencoded", "Cookie": cookies,
                              "X-Forwarded-For": claimed}})
        began = time.monotonic()
        answer = conn.getresponse()
        answer.read()
        conn.close()
        tried[i] += 1
        status[answer.status] = status.get(answer.status, 0) + 1
        slowest[0] = max(slowest[0], time.monotonic() - began)

threads = [threading.Thread(target=flood, args=(i,)) for i in range(100)]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps({{"tried": sum(tried), "status": status, "slowest_s": round(slowest[0], 1)}}))
"""


def test_21_a_flood_of_wrong_logins_from_a_learners_server_delays_no_one_elses_login(hub):
    """A's kernel sends 100 wrong-password logins at once, in B's name, for 40 s, each claiming
    another sender. PAM takes about 2 s to refuse each, on the authenticator's threads: before, A's
    flood held them all and another's login waited 2 minutes (fifth red-team pass). Now a source has
    2 checks running and 20 waiting at most (``loginlimit``; A's server reaches the hub from an
    address of its own, whatever X-Forwarded-For says): B logs in meanwhile, in seconds, with no
    lockout of B's name."""
    import threading

    from multigpu.workshop.learnerclient import Learner

    a, b = learners(hub)
    server(hub, a)
    before = hub.log.stat().st_size
    out: list[str] = []
    flood = threading.Thread(target=lambda: out.append(in_kernel(hub, a, LOGIN_FLOOD.format(seconds=45, victim=b))))
    flood.start()
    for _ in range(60):  # until the flood's logins are refused, so that they fill whatever queue there is
        with open(hub.log, "rb") as f:
            f.seek(before)
            if f.read().count(f"Failed login for {b}".encode()) >= 5:
                break
        time.sleep(1)
    time.sleep(3)
    began = time.monotonic()
    Learner(hub.base, b, hub.learners[b]).login()
    took = time.monotonic() - began
    flood.join(180)
    assert out, "A's flood did not finish"
    said = json.loads(out[0].strip().splitlines()[-1])
    tried = said["tried"]
    assert took < 10, f"B's login took {took:.1f} s during A's flood of wrong logins: {said}"
    assert tried > 200, f"A's flood made only {tried} attempts: it tests nothing ({said})"
    print("A's flood:", said, f"B's login: {took:.1f} s")
