"""``multigpu workshop VERB``: a workshop on one JupyterHub (``make hub``; docs/workshop.md).

    multigpu workshop setup [--instructor NAME]   folders, groups, the instructor and grading accounts,
                                                  the hub course (one assignment per lab), signing key
    multigpu workshop hub                         setup, then JupyterHub in the foreground (make hub)
    multigpu workshop add-learners N | --csv FILE [--sheet FILE]
                                                  accounts and a sheet of logins and one-time passwords
    multigpu workshop remove-learners NAME... | --all
    multigpu workshop offboard NAME... | --all [--to DIR]
                                                  archive each learner's home and results, then remove them
    multigpu workshop queue                       the grading queue, as the instructor sees it
    multigpu workshop stop                        after the workshop: the proxy and every learner server
    multigpu workshop check --learners N          preflight: what this box lacks for a room of N (make hub-check)
    multigpu workshop tls --cert F --key F --host NAME
                                                  a self-signed certificate for a closed room's HTTPS
    multigpu workshop load --learners N [--report FILE] [--restart-hub]
                                                  the room load test in a scratch hub (make hub-load)
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
from multigpu.workshop import accounts, disks, layout
from multigpu.workshop.layout import Hub


def hub_url() -> str:
    """The address learners open (https when the hub has a certificate; ``HUB_URL`` when given)."""
    from multigpu.workshop import hubconfig

    return hubconfig.public_url()


def setup(instructor: str) -> int:
    from multigpu.credential import certificates
    from multigpu.workshop import course

    hub = Hub.default()
    if (why := hub.hidden_from_servers()) is not None:
        print(f"error: {why}", file=sys.stderr)
        return 1
    accounts.ensure_group(layout.LEARNERS_GROUP)
    if not accounts.exists(instructor):
        secret = accounts.create(instructor, layout.INSTRUCTORS_GROUP)
        sheet = accounts.write_sheet(hub.instructor_sheet, [(instructor, secret)])
        print(f"instructor account {instructor} created: its one-time password is in {sheet} (root only; "
              "never printed, so no log keeps it)")
    elif instructor not in accounts.members(layout.INSTRUCTORS_GROUP):
        print(f"error: {instructor!r} exists and is not in group {layout.INSTRUCTORS_GROUP}: pick another "
              "--instructor or add it to that group", file=sys.stderr)
        return 1
    accounts.ensure_service_user()
    made = course.setup(hub, instructor)
    disks.quota(lambda: disks.attach_exchange(hub), "the exchange")
    for login in sorted(accounts.members(layout.LEARNERS_GROUP)):  # after a reboot nothing is mounted
        disks.quota(lambda: disks.attach_home(login), f"{login}'s home")
    key = Path(os.environ.get("MULTIGPU_CERTIFICATE_KEY") or certificates.default_key_path())
    if not key.exists():
        private, public = certificates.keygen(key)
        print(f"certificate signing key: {private} (keep it secret); public key: {public} (publish it)")
    print(f"hub course in {hub.course} (owner {instructor}): assignments {', '.join(made)}; "
          f"exchange {hub.exchange}; state {hub.state}")
    return 0


def cmd_setup(args: argparse.Namespace) -> int:
    return setup(args.instructor)


def cmd_release(args: argparse.Namespace) -> int:
    """Release an assignment from a terminal, as the instructor (``course.release``)."""
    from multigpu.workshop import course, hubconfig

    hub = Hub.default()
    try:
        course.release(hub, args.assignment, args.instructor or hubconfig.instructors()[0])
    except (KeyError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{args.assignment} released to the exchange {hub.exchange} (learners fetch it from their Assignments tab)")
    return 0


def cmd_hub(args: argparse.Namespace) -> int:
    from multigpu.workshop import hubconfig, proxy
    from multigpu.workshop import tls as tls_files

    try:  # a certificate that cannot be served stops here, not in the proxy's log
        tls = hubconfig.tls_files()
        why = tls_files.check(*tls) if tls else None
    except ValueError as e:
        why = str(e)
    if why:
        print(f"error: HTTPS: {why}", file=sys.stderr)
        return 1
    code = setup(args.instructor)
    if code:
        return code
    config = course_layout.course_root() / "jupyter" / "hub" / "jupyterhub_config.py"
    env = dict(os.environ, MULTIGPU_HUB_INSTRUCTORS=args.instructor)
    if tls:
        env.update(MULTIGPU_HUB_TLS_CERT=tls[0], MULTIGPU_HUB_TLS_KEY=tls[1])  # the hub runs in state/
    hub = Hub.default()
    try:
        pid = proxy.ensure(hub, hubconfig.proxy_settings())
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"JupyterHub on {hubconfig.public_url()} (learners log in with the sheet of multigpu workshop add-learners); "
          f"the proxy (pid {pid}) keeps running across hub restarts; stop the hub with Ctrl-C", flush=True)
    os.chdir(hub.state)
    os.execve(str(Path(sys.executable).parent / "jupyterhub"), ["jupyterhub", "-f", str(config)], env)
    return 0  # not reached


def cmd_add(args: argparse.Namespace) -> int:
    try:
        names = accounts.names_from_csv(args.csv) if args.csv else accounts.numbered(args.count)
        rows = accounts.add_learners(names, accounts.full_names_from_csv(args.csv) if args.csv else None)
    except accounts.AccountError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for login, _ in rows:
        disks.quota(lambda: disks.attach_home(login), f"{login}'s home ({disks.learner_mb()} MB)")
    text = accounts.sheet(rows, hub_url())
    print(text)
    if args.sheet:
        accounts.write_sheet(args.sheet, rows)
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

    from multigpu.workshop import limits, proxy, serverlog

    hub = Hub.default()
    procs = servers_of(hub)
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    alive = stopped_by(procs, 20)
    for p in alive:
        p.kill()
    had_proxy = proxy.stop(hub)
    users = {p.info["username"] for p in procs}  # this hub's (a second hub's servers are not this stop's)
    groups = [g for g in limits.groups() if g.removeprefix("user-") in users or g in limits.gradings_of(hub.tag)]
    for group in groups:  # what is left in a server's control group goes with it (its namespaces went with the server)
        limits.release(group)
    disks.remove_gradings(hub)  # a grading's file system, when the stop cut it off
    (serverlog.BUDGETS / proxy.log_name(hub)).unlink(missing_ok=True)  # the proxy's log budget of the hour
    print(f"stopped {len(procs)} server(s){' and the proxy' if had_proxy else ''}"
          + (f" ({len(alive)} killed after 20 s)" if alive else "") + f"; removed {len(groups)} control group(s)")
    return 0


def servers_of(hub: Hub) -> list:
    """The user servers this hub started: ``jupyterhub-singleuser`` processes of workshop accounts
    whose environment names this hub's root (several hubs may share a machine and its groups)."""
    import psutil

    users = accounts.members(layout.LEARNERS_GROUP) | accounts.members(layout.INSTRUCTORS_GROUP)
    found = []
    for p in psutil.process_iter(["username", "cmdline"]):
        if p.info["username"] in users and any("jupyterhub-singleuser" in a for a in p.info["cmdline"] or []):
            try:
                if p.environ().get("MULTIGPU_HUB_ROOT") == str(hub.root):
                    found.append(p)
            except psutil.Error:
                continue
    return found


