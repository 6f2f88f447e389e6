"""The grading service of a workshop hub (JupyterHub starts it: ``hubconfig``; by hand: ``python -m
multigpu.workshop.service``). Every few seconds it looks for new submissions in nbgrader's exchange
(the file exchange's inbound folder on one box and each learner's own, :mod:`inbound`, each entry
checked on its own and copied as it arrived: :mod:`submissions`; ngshare on Kubernetes) and records
each in the queue on disk (:mod:`jobs`); one at a time, learners in turn, it grades a job in a child
process on the grading cores, in a control group whose leftovers are killed when it ends (``multigpu
workshop grade-job ID``, bounded by ``MULTIGPU_GRADING_TIMEOUT``), or, with ``MULTIGPU_GRADING_SLURM=1``,
hands the jobs to a Slurm cluster, several at once (:mod:`slurmgrading`). Its page (``/services/grading/``,
behind the hub's login: :mod:`gradingpage`) shows a learner their own submissions, an instructor every
learner's.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from typing import Any, NamedTuple

from multigpu.workshop import (
    accesslog,
    accounts,
    disks,
    gradingpage,
    inbound,
    issuer,
    jobs,
    layout,
    limits,
    ngshare,
    safefiles,
    slurmgrading,
    submissions,
)
from multigpu.workshop.layout import Hub

SCAN_S = 2.0
#: The longest one grading may take before it is stopped (an official grading is about 3 min on
#: the 2-core machine; a lab's autograde runs its notebook once).
GRADING_TIMEOUT_S = 3600


#: The grading child process now running (at most one), so a stop of the service stops it too.
RUNNING: dict[int, Any] = {}
#: Set by :func:`halt` before it kills the grading under way: that job stays ``running`` in the
#: queue (graded again at the next start), not ``failed`` as a grading that died by itself.
STOPPING = threading.Event()


def grading_cores() -> set[int] | None:
    given = os.environ.get("MULTIGPU_GRADING_CORES_LIST")
    return {int(c) for c in given.split(",")} if given else None


#: Entries of one account that are not submissions, recorded at most; the later ones are removed
#: unread (a learner's flood of folders neither fills the queue's records nor slows every scan).
JUNK_PER_ACCOUNT = 100


def scan(hub: Hub, queue: jobs.Queue, source: ngshare.Ngshare | None = None,
         seen: set[str] | None = None) -> list[jobs.Job]:
    """Record every new submission, in the exchange's inbound folder or in ngshare (``source``:
    ngshare names each submitter by their hub token); returns the new jobs. ``seen``: the names
    already recorded (the scanner keeps it across scans; default: read from the queue). At most
    :data:`submissions.SCAN_BATCH` new entries a scan; past :data:`JUNK_PER_ACCOUNT` entries of one
    account that are not graded (not submissions, submissions refused or replaced before a grading), that
    account's next such entries are removed unread, counted for the instructor's page."""
    seen = queue.seen() if seen is None else seen
    if source is not None:
        return scan_ngshare(queue, source, seen)
    if not hub.inbound.is_dir():
        return []
    assignments = submissions.released(hub)
    arrivals: list[Arrived] = []
    folders = [("", os.open(hub.inbound, safefiles.DIR_FLAGS)), *inbound.learners_folders(hub)]
    try:
        for login, folder in folders:
            try:
                arrivals += arrivals_in(queue, folder, assignments, seen)
            except Exception as e:  # one learner's folder never stops the scan of the others
                print(f"grading service: {login or 'the'} inbound folder: {e!r}", flush=True)
        return take_arrivals(hub, queue, arrivals, seen)
    finally:
        for _, folder in folders:
            os.close(folder)


class Arrived(NamedTuple):
    """A settled submission: its name's parts, its folder's descriptor and the inbound folder's."""

    arrival: submissions.Arrival
    fd: int
    inbound: int


def arrivals_in(queue: jobs.Queue, folder: int, assignments: set[str], seen: set[str]) -> list[Arrived]:
    """The settled new submissions of one inbound folder (the box's, or a learner's own: :mod:`inbound`)."""
    arrivals = []
    with os.scandir(folder) as entries:
        names = submissions.pick(entries, seen)
    for name in names:
        try:
            arrival, fd = submissions.check(folder, name, assignments)
        except submissions.NotASubmission as e:
            try:
                not_a_submission(queue, folder, name, str(e), seen)
            except Exception as e:  # an entry that cannot even be removed: the next ones go on
                print(f"grading service: {name!a}: {e!r}", flush=True)
                seen.add(name)
            continue
        if submissions.settled(fd, time.time()):
            arrivals.append(Arrived(arrival, fd, folder))
        else:  # still being written: the next scan looks again
            os.close(fd)
    return arrivals


