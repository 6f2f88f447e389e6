"""The grading service of a workshop hub (JupyterHub starts it: ``hubconfig``; run by hand with
``python -m multigpu.workshop.service``).

Every few seconds it looks for new submissions in nbgrader's exchange (the file exchange's
inbound folder on one box; ngshare on Kubernetes, :mod:`ngshare`) and records each one in the
queue on disk (:mod:`jobs`); one at a time, it grades the oldest in a child process pinned to
the cores kept for grading (``multigpu workshop grade-job ID`` through ``multigpu.running.launch``,
bounded by ``MULTIGPU_GRADING_TIMEOUT``). Its page (``/services/grading/``, behind the hub's
login) shows a learner their own submissions only: place in the queue, state, scores, the
grader's report, feedback and certificate; an instructor sees every learner's.
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

from multigpu.workshop import accounts, grading, issuer, jobs, layout, ngshare
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


def scan(hub: Hub, queue: jobs.Queue, source: ngshare.Ngshare | None = None) -> list[jobs.Job]:
    """Record every new submission, in the exchange's inbound folder or in ngshare (``source``:
    ngshare names each submitter by their hub token); returns the new jobs."""
    if source is not None:
        return [queue.add(s.name, s.student, s.assignment, s.timestamp)
                for s in source.submissions() if not queue.known(s.name)]
    new: list[jobs.Job] = []
    if not hub.inbound.is_dir():
        return new
    for entry in sorted(os.scandir(hub.inbound), key=lambda e: e.name):
        if not entry.is_dir(follow_symlinks=False) or queue.known(entry.name):
            continue
        parsed = grading.parse_submission(entry.name)
        if parsed is None:
            continue
        student, assignment, stamp = parsed
        if not grading.submitter_matches(Path(entry.path), student):
            new.append(queue.add(entry.name, student, assignment, stamp, state="failed",
                                 message=f"a submission in the name of {student!r} was made by another account: not graded"))
            continue
        new.append(queue.add(entry.name, student, assignment, stamp))
    return new


def grade_one(hub: Hub, queue: jobs.Queue, job: jobs.Job, timeout: float = GRADING_TIMEOUT_S) -> jobs.Job:
    """Run ``job`` in its child process (pinned to the grading cores) and make sure it ends
    ``done`` or ``failed`` whatever the child did."""
    from multigpu.running import launch

    env = dict(os.environ, MULTIGPU_HUB_ROOT=str(hub.root))
    proc = launch.start([sys.executable, "-m", "multigpu.cli", "workshop", "grade-job", str(job.id)], env=env,
                        cores=grading_cores())
    RUNNING[job.id] = proc
    try:
            result = launch.supervise([proc], [f"job {job.id}"], timeout, echo=True, what=f"grading job {job.id}",
                                  raise_on_timeout=False)
    finally:
        RUNNING.pop(job.id, None)
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
    return queue.get(job.id)  # type: ignore[return-value]


async def scanner(hub: Hub, queue: jobs.Queue, source: ngshare.Ngshare | None) -> None:
    """Record new submissions every few seconds, also while a grading runs (so a learner sees
    their place in the queue at once)."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            await loop.run_in_executor(None, scan, hub, queue, source)
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


# ------------------------------------------------------------------------------------ the page
STYLE = ("body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
         "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}"
         "pre{white-space:pre-wrap;background:#f6f6f6;padding:.5em}.failed{color:#a00}.done{color:#060}")


