"""The grading queue on disk: one SQLite file (``state/queue.sqlite``) that survives a restart of
the hub and of the grading service.

A job is one submission (nbgrader's inbound folder ``student+assignment+timestamp+random``).
States: ``queued`` -> ``running`` -> ``done`` or ``failed``; ``held`` while the queue is full (it
is queued as soon as a place frees, nothing is dropped); ``replaced`` when the same learner
submits the same assignment again before it ran (a resubmission replaces the earlier one, so a
learner has at most one waiting job per assignment). Learners take turns (:meth:`Queue.take`):
the next job is the waiting learner's whose last grading started longest ago, so one learner's
many submissions never hold up the others. A job found ``running`` when the service starts was
cut off by a restart: it goes back to the head of the queue, and fails with a message after
:data:`MAX_ATTEMPTS` such starts. Entries of the exchange that are not submissions are recorded
once, with why, in a table of their own (:meth:`Queue.ignore`), so they are never looked at again.

Where gradings run as Slurm jobs (:mod:`slurmgrading`), a ``running`` job also holds the id of
the Slurm job grading it (``slurm_job``; a database made before that column gets it when opened):
a restart leaves such a job to the service, which follows it in Slurm (:meth:`Queue.recover` with
``keep_slurm``); :meth:`Queue.requeue` sends it back when its node failed, and
:meth:`Queue.finish` with ``slurm_job`` records a result only from the Slurm job it names.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_ATTEMPTS = 3
#: Jobs waiting at most (``MULTIGPU_QUEUE_LIMIT``); more are held, not refused.
QUEUE_LIMIT = 200

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    submission TEXT UNIQUE NOT NULL,
    student TEXT NOT NULL,
    assignment TEXT NOT NULL,
    submitted TEXT NOT NULL,
    state TEXT NOT NULL,
    created REAL NOT NULL,
    started REAL,
    finished REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    message TEXT NOT NULL DEFAULT '',
    result TEXT
);
CREATE TABLE IF NOT EXISTS ignored (
    name BLOB PRIMARY KEY,
    owner TEXT NOT NULL,
    reason TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS dropped (
    owner TEXT PRIMARY KEY,
    count INTEGER NOT NULL
)
"""
WAITING = ("queued", "held")


def turns(queued: list[tuple[int, str, int]], last_started: dict[str, float]) -> list[int]:
    """The order in which the ``queued`` jobs ``(id, student, attempts)`` will be graded: jobs cut
    off by a restart first, then learners in turn, each time the one whose last grading started
    longest ago (or never) with their oldest waiting job."""
    import collections

    order = [i for i, _, attempts in sorted(queued) if attempts > 0]
    waiting: dict[str, collections.deque[int]] = collections.defaultdict(collections.deque)
    for i, student, attempts in sorted(queued):
        if attempts == 0:
            waiting[student].append(i)
    served = {s: last_started.get(s, float("-inf")) for s in waiting}
    tick = max([0.0, *last_started.values()])
    while waiting:
        student = min(waiting, key=lambda s: (served[s], waiting[s][0]))
        order.append(waiting[student].popleft())
        tick += 1
        served[student] = tick
        if not waiting[student]:
            del waiting[student]
    return order


@dataclass
class Job:
    id: int
    submission: str
    student: str
    assignment: str
    submitted: str
    state: str
    created: float
    started: float | None
    finished: float | None
    attempts: int
    message: str
    result: dict[str, Any] | None
    slurm_job: int | None = None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Job:
        d = dict(row)
        d["result"] = json.loads(d["result"]) if d["result"] else None
        return cls(**d)