def past_share(queue: jobs.Queue, login: str) -> bool:
    """Whether ``login`` has had :data:`JUNK_PER_ACCOUNT` entries recorded that were not graded."""
    return queue.ignored_by(login) + queue.refused_of(login) >= JUNK_PER_ACCOUNT


def drop(queue: jobs.Queue, owner: str, inbound_fd: int, name: str, seen: set[str]) -> None:
    """Remove an entry past its account's share, counted for the instructor's page but not recorded
    (or, where it cannot be removed, never look at it again)."""
    try:
        safefiles.remove_entry(inbound_fd, name)
    except OSError:
        seen.add(name)
    queue.dropped(owner)


def not_a_submission(queue: jobs.Queue, inbound: int, name: str, why: str, seen: set[str]) -> None:
    """Record an inbound entry that is not graded, or remove it past its account's share of them."""
    owner = submissions.owner_of(inbound, name)
    if past_share(queue, owner):
        drop(queue, owner, inbound, name, seen)
        return
    queue.ignore(name, owner, why)
    seen.add(name)
    print(f"grading service: not graded: {name!a} (made by {owner}): {why}", flush=True)


def take_arrivals(hub: Hub, queue: jobs.Queue, arrivals: list[Arrived], seen: set[str]) -> list[jobs.Job]:
    """Queue the latest arrival of each learner and assignment (its copy taken: a refused one
    fails with the reason), record the earlier ones as replaced unread. Past the learner's share of
    entries not graded, both are removed and counted (:func:`drop`), and so is a new submission while
    one of the same assignment still waits (it stays queued); closes the submissions' descriptors."""
    latest: dict[tuple[str, str], Arrived] = {}
    new: list[jobs.Job] = []
    for now in sorted(arrivals, key=lambda a: a.arrival.timestamp):
        earlier = latest.pop((now.arrival.student, now.arrival.assignment), None)
        latest[(now.arrival.student, now.arrival.assignment)] = now
        if earlier is not None:
            os.close(earlier.fd)
            a = earlier.arrival
            if past_share(queue, a.student):
                drop(queue, a.student, earlier.inbound, a.name, seen)
                continue
            queue.add(a.name, a.student, a.assignment, a.timestamp,
                      state="replaced", message="a later submission of the same assignment arrived with it")
            seen.add(a.name)
    for arrival, fd, folder in latest.values():
        with safefiles.opened(fd):
            if past_share(queue, arrival.student) and queue.waiting_of(arrival.student, arrival.assignment):
                drop(queue, arrival.student, folder, arrival.name, seen)  # the waiting one stays: no row more
                continue
            try:
                submissions.take(hub, arrival, fd)
                job = queue.add(arrival.name, arrival.student, arrival.assignment, arrival.timestamp)
            except (safefiles.Refused, OSError) as e:
                if past_share(queue, arrival.student):
                    drop(queue, arrival.student, folder, arrival.name, seen)
                    continue
                why = (f"{e}" if isinstance(e, safefiles.Refused) else  # changed under the copy: this learner's alone
                       f"the submission could not be copied ({e.strerror})")
                job = queue.add(arrival.name, arrival.student, arrival.assignment, arrival.timestamp, state="failed",
                                message=f"not graded: {why}. Submit again from the Assignments tab.")
        seen.add(arrival.name)
        new.append(job)
        for old in queue.jobs(arrival.student):
            if old.state == "replaced":
                submissions.forget(hub, old.submission)
    return new


def scan_ngshare(queue: jobs.Queue, source: ngshare.Ngshare, seen: set[str]) -> list[jobs.Job]:
    """ngshare's submissions of released assignments (it keeps each as it was sent)."""
    assignments = set(source.assignments())
    new = []
    for s in source.submissions():
        if s.name in seen:
            continue
        seen.add(s.name)
        if not submissions.valid_parts(s.student, s.assignment) or s.assignment not in assignments:
            queue.ignore(s.name, s.student, "not a released assignment's submission")
            continue
        new.append(queue.add(s.name, s.student, s.assignment, s.timestamp))
    return new