def render(hub: Hub, queue: jobs.Queue, user: str, instructor: bool, prefix: str) -> str:
    """The page for ``user``: their own jobs (every job for an instructor)."""
    shown = queue.jobs(None if instructor else user)
    rows = []
    for job in shown:
        place = queue.position(job)
        state = job.state + (f" (place {place} in the queue)" if place else "")
        detail = html.escape(job.message)
        res = job.result or {}
        links = []
        feedback = hub.course / "feedback" / job.student / job.assignment
        if job.state == "done" and feedback.is_dir():
            links += [f'<a href="{prefix}files/{job.id}/feedback/{html.escape(p.name)}">{html.escape(p.stem)} feedback</a>'
                      for p in sorted(feedback.glob("*.html"))]
        cert = res.get("certificate")
        if cert:
            links += [f'<a href="{prefix}files/{job.id}/certificate/{kind}">certificate ({kind})</a>' for kind in ("pdf", "json")]
        report = f"<pre>{html.escape(res['report'])}</pre>" if res.get("report") else ""
        rows.append(f"<tr><td>{job.id}</td><td>{html.escape(job.student)}</td><td>{html.escape(job.assignment)}</td>"
                    f"<td>{html.escape(job.submitted)}</td><td class='{job.state}'>{html.escape(state)}</td>"
                    f"<td>{detail}{report}{''.join(f'<p>{link}</p>' for link in links)}</td></tr>")
    waiting = queue.count("queued") + queue.count("held")
    running = queue.count("running")
    head = (f"<h1>Grading</h1><p>Signed in as <b>{html.escape(user)}</b>"
            f"{' (instructor: every learner)' if instructor else ''}. {running} grading now, {waiting} waiting. "
            "Submit from JupyterLab's Assignments tab; this page refreshes every 10 s. A new submission of the "
            "same assignment replaces one still waiting.</p>")
    table = ("<table><tr><th>#</th><th>learner</th><th>assignment</th><th>submitted</th><th>state</th><th>result</th></tr>"
             + "".join(rows) + "</table>") if rows else "<p>No submissions yet.</p>"
    return (f"<!doctype html><html><head><meta charset='utf-8'><meta http-equiv='refresh' content='10'>"
            f"<title>Grading</title><style>{STYLE}</style></head><body>{head}{table}</body></html>")


def file_for(hub: Hub, job: jobs.Job, kind: str, name: str) -> Path | None:
    """The feedback page or certificate file of ``job`` named by a URL, or None."""
    if kind == "feedback":
        folder = hub.course / "feedback" / job.student / job.assignment
        path = folder / name
        return path if path.parent == folder and path.suffix == ".html" and path.is_file() else None
    if kind == "certificate" and job.result and job.result.get("certificate") and name in ("pdf", "json"):
        return Path(job.result["certificate"][name])
    return None


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
            self.write(render(hub, queue, name, is_instructor(name), prefix))

    class Status(HubOAuthenticated, web.RequestHandler):
        @web.authenticated
        def get(self) -> None:
            name = self.get_current_user()["name"]
            own = queue.jobs(None if is_instructor(name) else name)
            self.set_header("Content-Type", "application/json")
            self.write(json.dumps([dict(vars(j), place=queue.position(j)) for j in own]))

    class File(HubOAuthenticated, web.RequestHandler):
        @web.authenticated
        def get(self, job_id: str, kind: str, name: str) -> None:
            user = self.get_current_user()["name"]
            job = queue.get(int(job_id))
            if job is None or (job.student != user and not is_instructor(user)):
                raise web.HTTPError(404)
            path = file_for(hub, job, kind, name)
            if path is None or not path.is_file():
                raise web.HTTPError(404)
            types = {".html": "text/html", ".pdf": "application/pdf", ".json": "application/json"}
            self.set_header("Content-Type", types.get(path.suffix, "application/octet-stream"))
            if path.suffix != ".html":
                self.set_header("Content-Disposition", f'attachment; filename="{path.name}"')
            self.write(path.read_bytes())

    return web.Application([
        (prefix, Page),
        (prefix + "status", Status),
        (prefix + r"files/(\d+)/(feedback|certificate)/([^/]+)", File),
        (prefix + "oauth_callback", HubOAuthCallbackHandler),
        *issuer.handlers(hub, prefix),
    ], cookie_secret=os.urandom(32))


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
    for job in queue.recover():
        print(f"job {job.id} ({job.student} {job.assignment}) was cut off by a restart: queued again", flush=True)
    source = ngshare.Ngshare.from_env()
    print(f"reading submissions from {source.url if source else hub.inbound}", flush=True)
    url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:8010"))
    app = make_app(hub, queue)
    app.listen(url.port, url.hostname)
    print(f"grading service on {url.geturl()}, grading on cores {os.environ.get('MULTIGPU_GRADING_CORES_LIST', 'any')}",
          flush=True)
    await asyncio.gather(scanner(hub, queue, source),
                         worker(hub, queue, float(os.environ.get("MULTIGPU_GRADING_TIMEOUT") or GRADING_TIMEOUT_S)))


if __name__ == "__main__":
    asyncio.run(main())
