"""The grading service's page (``/services/grading/``, :mod:`service`): a learner's own submissions,
or every learner's for an instructor, newest first, :data:`PAGE_SIZE` a page (``?page=2`` for the
next); for each, its place in the queue (and Slurm job), state, scores, report, feedback and
certificate; for an instructor, the latest entries of the exchange that were not graded. Feedback
pages are learner-written HTML, served with :data:`FEEDBACK_POLICY`."""

from __future__ import annotations

import html
from pathlib import Path

from multigpu.workshop import jobs
from multigpu.workshop.layout import Hub

#: Feedback pages are served sandboxed: a unique origin, no scripts, no forms, no plugins.
FEEDBACK_POLICY = "sandbox; default-src 'none'; img-src data:; style-src 'unsafe-inline'; font-src data:"
#: The largest file the page serves (a feedback page with its figures, a certificate).
MAX_FILE_BYTES = 64 * 2**20
#: Jobs on one page (and in one answer of ``status``): a page's size and time stay bounded
#: whatever the queue holds.
PAGE_SIZE = 50
STYLE = ("body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
         "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}"
         "pre{white-space:pre-wrap;background:#f6f6f6;padding:.5em}.failed{color:#a00}.done{color:#060}")


def page_number(given: str | None) -> int:
    """The page a ``?page=`` argument names: 1 unless it is a plain number from 1 to 1,000,000."""
    return int(given) if given and given.isascii() and given.isdigit() and 1 <= len(given) <= 7 and int(given) >= 1 else 1


def shown(queue: jobs.Queue, user: str | None, page: int) -> tuple[list[jobs.Job], int]:
    """The jobs of ``page`` (of ``user``; None: everyone's), and how many pages there are."""
    total = queue.total(user)
    return queue.jobs(user, limit=PAGE_SIZE, offset=(page - 1) * PAGE_SIZE), max(1, -(-total // PAGE_SIZE))


def render(hub: Hub, queue: jobs.Queue, user: str, instructor: bool, prefix: str, page: int = 1) -> str:
    """The page for ``user``: their own jobs (every job for an instructor), page ``page``."""
    listed, pages = shown(queue, None if instructor else user, page)
    rows = []
    for job in listed:
        place = queue.position(job)
        state = job.state + (f" (place {place} in the queue)" if place else "") + \
            (f", Slurm job {job.slurm_job}" if job.slurm_job else "")
        detail = html.escape(job.message)
        res = job.result or {}
        links = []
        if job.state == "done":
            links += [f'<a href="{prefix}files/{job.id}/feedback/{html.escape(nb)}.html">{html.escape(nb)} feedback</a>'
                      for nb in feedback_pages(hub, job)]
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
             + "".join(rows) + "</table>") if rows else "<p>No submissions yet.</p>" if page == 1 else \
        f"<p>There is no page {page}.</p>"
    if pages > 1:
        turn = [f'<a href="{prefix}?page={page - 1}">newer</a>'] if page > 1 else []
        turn += [f'<a href="{prefix}?page={page + 1}">older</a>'] if page < pages else []
        table += f"<p>Page {page} of {pages} ({PAGE_SIZE} a page). {' · '.join(turn)}</p>"
    if instructor:
        dropped = queue.dropped()
        if dropped:
            table += ("<h2>Removed unread: entries past their account's share of entries not graded</h2><ul>"
                      + "".join(f"<li>{html.escape(owner)}: {n}</li>" for owner, n in dropped[:PAGE_SIZE]) + "</ul>")
        count, latest = queue.ignored()
        if count:
            table += (f"<h2>Not graded: {count} entries of the exchange that are not submissions (the latest "
                      f"{len(latest)})</h2><ul>"
                      + "".join(f"<li>{html.escape(ascii(name))} (made by {html.escape(owner)}): {html.escape(why)}</li>"
                                for name, owner, why in latest) + "</ul>")
    refresh = "<meta http-equiv='refresh' content='10'>" if page == 1 else ""
    return (f"<!doctype html><html><head><meta charset='utf-8'>{refresh}"
            f"<title>Grading</title><style>{STYLE}</style></head><body>{head}{table}</body></html>")


def feedback_pages(hub: Hub, job: jobs.Job) -> list[str]:
    """The notebooks of ``job`` whose feedback page exists (nbgrader's, one per graded notebook;
    any other HTML file a learner submitted is never served)."""
    graded = ((job.result or {}).get("autograde") or {}).get("notebooks") or {}
    folder = hub.course / "feedback" / job.student / job.assignment
    return [nb for nb in sorted(graded) if (folder / f"{nb}.html").is_file()]


def file_for(hub: Hub, job: jobs.Job, kind: str, name: str) -> Path | None:
    """The feedback page or certificate file of ``job`` named by a URL, or None."""
    if kind == "feedback":
        pages = feedback_pages(hub, job)
        return hub.course / "feedback" / job.student / job.assignment / name if name[:-5] in pages and \
            name.endswith(".html") else None
    if kind == "certificate" and job.result and job.result.get("certificate") and name in ("pdf", "json"):
        return Path(job.result["certificate"][name])
    return None