def confine_job(group: str, cores: set[int] | None) -> None:
    """In a grading job's child, before the grading starts: every process of the job in the
    control group ``group``, on the grading cores, its processes and its memory bounded
    (``limits.grading_limits``, ``limits.grading_job_memory``)."""
    pids, _step_memory = limits.grading_limits()
    limits.confine(group, os.getpid(), cores=sorted(cores or os.sched_getaffinity(0)), pids_limit=pids,
                   mem_limit=limits.grading_job_memory())


def grade_one(hub: Hub, queue: jobs.Queue, job: jobs.Job, timeout: float = GRADING_TIMEOUT_S) -> jobs.Job:
    """Run ``job`` in its child process (pinned to the grading cores) and make sure it ends
    ``done`` or ``failed`` whatever the child did."""
    from multigpu.running import launch

    env = dict(os.environ, MULTIGPU_HUB_ROOT=str(hub.root))
    group = f"grading-{hub.tag}"
    cores = grading_cores()
    proc = launch.start([sys.executable, "-m", "multigpu.cli", "workshop", "grade-job", str(job.id)], env=env,
                        cores=cores, before_exec=lambda: confine_job(group, cores))
    RUNNING[job.id] = proc
    try:
        result = launch.supervise([proc], [f"job {job.id}"], timeout, echo=True, what=f"grading job {job.id}",
                                  raise_on_timeout=False)
    finally:
        RUNNING.pop(job.id, None)
        limits.release(group)
        limits.release(f"autograde-{hub.tag}-job-{job.id}")  # its autograde step's group (autograde.run_name), if killed in it
        disks.remove_gradings(hub, job.id)  # its file system, when the job was killed before it removed it
    after = queue.get(job.id)
    if after is not None and after.state == "running" and not STOPPING.is_set():
        code = result.returncodes[0]
        if code is None or result.timed_out:
            message = (f"the grading took longer than {timeout:.0f} s and was stopped; your submission is kept: "
                       "submit again to retry, or ask the instructor")
        else:
            tail = "\n".join(result.output[-10:])
            message = f"the grading crashed (exit {code}); your submission is kept and the instructor has been told:\n{tail}"
        queue.finish(job.id, "failed", message)
    after = queue.get(job.id)
    if after is not None and after.state in ("done", "failed"):
        submissions.forget(hub, job.submission)
    return after  # type: ignore[return-value]


async def scanner(hub: Hub, queue: jobs.Queue, source: ngshare.Ngshare | None) -> None:
    """Record new submissions every few seconds, also while a grading runs (so a learner sees
    their place in the queue at once)."""
    loop = asyncio.get_running_loop()
    seen = queue.seen()
    while True:
        try:
            await loop.run_in_executor(None, scan, hub, queue, source, seen)
        except Exception as e:
            print(f"grading service: scanning the exchange failed: {e!r}", file=sys.stderr, flush=True)
        await asyncio.sleep(SCAN_S)


