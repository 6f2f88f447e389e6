"""The room load test: ``make hub-load LEARNERS=30`` (``multigpu workshop load --learners 30``).

A scratch hub (``scratch``: temporary root, tagged accounts, free ports, removed at the end) gets
N real learner accounts and an instructor, who releases Lab 0. Then, the way a room does it:

1. one learner alone logs in, runs Lab 0's first check (the notebook's code cells up to the first
   that asserts, read from ``solutions/``) in a kernel through its websocket, and logs out: the
   cell's time alone;
2. the N learners log in through the hub's login form within ``--within`` seconds (evenly spread),
   each server spawns (``spawnqueue`` queues them), each loads JupyterLab: login-to-ready;
3. when every server is up (or failed), every kernel runs the same check at the same moment: the
   cell's time under the room's load, and each server's memory (PSS of its processes) idle and busy;
4. each learner fetches Lab 0 from the Assignments tab's API, writes the solution's answers into
   it and submits it (wave 1); with ``--restart-hub`` the hub is restarted while the first of these
   is graded; the queue drains;
5. the same N submit at once (wave 2): the queue's drain time for N Lab 0 gradings;
6. every submission must have been graded exactly once (one grading start in the service's log per
   job, after a restart two for the job it cut off), each learner's last grading is in the gradebook
   with full marks, and each learner's Fetch Feedback brings that grading's feedback home.

``--no-grading`` stops after step 3 (logins, spawns and the check under the room's load, in minutes
where the gradings of steps 4-6 take about an hour on 2 cores); its report says the gradings were
not run. The figures go to a JSON report and a Markdown table (``--report``); docs/workshop.md quotes them.
Why not Locust: the room's work is a script per learner (log in, wait for a spawn, run a cell over
a websocket, submit, fetch feedback), not a request rate to sustain; Locust would add gevent and its
own web UI to the hub's environment and measure requests per second, which is not the question.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from multigpu.workshop import jobs, memory
from multigpu.workshop.learnerclient import Learner, LearnerError
from multigpu.workshop.scratch import ScratchHub

ASSIGNMENT = "lab-00"
NOTEBOOK = "00-welcome.ipynb"


@dataclass
class LearnerRun:
    name: str
    ready_s: float | None = None
    waited_in_queue: bool = False
    cell_s: float | None = None
    idle_mb: float | None = None
    busy_mb: float | None = None
    submitted: list[str] = field(default_factory=list)  # the exchange's timestamps of their submissions
    error: str = ""


def check_cells(repo: Path) -> list[str]:
    """Lab 0's code cells up to and including the first check (the first with an ``assert``)."""
    import nbformat

    cells = []
    for cell in nbformat.read(repo / "solutions" / "notebooks" / NOTEBOOK, as_version=4).cells:
        if cell.cell_type == "code":
            cells.append(cell.source)
            if "assert " in cell.source:
                return cells
    raise ValueError(f"{NOTEBOOK} has no check cell (a code cell with an assert)")


def solution_answers(repo: Path) -> dict[str, str]:
    import nbformat

    nb = nbformat.read(repo / "solutions" / "notebooks" / NOTEBOOK, as_version=4)
    return {c.metadata["nbgrader"]["grade_id"]: c.source for c in nb.cells
            if c.get("metadata", {}).get("nbgrader", {}).get("solution")}


def run_check(learner: Learner, cells: list[str]) -> float:
    """Run the check cells in a new kernel (once it answers); their time from the first request
    to the last reply."""
    kernel = learner.start_kernel()
    learner.execute(kernel, "pass")
    start = time.monotonic()
    for source in cells:
        out = learner.execute(kernel, source)
        if out.status != "ok":
            raise LearnerError(f"{learner.name}: Lab 0's check failed: {out.error}\n{out.output[-500:]}")
    return round(time.monotonic() - start, 2)


def fill_in(learner: Learner, answers: dict[str, str]) -> None:
    """Write the solution's answers into the learner's fetched notebook (what they would type)."""
    path = f"api/contents/{ASSIGNMENT}/{NOTEBOOK}"
    nb = learner.api("GET", path)["content"]
    for cell in nb["cells"]:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if cell.get("metadata", {}).get("nbgrader", {}).get("solution") and grade_id in answers:
            cell["source"] = answers[grade_id]
    learner.api("PUT", path, json={"type": "notebook", "format": "json", "content": nb})