def stopped_by(procs: list, timeout: float) -> list:
    """Wait until every process in ``procs`` has exited (or is a zombie its parent has not yet
    reaped: it holds nothing); the ones still running after ``timeout`` seconds."""
    import time

    deadline = time.monotonic() + timeout
    alive = list(procs)
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if running(p)]
    return alive


def running(proc) -> bool:
    import psutil

    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def cmd_offboard(args: argparse.Namespace) -> int:
    from multigpu.workshop import offboard

    hub = Hub.default()
    names = sorted(accounts.members(layout.LEARNERS_GROUP)) if args.all else args.names
    folder = args.to or offboard.default_folder(hub)
    try:
        done = offboard.offboard(hub, names, folder)
    except (offboard.OffboardError, accounts.AccountError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for login, path in done:
        print(f"archived {login} -> {path}; account removed")
    print(f"{len(done)} learner(s) offboarded; the room's grades: {folder / 'grades.csv'}")
    if args.remove_staff:
        if not args.all:
            print("error: --remove-staff goes with --all (the staff leave after the whole room)", file=sys.stderr)
            return 1
        for login in offboard.remove_staff(hub):
            print(f"removed {login}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from multigpu.workshop import preflight

    try:
        count = len(accounts.names_from_csv(args.learners)) if Path(args.learners).is_file() else int(args.learners)
    except (ValueError, accounts.AccountError) as e:
        print(f"error: --learners takes a number or a CSV of logins ({e})", file=sys.stderr)
        return 1
    return preflight.main(count)


def cmd_tls(args: argparse.Namespace) -> int:
    from multigpu.workshop import tls

    tls.self_signed(args.cert, args.key, args.host)
    print(f"self-signed certificate {args.cert} (for {', '.join(args.host)}, {tls.DAYS} days) and key {args.key}: "
          f"make hub TLS_CERT={args.cert} TLS_KEY={args.key}; browsers warn once that no authority signed it")
    return 0


def cmd_load(args: argparse.Namespace) -> int:
    from multigpu.workshop import roomreport

    return roomreport.main(args.learners, args.within, args.restart_hub, args.report, grading=not args.no_grading)


def cmd_grade_job(args: argparse.Namespace) -> int:
    import warnings

    from sqlalchemy.exc import SAWarning

    from multigpu.workshop import grading, jobs

    # nbgrader's Gradebook.add_submission builds a submission through its relationships and adds
    # it to the session a few lines later; SQLAlchemy 2 warns at the autoflush in between (the row
    # is written all the same: the tests read it back). Without this, every grading printed three
    # such warnings into the hub's log.
    warnings.filterwarnings("ignore", message=r"Object of type <Submitted\w+> not in session, add operation along",
                            category=SAWarning)
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


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="multigpu workshop", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for name, fn, text in (("setup", cmd_setup, "lay out the hub (folders, accounts, course)"),
                           ("hub", cmd_hub, "setup, then run JupyterHub in the foreground")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--instructor", default=os.environ.get("MULTIGPU_HUB_INSTRUCTORS", layout.INSTRUCTOR).split(",")[0],
                       help=f"the instructor's login (default {layout.INSTRUCTOR})")
        p.set_defaults(func=fn)
    p = sub.add_parser("release", help="release an assignment to the learners, as the instructor (make hub-release)")
    p.add_argument("assignment", help="lab-00 ... lab-05 or assessment")
    p.add_argument("--instructor", default=None, help="the instructor's login (default: the hub's first instructor)")
    p.set_defaults(func=cmd_release)
    p = sub.add_parser("add-learners", help="create learner accounts; print logins and one-time passwords")
    p.add_argument("count", type=int, nargs="?", default=None, help="how many numbered accounts (learner01, ...)")
    p.add_argument("--csv", type=Path, default=None, help="a CSV of logins (column 'login', else the first)")
    p.add_argument("--sheet", type=Path, default=None, help="also write login,password to this file (mode 600)")
    p.set_defaults(func=cmd_add)
    p = sub.add_parser("remove-learners", help="delete learner accounts and their homes")
    p.add_argument("names", nargs="*")
    p.add_argument("--all", action="store_true", help="every workshop learner account")
    p.set_defaults(func=cmd_remove)
    p = sub.add_parser("offboard", help="archive each learner's home and results, then remove the account")
    p.add_argument("names", nargs="*")
    p.add_argument("--all", action="store_true", help="every workshop learner account")
    p.add_argument("--to", type=Path, default=None, help="the archive folder (default ROOT/archive/<date-time>)")
    p.add_argument("--remove-staff", action="store_true",
                   help="with --all: then remove the instructor accounts and the grading account too")
    p.set_defaults(func=cmd_offboard)
    p = sub.add_parser("check", help="preflight: what this box lacks for a room (make hub-check)")
    p.add_argument("--learners", default="30", help="the room's size, or its CSV of logins")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("tls", help="make a self-signed certificate and key for the hub's HTTPS")
    p.add_argument("--cert", type=Path, required=True)
    p.add_argument("--key", type=Path, required=True)
    p.add_argument("--host", action="append", default=[], help="a name or address learners open (repeatable)")
    p.set_defaults(func=cmd_tls)
    p = sub.add_parser("load", help="the room load test in a scratch hub (make hub-load)")
    p.add_argument("--learners", type=int, default=30)
    p.add_argument("--within", type=float, default=60.0, help="seconds over which the logins are spread")
    p.add_argument("--restart-hub", action="store_true", help="restart the hub while the first submission is graded")
    p.add_argument("--no-grading", action="store_true", help="logins, spawns and the check only (steps 1-3)")
    p.add_argument("--report", type=Path, default=Path("bench/hub-load"), help="report path, without suffix (.json, .md)")
    p.set_defaults(func=cmd_load)
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
    return parser


def main(argv: list[str] | None = None) -> int:
    verbs = parser()
    args = verbs.parse_args(argv)
    if args.func is cmd_add and (args.count is None) == (args.csv is None):
        verbs.error("give a number of learners or --csv FILE (one of the two)")
    if args.func is cmd_offboard and bool(args.names) == args.all:
        verbs.error("give learner logins or --all (one of the two)")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