class Queue:
    def __init__(self, path: str | Path, limit: int = QUEUE_LIMIT):
        self.path = Path(path)
        self.limit = limit
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA)
            columns = {r["name"] for r in db.execute("PRAGMA table_info(jobs)")}
            if "slurm_job" not in columns:  # a queue made before gradings ran as Slurm jobs
                db.execute("ALTER TABLE jobs ADD COLUMN slurm_job INTEGER")

    def _db(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.row_factory = sqlite3.Row
        return db

    def _one(self, sql: str, *args: Any) -> Job | None:
        with self._db() as db:
            row = db.execute(sql, args).fetchone()
        return Job.from_row(row) if row else None

    def get(self, job_id: int) -> Job | None:
        return self._one("SELECT * FROM jobs WHERE id = ?", job_id)

    def known(self, submission: str) -> bool:
        """Whether ``submission`` was recorded, as a job or as ignored (any name, UTF-8 or not)."""
        with self._db() as db:
            if db.execute("SELECT 1 FROM ignored WHERE name = ?", (os.fsencode(submission),)).fetchone():
                return True
            try:
                submission.encode()
            except UnicodeEncodeError:  # no job has a name that is not UTF-8
                return False
            return db.execute("SELECT 1 FROM jobs WHERE submission = ?", (submission,)).fetchone() is not None

    def seen(self) -> set[str]:
        """Every name recorded, as a job or as ignored (names that are not UTF-8 as ``os.fsdecode`` gives them)."""
        with self._db() as db:
            return ({r[0] for r in db.execute("SELECT submission FROM jobs")}
                    | {os.fsdecode(r[0]) for r in db.execute("SELECT name FROM ignored")})

    def ignore(self, name: str, owner: str, reason: str) -> None:
        """Record an entry of the exchange that is not a submission to grade (once)."""
        with self._db() as db:
            db.execute("INSERT OR IGNORE INTO ignored (name, owner, reason, at) VALUES (?, ?, ?, ?)",
                       (os.fsencode(name), owner, reason, time.time()))

    def dropped(self, owner: str | None = None) -> list[tuple[str, int]]:
        """With ``owner``: count one more entry of theirs removed unrecorded, past their share. Returns
        ``(owner, count)`` of every account that had entries removed so, the most first."""
        with self._db() as db:
            if owner is not None:
                db.execute("INSERT INTO dropped (owner, count) VALUES (?, 1) "
                           "ON CONFLICT(owner) DO UPDATE SET count = count + 1", (owner,))
            return [(r[0], r[1]) for r in db.execute("SELECT owner, count FROM dropped ORDER BY count DESC, owner")]

    def ignored_by(self, owner: str) -> int:
        """How many entries of ``owner`` were recorded as not submissions."""
        with self._db() as db:
            return db.execute("SELECT COUNT(*) FROM ignored WHERE owner = ?", (owner,)).fetchone()[0]

    def ignored(self, limit: int = 20) -> tuple[int, list[tuple[str, str, str]]]:
        """How many entries were ignored, and the latest ``limit`` as ``(name, owner, reason)``."""
        with self._db() as db:
            count = db.execute("SELECT COUNT(*) FROM ignored").fetchone()[0]
            rows = db.execute("SELECT name, owner, reason FROM ignored ORDER BY at DESC LIMIT ?", (limit,)).fetchall()
        return count, [(os.fsdecode(r[0]), r[1], r[2]) for r in rows]

    def add(self, submission: str, student: str, assignment: str, submitted: str,
            state: str | None = None, message: str = "") -> Job:
        """Record a submission (once: a known one is returned as it is). Earlier waiting jobs of the
        same learner and assignment are replaced; past the limit the job is held. With ``state``
        given (a submission refused on arrival, or one replaced before it was taken) nothing else
        changes."""
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT * FROM jobs WHERE submission = ?", (submission,)).fetchone()
            if row:
                db.execute("COMMIT")
                return Job.from_row(row)
            now = time.time()
            if state is None:  # a submission to grade (not one refused on arrival) replaces a waiting one
                db.execute("UPDATE jobs SET state = 'replaced', finished = ?, message = ? WHERE student = ? AND "
                           "assignment = ? AND state IN ('queued', 'held')",
                           (now, f"replaced by your later submission ({submitted}) before it was graded", student, assignment))
                waiting = db.execute("SELECT COUNT(*) FROM jobs WHERE state = 'queued'").fetchone()[0]
                state = "queued" if waiting < self.limit else "held"
                if state == "held":
                    message = (f"the grading queue is full ({waiting} waiting): your submission is kept and "
                               "will join the queue as soon as a place frees; no need to submit again")
            cur = db.execute("INSERT INTO jobs (submission, student, assignment, submitted, state, created, finished, "
                             "message) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (submission, student, assignment, submitted, state,
                                                                       now, None if state in WAITING else now, message))
            db.execute("COMMIT")
        job = self.get(cur.lastrowid) if cur.lastrowid is not None else None
        if job is None:
            raise RuntimeError(f"the grading queue {self.path} lost the job it just recorded")
        return job

    def recover(self, keep_slurm: bool = False) -> list[Job]:
        """After a restart: jobs cut off while running go back to the queue (or fail after
        :data:`MAX_ATTEMPTS` starts); with ``keep_slurm``, those a Slurm job grades stay running
        (the service follows them). Returns the jobs it touched."""
        with self._db() as db:
            kept = " AND slurm_job IS NULL" if keep_slurm else ""
            rows = [Job.from_row(r) for r in db.execute("SELECT * FROM jobs WHERE state = 'running'" + kept)]
            for job in rows:
                if job.attempts >= MAX_ATTEMPTS:
                    db.execute("UPDATE jobs SET state = 'failed', finished = ?, message = ? WHERE id = ?",
                               (time.time(), f"the grading was cut off {job.attempts} times (the service restarted): "
                                "the instructor has been told; your submission is kept", job.id))
                else:
                    db.execute("UPDATE jobs SET state = 'queued', message = ? WHERE id = ?",
                               ("the grading service restarted during this grading: it runs again from the start", job.id))
        return rows

    def take(self) -> Job | None:
        """The next job to grade (:func:`turns`: a restarted one first of all, then learners in
        turn), now ``running``."""
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            waiting = db.execute("SELECT COUNT(*) FROM jobs WHERE state = 'queued'").fetchone()[0]
            for row in db.execute("SELECT id FROM jobs WHERE state = 'held' ORDER BY id LIMIT ?",
                                  (max(0, self.limit - waiting),)).fetchall():
                db.execute("UPDATE jobs SET state = 'queued', message = '' WHERE id = ?", (row["id"],))
            order = self._turns(db)
            if not order:
                db.execute("COMMIT")
                return None
            db.execute("UPDATE jobs SET state = 'running', started = ?, attempts = attempts + 1 WHERE id = ?",
                       (time.time(), order[0]))
            db.execute("COMMIT")
        return self.get(order[0])

    def _turns(self, db: sqlite3.Connection) -> list[int]:
        queued = [(r["id"], r["student"], r["attempts"]) for r in
                  db.execute("SELECT id, student, attempts FROM jobs WHERE state = 'queued'")]
        last = {r[0]: r[1] for r in db.execute("SELECT student, MAX(started) FROM jobs WHERE started IS NOT NULL "
                                                "GROUP BY student")}
        return turns(queued, last)

    def finish(self, job_id: int, state: str, message: str, result: dict[str, Any] | None = None,
               slurm_job: int | None = None) -> bool:
        """Record the job's end. With ``slurm_job``, only while the job is running in that Slurm
        job (a result of an earlier Slurm job of it, whose node was given up, is not its result).
        Whether it was recorded."""
        if state not in ("done", "failed"):
            raise ValueError(f"a job finishes done or failed, not {state!r}")
        fence, args = ("", ()) if slurm_job is None else (" AND state = 'running' AND slurm_job = ?", (slurm_job,))
        with self._db() as db:
            done = db.execute("UPDATE jobs SET state = ?, finished = ?, message = ?, result = ? WHERE id = ?" + fence,
                              (state, time.time(), message, json.dumps(result) if result is not None else None, job_id,
                               *args))
        return done.rowcount == 1

    def set_slurm(self, job_id: int, slurm_job: int, message: str) -> None:
        """The running job is graded by Slurm job ``slurm_job``."""
        with self._db() as db:
            db.execute("UPDATE jobs SET slurm_job = ?, message = ? WHERE id = ? AND state = 'running'",
                       (slurm_job, message, job_id))

    def requeue(self, job_id: int, message: str, count: bool = True) -> str:
        """A running job back to the head of the queue (its grading was lost: a node failed, the
        scheduler did not take it); past :data:`MAX_ATTEMPTS` starts it fails instead. ``count``
        False: the start did not happen (the job was never handed to Slurm), so it is not counted.
        Returns the job's new state."""
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT attempts FROM jobs WHERE id = ? AND state = 'running'", (job_id,)).fetchone()
            if row is None:
                db.execute("COMMIT")
                return ""
            attempts = row["attempts"] - (0 if count else 1)
            if attempts >= MAX_ATTEMPTS:
                db.execute("UPDATE jobs SET state = 'failed', finished = ?, message = ?, slurm_job = NULL, attempts = ? "
                           "WHERE id = ?", (time.time(), f"{message}; it was started {attempts} times, the "
                                            "most: the instructor has been told, your submission is kept", attempts, job_id))
                state = "failed"
            else:
                db.execute("UPDATE jobs SET state = 'queued', message = ?, slurm_job = NULL, attempts = ? WHERE id = ?",
                           (message, attempts, job_id))
                state = "queued"
            db.execute("COMMIT")
        return state

    def in_slurm(self) -> list[Job]:
        """The running jobs that Slurm jobs grade, oldest first."""
        with self._db() as db:
            return [Job.from_row(r) for r in db.execute("SELECT * FROM jobs WHERE state = 'running' AND slurm_job IS NOT "
                                                        "NULL ORDER BY id")]

    def note(self, job_id: int, message: str) -> None:
        """Progress of a running job, for its learner's page."""
        with self._db() as db:
            db.execute("UPDATE jobs SET message = ? WHERE id = ?", (message, job_id))

    def position(self, job: Job) -> int | None:
        """1 for the next job to run; None for a job that is not waiting."""
        if job.state not in WAITING:
            return None
        with self._db() as db:
            order = self._turns(db) + [r[0] for r in db.execute("SELECT id FROM jobs WHERE state = 'held' ORDER BY id")]
        return order.index(job.id) + 1 if job.id in order else None

    def count(self, state: str) -> int:
        with self._db() as db:
            return db.execute("SELECT COUNT(*) FROM jobs WHERE state = ?", (state,)).fetchone()[0]

    def jobs(self, student: str | None = None, limit: int = -1, offset: int = 0) -> list[Job]:
        """Every job (of ``student``), newest first; at most ``limit`` (-1: all) after the first ``offset``."""
        sql, args = "SELECT * FROM jobs", tuple[str | int, ...]()
        if student is not None:
            sql, args = sql + " WHERE student = ?", (student,)
        with self._db() as db:
            return [Job.from_row(r) for r in db.execute(sql + " ORDER BY id DESC LIMIT ? OFFSET ?", (*args, limit, offset))]

    def total(self, student: str | None = None) -> int:
        """How many jobs there are (of ``student``)."""
        sql, args = "SELECT COUNT(*) FROM jobs", tuple[str, ...]()
        if student is not None:
            sql, args = sql + " WHERE student = ?", (student,)
        with self._db() as db:
            return db.execute(sql, args).fetchone()[0]

    def refused_of(self, student: str) -> int:
        """How many submissions of ``student`` were never graded: refused on arrival (recorded ended:
        :meth:`add` with a ``state``) or replaced before a grading took them."""
        with self._db() as db:
            return db.execute("SELECT COUNT(*) FROM jobs WHERE student = ? AND ((state = 'failed' AND finished = created) "
                              "OR (state = 'replaced' AND started IS NULL))", (student,)).fetchone()[0]

    def waiting_of(self, student: str, assignment: str) -> bool:
        """Whether a submission of ``student`` for ``assignment`` waits for its grading."""
        with self._db() as db:
            return db.execute("SELECT 1 FROM jobs WHERE student = ? AND assignment = ? AND state IN ('queued', 'held') "
                              "LIMIT 1", (student, assignment)).fetchone() is not None
