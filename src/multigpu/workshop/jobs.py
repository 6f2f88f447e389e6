"""The grading queue on disk: one SQLite file (``state/queue.sqlite``) that survives a restart of
the hub and of the grading service.

A job is one submission (nbgrader's inbound folder ``student+assignment+timestamp+random``).
States: ``queued`` -> ``running`` -> ``done`` or ``failed``; ``held`` while the queue is full (it
is queued as soon as a place frees, nothing is dropped); ``replaced`` when the same learner
submits the same assignment again before it ran (a resubmission replaces the earlier one).
A job found ``running`` when the service starts was cut off by a restart: it goes back to the
head of the queue, and fails with a message after :data:`MAX_ATTEMPTS` such starts.
"""

from __future__ import annotations

import json
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
)
"""
WAITING = ("queued", "held")


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
            db.execute(SCHEMA)

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
        with self._db() as db:
            return db.execute("SELECT 1 FROM jobs WHERE submission = ?", (submission,)).fetchone() is not None

    def add(self, submission: str, student: str, assignment: str, submitted: str,
            state: str | None = None, message: str = "") -> Job:
        """Record a submission (once: a known one is returned as it is). Earlier waiting jobs of the
        same learner and assignment are replaced; past the limit the job is held. With ``state``
        given (a submission refused on arrival) nothing else changes."""
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
            cur = db.execute("INSERT INTO jobs (submission, student, assignment, submitted, state, created, message) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?)", (submission, student, assignment, submitted, state, now, message))
            db.execute("COMMIT")
        job = self.get(cur.lastrowid) if cur.lastrowid is not None else None
        if job is None:
            raise RuntimeError(f"the grading queue {self.path} lost the job it just recorded")
        return job

    def recover(self) -> list[Job]:
        """After a restart: jobs cut off while running go back to the queue (or fail after
        :data:`MAX_ATTEMPTS` starts). Returns the jobs it touched."""
        with self._db() as db:
            rows = [Job.from_row(r) for r in db.execute("SELECT * FROM jobs WHERE state = 'running'")]
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
        """The next job to grade (oldest first; a restarted one first of all), now ``running``."""
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            waiting = db.execute("SELECT COUNT(*) FROM jobs WHERE state = 'queued'").fetchone()[0]
            for row in db.execute("SELECT id FROM jobs WHERE state = 'held' ORDER BY id LIMIT ?",
                                  (max(0, self.limit - waiting),)).fetchall():
                db.execute("UPDATE jobs SET state = 'queued', message = '' WHERE id = ?", (row["id"],))
            row = db.execute("SELECT * FROM jobs WHERE state = 'queued' ORDER BY attempts > 0 DESC, id LIMIT 1").fetchone()
            if row is None:
                db.execute("COMMIT")
                return None
            db.execute("UPDATE jobs SET state = 'running', started = ?, attempts = attempts + 1 WHERE id = ?",
                       (time.time(), row["id"]))
            db.execute("COMMIT")
        return self.get(row["id"])

    def finish(self, job_id: int, state: str, message: str, result: dict[str, Any] | None = None) -> None:
        if state not in ("done", "failed"):
            raise ValueError(f"a job finishes done or failed, not {state!r}")
        with self._db() as db:
            db.execute("UPDATE jobs SET state = ?, finished = ?, message = ?, result = ? WHERE id = ?",
                       (state, time.time(), message, json.dumps(result) if result is not None else None, job_id))

    def note(self, job_id: int, message: str) -> None:
        """Progress of a running job, for its learner's page."""
        with self._db() as db:
            db.execute("UPDATE jobs SET message = ? WHERE id = ?", (message, job_id))

    def position(self, job: Job) -> int | None:
        """1 for the next job to run; None for a job that is not waiting."""
        if job.state not in WAITING:
            return None
        with self._db() as db:
            queued = db.execute("SELECT COUNT(*) FROM jobs WHERE state = 'queued' AND (attempts > 0 OR id < ?)",
                                (job.id,)).fetchone()[0]
            held = db.execute("SELECT COUNT(*) FROM jobs WHERE state = 'held' AND id < ?", (job.id,)).fetchone()[0]
        total_queued = self.count("queued")
        return (queued + 1) if job.state == "queued" else (total_queued + held + 1)

    def count(self, state: str) -> int:
        with self._db() as db:
            return db.execute("SELECT COUNT(*) FROM jobs WHERE state = ?", (state,)).fetchone()[0]

    def jobs(self, student: str | None = None) -> list[Job]:
        """Every job (of ``student``), newest first."""
        sql, args = "SELECT * FROM jobs", tuple[str, ...]()
        if student is not None:
            sql, args = sql + " WHERE student = ?", (student,)
        with self._db() as db:
            return [Job.from_row(r) for r in db.execute(sql + " ORDER BY id DESC", args)]