async def worker(hub: Hub, queue: jobs.Queue, timeout: float) -> None:
    """The queue's one worker: take the oldest job, grade it, again."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            job = await loop.run_in_executor(None, queue.take)
            if job is None:
                await asyncio.sleep(SCAN_S)
                continue
            print(f"grading job {job.id}: {job.student} {job.assignment}", flush=True)
            done = await loop.run_in_executor(None, grade_one, hub, queue, job, timeout)
            print(f"job {job.id}: {done.state}: {done.message.splitlines()[0] if done.message else ''}", flush=True)
        except Exception as e:
            print(f"grading service error: {e!r}", file=sys.stderr, flush=True)
            await asyncio.sleep(SCAN_S)


def make_app(hub: Hub, queue: jobs.Queue) -> Any:
    from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
    from tornado import web

    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/grading/")

    def is_instructor(name: str) -> bool:
        return name in os.environ.get("MULTIGPU_HUB_INSTRUCTORS", layout.INSTRUCTOR).split(",") or \
            name in accounts.members(layout.INSTRUCTORS_GROUP)

    class Page(HubOAuthenticated, web.RequestHandler):
        @web.authenticated
        def get(self) -> None:
            name = self.get_current_user()["name"]
            self.write(gradingpage.render(hub, queue, name, is_instructor(name), prefix,
                                          gradingpage.page_number(self.get_argument("page", None))))

    class Status(HubOAuthenticated, web.RequestHandler):
        @web.authenticated
        def get(self) -> None:
            name = self.get_current_user()["name"]
            own, _ = gradingpage.shown(queue, None if is_instructor(name) else name,
                                       gradingpage.page_number(self.get_argument("page", None)))
            self.set_header("Content-Type", "application/json")
            self.write(json.dumps([dict(vars(j), place=queue.position(j)) for j in own]))

    class File(HubOAuthenticated, web.RequestHandler):
        @web.authenticated
        def get(self, job_id: str, kind: str, name: str) -> None:
            user = self.get_current_user()["name"]
            job = queue.get(int(job_id))
            if job is None or (job.student != user and not is_instructor(user)):
                raise web.HTTPError(404)
            path = gradingpage.file_for(hub, job, kind, name)
            if path is None or not path.is_file():
                raise web.HTTPError(404)
            types = {".html": "text/html", ".pdf": "application/pdf", ".json": "application/json"}
            self.set_header("Content-Type", types.get(path.suffix, "application/octet-stream"))
            self.set_header("X-Content-Type-Options", "nosniff")
            if path.suffix == ".html":  # learner-written content: shown, but as from an origin of its own, no script
                self.set_header("Content-Security-Policy", gradingpage.FEEDBACK_POLICY)
            else:
                self.set_header("Content-Disposition", f'attachment; filename="{path.name}"')
            self.write(safefiles.read_file(path.parent, path.name, max_bytes=gradingpage.MAX_FILE_BYTES))

    return web.Application([
        (prefix, Page),
        (prefix + "status", Status),
        (prefix + r"files/(\d{1,9})/(feedback|certificate)/([^/]+)", File),
        (prefix + "oauth_callback", HubOAuthCallbackHandler),
        *issuer.handlers(hub, prefix),
    ], cookie_secret=os.urandom(32), log_function=accesslog.BoundedLog())


def halt(signum: int) -> None:
    """Kill the grading under way because the service stops: its job stays ``running`` in the
    queue, so the next start grades it again from the start (:meth:`jobs.Queue.recover`)."""
    from multigpu.running import launch

    STOPPING.set()
    launch.kill_sessions(list(RUNNING.values()))


def stop(signum: int) -> None:
    """The hub stops its services with SIGTERM: stop the grading under way with it."""
    halt(signum)
    print(f"grading service stopped (signal {signum}); jobs under way run again at the next start", flush=True)
    os._exit(128 + signum)


async def main() -> None:
    import signal
    from urllib.parse import urlparse

    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop, sig)

    hub = Hub.default()
    queue = jobs.Queue(hub.queue_db, limit=int(os.environ.get("MULTIGPU_QUEUE_LIMIT") or jobs.QUEUE_LIMIT))
    on_slurm = slurmgrading.Settings.from_env(GRADING_TIMEOUT_S)  # None: graded here, one at a time
    if on_slurm is None and disks.remove_gradings(hub):  # on Slurm, the nodes' gradings are not this box's
        print("grading service: removed the file systems of gradings cut off by a stop", flush=True)
    for job in queue.recover(keep_slurm=on_slurm is not None):
        print(f"job {job.id} ({job.student} {job.assignment}) was cut off by a restart: queued again", flush=True)
    source = ngshare.Ngshare.from_env()
    print(f"reading submissions from {source.url if source else hub.inbound}", flush=True)
    url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", f"http://127.0.0.1:{layout.GRADING_PORT}"))
    app = make_app(hub, queue)
    accesslog.bound_loggers(("tornado.application", "tornado.general"))  # an uncaught exception's line holds the URL
    app.listen(url.port, url.hostname)
    print(f"grading service on {url.geturl()}, grading on cores {os.environ.get('MULTIGPU_GRADING_CORES_LIST', 'any')}",
          flush=True)
    await asyncio.gather(scanner(hub, queue, source),
                         slurmgrading.worker(hub, queue, on_slurm) if on_slurm else
                         worker(hub, queue, float(os.environ.get("MULTIGPU_GRADING_TIMEOUT") or GRADING_TIMEOUT_S)))


if __name__ == "__main__":
    asyncio.run(main())