def submit(learner: Learner, run: LearnerRun) -> None:
    listing = learner.assignment("submit", ASSIGNMENT)
    stamps = [s["timestamp"] for a in listing if a.get("assignment_id") == ASSIGNMENT
              for s in a.get("submissions", []) if s.get("timestamp")]
    run.submitted.append(max(stamps) if stamps else "")


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))], 2)


def spread(values: list[float]) -> dict[str, float | None]:
    return {"median": round(statistics.median(values), 2) if values else None, "p95": pct(values, 0.95),
            "max": round(max(values), 2) if values else None, "n": len(values)}


def say(message: str) -> None:
    """A progress line on stderr: the run takes most of an hour at 30 learners."""
    print(f"[room load {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@dataclass
class Room:
    hub: ScratchHub
    repo: Path
    within: float
    restart_hub: bool
    runs: dict[str, LearnerRun] = field(default_factory=dict)
    grading: bool = True  # False: steps 1-3 alone (no fetch, no submission)
    learners: dict[str, Learner] = field(default_factory=dict)
    events: dict[str, Any] = field(default_factory=dict)
    go: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    arrived: int = 0

    def learner(self, name: str) -> Learner:
        return Learner(self.hub.base, name, self.hub.learners[name], verify=self.hub.verify)

    def alone(self, name: str, cells: list[str]) -> dict[str, Any]:
        """One learner alone: login-to-ready, the check's time, the server's memory."""
        solo = self.learner(name)
        t0 = time.monotonic()
        solo.login()
        solo.wait_ready()
        ready = time.monotonic() - t0
        cell = run_check(solo, cells)
        idle = memory.user_pss_mb([name]).get(name)
        solo.stop_server()
        return {"ready_s": round(ready, 2), "cell_s": cell, "idle_mb": idle}

    def arrive(self, name: str, start_at: float, cells: list[str], answers: dict[str, str]) -> None:
        """One learner of the room, from the login form to the wave-1 submission."""
        run, learner = self.runs[name], self.learner(name)
        self.learners[name] = learner
        try:
            time.sleep(max(0.0, start_at - time.monotonic()))
            t0 = time.monotonic()
            learner.login()
            messages = learner.wait_ready()
            run.ready_s = round(time.monotonic() - t0, 2)
            run.waited_in_queue = any(m.startswith("Waiting to start") for m in messages)
            kernel = learner.start_kernel()
            learner.execute(kernel, "pass")  # the notebook opened: its kernel answers
        except Exception as e:  # every failure is a finding of the test, kept in the report
            run.error = f"spawn: {e!r}"
            return
        finally:
            with self.lock:
                self.arrived += 1
        self.go.wait()
        try:
            start = time.monotonic()
            for source in cells:
                out = learner.execute(kernel, source)
                if out.status != "ok":
                    raise LearnerError(f"Lab 0's check failed: {out.error}")
            run.cell_s = round(time.monotonic() - start, 2)
            if not self.grading:
                return
            learner.assignment("fetch", ASSIGNMENT)
            fill_in(learner, answers)
            submit(learner, run)
        except Exception as e:
            run.error = f"cell or submit: {e!r}"

    def storm(self, cells: list[str], answers: dict[str, str]) -> None:
        """Steps 2-4: the logins, the check at one moment, the first submissions."""
        names = sorted(self.runs)
        t0 = time.monotonic()
        self.events["storm_load_before"] = load_average()
        threads = [threading.Thread(target=self.arrive, args=(n, t0 + i * self.within / max(1, len(names)), cells, answers),
                                    daemon=True) for i, n in enumerate(names)]
        for t in threads:
            t.start()
        said = time.monotonic()
        while self.arrived < len(names):
            time.sleep(0.5)
            if time.monotonic() - said >= 15:
                said = time.monotonic()
                say(f"{self.arrived} of {len(names)} learners logged in with their server ready (or failed)")
        self.events["all_ready_s"] = round(time.monotonic() - t0, 2)
        ok = [n for n in names if not self.runs[n].error]
        for n, mb in memory.user_pss_mb(ok).items():
            self.runs[n].idle_mb = mb
        self.events["used_gb_idle"] = memory.system_used_gb()
        with memory.PeakSampler(ok) as sampler:
            self.go.set()
            self.watch_wave(threads)
        for n, mb in sampler.peaks.items():
            self.runs[n].busy_mb = mb

    def watch_wave(self, threads: list[threading.Thread]) -> None:
        """Wait for the threads (restarting the hub once, :meth:`maybe_restart`)."""
        while any(t.is_alive() for t in threads):
            self.maybe_restart()
            time.sleep(1)

    def maybe_restart(self) -> None:
        """With ``--restart-hub``: restart the hub once, when a grading has run for 5 s."""
        if not self.restart_hub or "restart" in self.events:
            return
        running = [j for j in jobs.Queue(self.hub.hub.queue_db).jobs() if j.state == "running"]
        if running and time.time() - (running[0].started or 0) > 5:
            self.restart(running[0])

    def restart(self, job: jobs.Job) -> None:
        proxy = self.hub.proxy_pid()
        t0 = time.monotonic()
        self.hub.restart()
        self.events["restart"] = {"during_job": job.id, "hub_down_s": round(time.monotonic() - t0, 2),
                                  "proxy_kept": proxy is not None and self.hub.proxy_pid() == proxy}

    def drain(self, expected: int, timeout: float) -> float:
        """Seconds until ``expected`` jobs of the room's learners have finished (done or failed) or
        were replaced (a job of anyone else, which a learner of another hub on the box may make, is
        not the room's)."""
        queue = jobs.Queue(self.hub.hub.queue_db)
        t0 = said = time.monotonic()
        while time.monotonic() - t0 < timeout:
            self.maybe_restart()
            finished = sum(j.state in ("done", "failed", "replaced") for j in queue.jobs() if j.student in self.runs)
            if finished >= expected:
                return round(time.monotonic() - t0, 2)
            if time.monotonic() - said >= 60:
                said = time.monotonic()
                say(f"{finished} of {expected} gradings finished ({time.monotonic() - t0:.0f} s)")
            time.sleep(1)
        raise LearnerError(f"the grading queue did not drain {expected} jobs within {timeout:.0f} s: "
                           f"{[(j.student, j.state) for j in queue.jobs()]}")

    def wave2(self) -> None:
        """Step 5: every learner who submitted once submits again, at the same moment."""
        ready = [n for n, r in self.runs.items() if r.submitted]
        go = threading.Event()

        def again(name: str) -> None:
            go.wait()
            try:
                submit(self.learners[name], self.runs[name])
            except Exception as e:
                self.runs[name].error = f"wave 2 submit: {e!r}"

        threads = [threading.Thread(target=again, args=(n,), daemon=True) for n in ready]
        for t in threads:
            t.start()
        time.sleep(1)
        self.events["wave2_at"] = time.time()
        go.set()
        for t in threads:
            t.join(600)


def summary(room: Room, alone: dict[str, Any], drains: dict[str, float]) -> dict[str, Any]:
    runs = list(room.runs.values())
    ready = [r.ready_s for r in runs if r.ready_s is not None]
    cells = [r.cell_s for r in runs if r.cell_s is not None]
    return {
        "learners": len(runs), "within_s": room.within, "alone": alone,
        "login_to_ready_s": spread(ready), "failed_spawns": sum(r.error.startswith("spawn") for r in runs),
        "waited_in_spawn_queue": sum(r.waited_in_queue for r in runs),
        "cell_s": spread(cells),
        "cell_slowdown": round(statistics.median(cells) / alone["cell_s"], 2) if cells and alone.get("cell_s") else None,
        "idle_mb": spread([r.idle_mb for r in runs if r.idle_mb is not None]),
        "busy_mb": spread([r.busy_mb for r in runs if r.busy_mb is not None]),
        "drain_s": drains, "events": room.events, "errors": {r.name: r.error for r in runs if r.error},
        "runs": [asdict(r) for r in runs],
    }
