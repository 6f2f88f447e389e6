"""``multigpu workshop VERB``: a workshop on one JupyterHub (``make hub``; docs/workshop.md).

    multigpu workshop setup [--instructor NAME]   folders, groups, the instructor and grading accounts,
                                                  the hub course (one assignment per lab), signing key
    multigpu workshop hub                         setup, then JupyterHub in the foreground (make hub)
    multigpu workshop add-learners N | --csv FILE [--sheet FILE]
                                                  accounts and a sheet of logins and one-time passwords
    multigpu workshop remove-learners NAME... | --all
    multigpu workshop queue                       the grading queue, as the instructor sees it
    multigpu workshop stop                        after the workshop: the proxy and every learner server
    multigpu workshop grade-job ID                one grading (the grading service runs it)
    multigpu workshop measure-labs [NOTEBOOK...] [--json FILE]
                                                  CPU time, wall time, peak cores and memory of each
                                                  lab notebook at its default parameters (sizing a box)

Everything lives under ``$MULTIGPU_HUB_ROOT`` (default /srv/multigpu); run as root.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from multigpu.core import layout as course_layout
from multigpu.workshop import accounts, layout
from multigpu.workshop.layout import Hub


def hub_url() -> str:
    return f"http://{os.environ.get('MULTIGPU_HUB_IP', '127.0.0.1')}:{os.environ.get('MULTIGPU_HUB_PORT', '8000')}"


def setup(instructor: str) -> int:
    from multigpu.credential import certificates
    from multigpu.workshop import course

    hub = Hub.default()
    accounts.ensure_group(layout.LEARNERS_GROUP)
    if not accounts.exists(instructor):
        secret = accounts.create(instructor, layout.INSTRUCTORS_GROUP)
        print(accounts.sheet([(instructor, secret)], hub_url()).replace("Workshop accounts", "Instructor account"))
    elif instructor not in accounts.members(layout.INSTRUCTORS_GROUP):
        print(f"error: {instructor!r} exists and is not in group {layout.INSTRUCTORS_GROUP}: pick another "
              "--instructor or add it to that group", file=sys.stderr)
        return 1
    accounts.ensure_service_user()
    made = course.setup(hub, instructor)
    key = Path(os.environ.get("MULTIGPU_CERTIFICATE_KEY") or certificates.default_key_path())
    if not key.exists():
        private, public = certificates.keygen(key)
        print(f"certificate signing key: {private} (keep it secret); public key: {public} (publish it)")
    print(f"hub course in {hub.course} (owner {instructor}): assignments {', '.join(made)}; "
          f"exchange {hub.exchange}; state {hub.state}")
    return 0


def cmd_setup(args: argparse.Namespace) -> int:
    return setup(args.instructor)


def cmd_hub(args: argparse.Namespace) -> int:
    code = setup(args.instructor)
    if code:
        return code
    config = course_layout.course_root() / "jupyter" / "hub" / "jupyterhub_config.py"
    env = dict(os.environ, MULTIGPU_HUB_INSTRUCTORS=args.instructor)
    hub = Hub.default()
    print(f"JupyterHub on {hub_url()} (learners log in with the sheet of multigpu workshop add-learners); "
          "stop it with Ctrl-C", flush=True)
    os.chdir(hub.state)
    os.execve(str(Path(sys.executable).parent / "jupyterhub"), ["jupyterhub", "-f", str(config)], env)
    return 0  # not reached


def cmd_add(args: argparse.Namespace) -> int:
    try:
        names = accounts.names_from_csv(args.csv) if args.csv else accounts.numbered(args.count)
        rows = accounts.add_learners(names)
    except accounts.AccountError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    text = accounts.sheet(rows, hub_url())
    print(text)
    if args.sheet:
        fd = os.open(args.sheet, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("login,password\n" + "".join(f"{a},{b}\n" for a, b in rows))
        print(f"\nthe sheet is also in {args.sheet} (mode 600: delete it after the workshop)")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    names = sorted(accounts.members(layout.LEARNERS_GROUP)) if args.all else args.names
    try:
        for n in names:
            accounts.remove(n)
            print(f"removed {n}")
    except accounts.AccountError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_queue(args: argparse.Namespace) -> int:
    from multigpu.workshop import jobs

    queue = jobs.Queue(Hub.default().queue_db)
    for job in reversed(queue.jobs()):
        place = queue.position(job)
        print(f"{job.id:4d} {job.student:16s} {job.assignment:11s} {job.state:8s}"
              f"{f' #{place}' if place else '   '} {job.message.splitlines()[0] if job.message else ''}")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    """Stop what a hub leaves running on purpose across its restarts: the proxy, the servers."""
    import signal

    import psutil

    hub = Hub.default()
    users = accounts.members(layout.LEARNERS_GROUP) | accounts.members(layout.INSTRUCTORS_GROUP)
    procs = [p for p in psutil.process_iter(["username", "cmdline"])
             if p.info["username"] in users and any("jupyterhub-singleuser" in a for a in p.info["cmdline"] or [])]
    pidfile = hub.state / "proxy.pid"
    if pidfile.exists():
        try:
            procs.append(psutil.Process(int(pidfile.read_text().strip())))
        except (ValueError, psutil.NoSuchProcess):
            pass
        pidfile.unlink()
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    gone, alive = psutil.wait_procs(procs, timeout=20)
    for p in alive:
        p.kill()
    print(f"stopped {len(procs)} process(es): the proxy and the users' servers")
    return 0


def cmd_grade_job(args: argparse.Namespace) -> int:
    from multigpu.workshop import grading, jobs

    hub = Hub.default()
    queue = jobs.Queue(hub.queue_db)
    job = queue.get(args.id)
    if job is None:
        print(f"error: no job {args.id}", file=sys.stderr)
        return 1

    def log(msg: str) -> None:
        print(msg, flush=True)
        queue.note(job.id, msg)

    state, message, result = grading.run(hub, job, log)
    queue.finish(job.id, state, message, result)
    print(f"job {job.id}: {state}: {message}")
    return 0


def cmd_measure(args: argparse.Namespace) -> int:
    from multigpu.workshop import roomsize

    labs = course_layout.course_root() / course_layout.SOLUTIONS / course_layout.LABS
    return roomsize.main(args.notebooks or sorted(labs.glob("*.ipynb")), quick=args.quick, out=args.json)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="multigpu workshop", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for name, fn, text in (("setup", cmd_setup, "lay out the hub (folders, accounts, course)"),
                           ("hub", cmd_hub, "setup, then run JupyterHub in the foreground")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--instructor", default=os.environ.get("MULTIGPU_HUB_INSTRUCTORS", layout.INSTRUCTOR).split(",")[0],
                       help=f"the instructor's login (default {layout.INSTRUCTOR})")
        p.set_defaults(func=fn)
    p = sub.add_parser("add-learners", help="create learner accounts; print logins and one-time passwords")
    p.add_argument("count", type=int, nargs="?", default=None, help="how many numbered accounts (learner01, ...)")
    p.add_argument("--csv", type=Path, default=None, help="a CSV of logins (column 'login', else the first)")
    p.add_argument("--sheet", type=Path, default=None, help="also write login,password to this file (mode 600)")
    p.set_defaults(func=cmd_add)
    p = sub.add_parser("remove-learners", help="delete learner accounts and their homes")
    p.add_argument("names", nargs="*")
    p.add_argument("--all", action="store_true", help="every workshop learner account")
    p.set_defaults(func=cmd_remove)
    p = sub.add_parser("queue", help="the grading queue")
    p.set_defaults(func=cmd_queue)
    p = sub.add_parser("stop", help="stop the proxy and every user server a hub left running")
    p.set_defaults(func=cmd_stop)
    p = sub.add_parser("grade-job", help="grade one job of the queue (the grading service runs this)")
    p.add_argument("id", type=int)
    p.set_defaults(func=cmd_grade_job)
    p = sub.add_parser("measure-labs", help="what each lab notebook uses at its default parameters (root: cgroups)")
    p.add_argument("notebooks", nargs="*", type=Path, help="default: every lab notebook of solutions/")
    p.add_argument("--quick", action="store_true", help="the quick parameters instead (MULTIGPU_QUICK=1)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    p.set_defaults(func=cmd_measure)
    args = parser.parse_args(argv)
    if args.func is cmd_add and (args.count is None) == (args.csv is None):
        parser.error("give a number of learners or --csv FILE (one of the two)")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
