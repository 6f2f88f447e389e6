"""The room load test's verdict and report (``roomload`` runs the room; this checks what came out
and writes it down), and ``multigpu workshop load``'s entry point.

Graded exactly once means, for every submission a learner made: one job in the queue, ``done``
(``replaced`` only for one superseded by the same learner's later submission before it ran), and
as many grading starts in the service's own log as the queue says it made: one, or two for a job
the hub's restart cut off; the gradebook holds one Lab 0 submission per learner with full marks
(the answers were the solution's); and the learner's Fetch Feedback brings home the feedback of
every one of their submissions that was graded.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from multigpu.workshop import jobs, memory, roomload
from multigpu.workshop.learnerclient import LearnerError

#: Submissions each learner makes (wave 1 when done, wave 2 all at once).
WAVES = 2
#: Seconds one Lab 0 grading may take in the drain's bound (the busy 2-core box took up to 173 s).
GRADING_BOUND_S = 300


def grading_starts(log: str) -> dict[int, int]:
    """How often the grading service started each job (its ``grading job N:`` lines)."""
    starts: dict[int, int] = {}
    for m in re.finditer(r"^grading job (\d+): ", log, re.M):
        starts[int(m.group(1))] = starts.get(int(m.group(1)), 0) + 1
    return starts


def graded_once(hub: Any, runs: dict[str, Any], cut: int | None = None) -> dict[str, Any]:
    """Check every submission of ``runs`` (see the module doc; ``cut``: the job a hub restart cut
    off, the one allowed two starts); ``{"ok", "problems", ...}``."""
    from nbgrader.api import Gradebook, MissingEntry

    problems: list[str] = []
    queue = jobs.Queue(hub.hub.queue_db)
    starts = grading_starts(hub.log.read_text(errors="replace"))
    by_stamp = {(j.student, j.submitted): j for j in queue.jobs()}
    for name, run in runs.items():
        if len(run.submitted) != WAVES:
            problems.append(f"{name} submitted {len(run.submitted)} time(s), not {WAVES}: {run.error or 'no error recorded'}")
        for i, stamp in enumerate(run.submitted):
            job = by_stamp.get((name, stamp))
            last = i == len(run.submitted) - 1
            if job is None:
                problems.append(f"{name}'s submission {stamp} never reached the queue")
            elif job.state == "replaced" and not last:
                continue
            elif job.state != "done":
                problems.append(f"{name}'s submission {stamp}: {job.state}: {job.message[:200]}")
            elif starts.get(job.id, 0) != job.attempts or job.attempts != (2 if job.id == cut else 1):
                problems.append(f"{name}'s submission {stamp} (job {job.id}) was started {starts.get(job.id, 0)} "
                                f"time(s), the queue counts {job.attempts}")
    with Gradebook(hub.hub.db_url) as gb:
        for name, run in runs.items():
            if not run.submitted:
                continue
            try:
                sub = gb.find_submission(roomload.ASSIGNMENT, name)
                if not sub.max_score or sub.score != sub.max_score:
                    problems.append(f"{name}: {sub.score}/{sub.max_score} in the gradebook, not full marks")
            except MissingEntry:
                problems.append(f"{name}: no Lab 0 submission in the gradebook")
    return {"ok": not problems, "problems": problems, "jobs": len(queue.jobs()),
            "starts": sum(starts.values()), "restarted_job": cut}


def feedback_home(room: roomload.Room) -> list[str]:
    """Each learner's Fetch Feedback, then the feedback folders it brought: one per graded
    submission (nbgrader names them by the submission's timestamp). Returns the problems."""
    problems = []
    queue = jobs.Queue(room.hub.hub.queue_db)
    for name, run in room.runs.items():
        if not run.submitted or name not in room.learners:
            continue
        learner = room.learners[name]
        graded = [j.submitted for j in queue.jobs(name) if j.state == "done"]
        try:
            learner.assignment("fetch_feedback", roomload.ASSIGNMENT)
            listing = learner.api("GET", f"api/contents/{roomload.ASSIGNMENT}/feedback")["content"]
            folders = {f["name"] for f in listing}
        except (LearnerError, OSError, KeyError, TypeError) as e:
            problems.append(f"{name}: Fetch Feedback failed: {e}")
            continue
        missing = [s for s in graded if s not in folders]
        if missing:
            problems.append(f"{name}: no feedback for the graded submission(s) {missing} (got {sorted(folders)})")
    return problems


def fmt(spread: dict[str, Any], unit: str = "s") -> str:
    if not spread or spread.get("median") is None:
        return "n/a"
    return f"{spread['median']} / {spread['p95']} / {spread['max']} {unit} (n={spread['n']})"


def markdown(r: dict[str, Any]) -> str:
    """The report as a Markdown table (docs/workshop.md quotes it)."""
    g, alone, ev = r["graded_once"], r["alone"], r["events"]
    rows = [
        ("learners, logins spread over", f"{r['learners']}, {r['within_s']} s (spawn limit {r['settings']['spawn_limit']})"),
        ("login to JupyterLab ready: median / p95 / max", fmt(r["login_to_ready_s"])),
        ("failed spawns; waited in the spawn queue", f"{r['failed_spawns']}; {r['waited_in_spawn_queue']}"),
        ("one learner alone: login to ready; Lab 0 check", f"{alone['ready_s']} s; {alone['cell_s']} s"),
        ("Lab 0 check, all at once: median / p95 / max", fmt(r["cell_s"]) + f" ({r['cell_slowdown']} x alone)"),
        ("memory per learner idle (server + kernel, PSS)", fmt(r["idle_mb"], "MB")),
        ("memory per learner busy (peak during the check)", fmt(r["busy_mb"], "MB")),
        ("box memory used: before the room / all idle", f"{r['system']['used_gb_before']} / {r['system']['used_gb_idle']} GB"),
        ("wave 1 (each submits when done): last submit to empty queue", f"{r['drain_s']['wave1_s']} s"),
        (f"wave 2: {r['learners']} submit at once, queue drained in", f"{r['drain_s']['wave2_s']} s "
         f"({r['drain_s']['wave2_per_job_s']} s a grading)"),
        ("hub restart during wave 1", str(ev.get("restart", "not asked"))),
        ("every submission graded exactly once, feedback home", "not run (--no-grading): every learner ran the check"
         if g["problems"][:1] == ["not run (--no-grading)"] and g["ok"] else
         "yes" if g["ok"] else "NO: " + "; ".join(g["problems"][:5])),
    ]
    head = (f"# Room load test ({r['date']}, commit {r['commit']})\n\n{r['machine']}; load average before "
            f"{r['load_before']}, after {r['load_after']}; command: `{r['command']}`\n\n"
            + ("" if r["complete"] else f"**Incomplete** ({r.get('stopped', 'stopped')}): the figures below are what "
               "was measured before it stopped.\n\n"))
    return head + "| what | measured |\n|---|---|\n" + "".join(f"| {a} | {b} |\n" for a, b in rows)


@contextlib.contextmanager
def keep_log(hub: Any, path: Path) -> Iterator[None]:
    """Copy the scratch hub's log beside the report when the block ends (the hub's root goes)."""
    try:
        yield
    finally:
        path.parent.mkdir(parents=True, exist_ok=True)
        if hub.log.exists():
            shutil.copyfile(hub.log, path)
            os.chmod(path, 0o600)  # the hub's log holds learners' xsrf values


def write_report(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
    path.with_suffix(".md").write_text(markdown(report))


def main(learners: int, within: float, restart_hub: bool, report: Path, tag: str | None = None,
         grading: bool = True) -> int:
    """``multigpu workshop load``: the whole test (see ``roomload``); 0 when every submission was
    graded exactly once and no spawn failed (``grading`` False: steps 1-3, 0 when every learner's
    server came up and ran the check). A run stopped part way (Ctrl-C, SIGTERM, a queue that
    does not drain) still writes what it measured, marked incomplete."""
    from multigpu.core import layout as course_layout
    from multigpu.workshop import scratch

    # a stop (SIGTERM, a timeout) still removes the scratch hub's accounts, servers and proxy
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    repo = course_layout.course_root()
    cells, answers = roomload.check_cells(repo), roomload.solution_answers(repo)
    tag = tag or f"mgl{os.getpid() % 100000}"
    names = [f"{tag}{i:02d}" for i in range(1, learners + 1)]
    out = describe(repo, learners)
    out["command"] += "" if grading else " --no-grading"
    drains: dict[str, Any] = {"wave1_s": None, "wave2_s": None, "wave2_per_job_s": None}
    alone: dict[str, Any] = {"ready_s": None, "cell_s": None, "idle_mb": None}
    room = None
    try:
        with scratch.scratch_hub(tag, [*names, f"{tag}solo"]) as hub, keep_log(hub, report.with_suffix(".hub.log")):
            hub.release(roomload.ASSIGNMENT)
            room = roomload.Room(hub, repo, within, restart_hub, runs={n: roomload.LearnerRun(n) for n in names},
                                 grading=grading)
            roomload.say("the scratch hub is up; one learner alone first")
            alone = room.alone(f"{tag}solo", cells)
            roomload.say(f"{learners} learners log in within {within:.0f} s, run Lab 0's check at one moment and submit")
            out["system"]["used_gb_before"] = memory.system_used_gb()
            room.storm(cells, answers)
            out["system"]["used_gb_idle"] = room.events.pop("used_gb_idle", None)
            if not grading:
                ran = [r for r in room.runs.values() if r.cell_s is not None]
                out["graded_once"].update(ok=len(ran) == learners, problems=["not run (--no-grading)"] + [
                    f"{r.name}: {r.error}" for r in room.runs.values() if r.error])
                out["complete"] = True
                return finish(out, room, alone, drains, report)
            submitted = sum(len(r.submitted) for r in room.runs.values())
            roomload.say(f"{submitted} submissions in; the grading queue drains one at a time")
            drains["wave1_s"] = room.drain(submitted, GRADING_BOUND_S * max(1, submitted) + 600)
            roomload.say("wave 2: every learner submits again at the same moment")
            room.wave2()
            total = sum(len(r.submitted) for r in room.runs.values())
            room.drain(total, GRADING_BOUND_S * max(1, total - submitted) + 600)
            drains["wave2_s"] = round(time.time() - room.events["wave2_at"], 2)
            drains["wave2_per_job_s"] = round(drains["wave2_s"] / max(1, total - submitted), 1)
            out["graded_once"] = graded_once(hub, room.runs, room.events.get("restart", {}).get("during_job"))
            home = feedback_home(room)
            out["graded_once"].update(problems=out["graded_once"]["problems"] + home, ok=out["graded_once"]["ok"] and not home)
            out["complete"] = True
    except (Exception, KeyboardInterrupt, SystemExit) as e:  # every stop still writes what was measured
        out["stopped"] = f"{type(e).__name__}: {e}"
    return finish(out, room, alone, drains, report)


def finish(out: dict[str, Any], room: Any, alone: dict[str, Any], drains: dict[str, Any], report: Path) -> int:
    """Write the report (what was measured, however far the run came), print it; the exit status."""
    if room is not None:
        out.update(roomload.summary(room, alone, drains))
    out["load_after"] = roomload.load_average()
    write_report(out, report)
    print(markdown(out))
    print(f"report: {report.with_suffix('.md')} and {report.with_suffix('.json')}")
    return 0 if out["complete"] and out["graded_once"]["ok"] and not out["failed_spawns"] else 1


def describe(repo: Path, learners: int) -> dict[str, Any]:
    """The run's circumstances, and its verdict until it has one."""
    from multigpu.workshop import hubconfig, preflight, spawnqueue

    learner_cores, grading_cores = hubconfig.cores()
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    limit = os.environ.get("MULTIGPU_SPAWN_LIMIT") or spawnqueue.default_limit(len(set(learner_cores) | set(grading_cores)))
    return {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit.stdout.strip(),
            "machine": f"{os.cpu_count()} cores, {preflight.memory_gb():.1f} GB", "load_before": roomload.load_average(),
            "command": f"multigpu workshop load --learners {learners}" + (" (env MULTIGPU_SPAWN_LIMIT=" + str(limit) + ")"
                                                                        if os.environ.get("MULTIGPU_SPAWN_LIMIT") else ""),
            "settings": {"spawn_limit": int(limit), "learner_cores": learner_cores, "grading_cores": grading_cores},
            "system": {"used_gb_before": None, "used_gb_idle": None}, "complete": False,
            "graded_once": {"ok": False, "problems": ["not checked: the run stopped before the queue drained"],
                            "starts": None, "restarted_job": None, "jobs": None},
            "learners": learners, "within_s": None, "failed_spawns": None, "waited_in_spawn_queue": None,
            "alone": {"ready_s": None, "cell_s": None}, "login_to_ready_s": {}, "cell_s": {}, "cell_slowdown": None,
            "idle_mb": {}, "busy_mb": {}, "drain_s": {"wave1_s": None, "wave2_s": None, "wave2_per_job_s": None},
            "events": {}}
