"""What an operator leaves running for a day, the parts that need no hub: the spawn queue, the
preflight (make hub-check), HTTPS's certificate, the issuer files the hub publishes, the
instructor's view of names, the grading page, offboarding's archive (tests/test_workshop_room.py
runs them in a hub)."""

from __future__ import annotations

import asyncio
import os
import pwd
import socket
import tarfile
import types
from pathlib import Path

import pytest

from multigpu.workshop import accounts, copies, gradingpage, hubconfig, jobs, layout, preflight, spawnqueue, tls


def test_a_login_storm_waits_its_turn_in_arrival_order():
    """Six servers, two starting at a time: never more than two at once, each in the order it
    came, the waiting ones told their place; a cancelled start gives up its place."""

    async def room() -> tuple[list[str], int, list[str]]:
        queue = spawnqueue.SpawnQueue(2)
        order, most, seen = [], 0, []

        async def spawn(name: str) -> None:
            nonlocal most
            await queue.enter(name)
            order.append(name)
            most = max(most, queue.active)
            await asyncio.sleep(0.05)
            await queue.leave()

        async def watch(name: str) -> None:
            async for event in queue.progress(name):
                seen.append(event["message"])

        tasks = [asyncio.create_task(spawn(f"l{i}")) for i in range(6)]
        await asyncio.sleep(0)
        watcher = asyncio.create_task(watch("l5"))
        quitter = asyncio.create_task(queue.enter("gone"))
        await asyncio.sleep(0)
        quitter.cancel()
        await asyncio.gather(*tasks, watcher)
        assert queue.place("gone") is None and queue.active == 0
        return order, most, seen

    order, most, seen = asyncio.run(room())
    assert order == [f"l{i}" for i in range(6)] and most == 2
    assert seen and seen[0].startswith("Waiting to start") and "ahead of you" in seen[0]
    with pytest.raises(ValueError):
        spawnqueue.SpawnQueue(0)


def test_preflight_says_what_the_box_lacks(tmp_path, monkeypatch):
    big = preflight.room(10_000, [0], [1])
    assert [c.state for c in big] == ["FAIL", "FAIL"] and "a bigger box" in big[0].detail
    in_step = preflight.room(10, [0, 1], [2])[0]
    assert in_step.state == "WARN" and "5.0x slower" in in_step.detail, in_step
    ok = preflight.room(1, [0, 1, 2], [3])
    assert [c.state for c in ok] == ["OK", "OK" if preflight.memory_gb() >= preflight.need_gb(1) else "FAIL"]
    assert preflight.room(1, [0, 1], [0, 1])[0].state == "WARN", "grading on the learners' cores is said"
    assert preflight.need_gb(30) == preflight.BASE_GB + 30 * preflight.IDLE_GB + 6 * preflight.LAB_PEAK_GB

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    settings = hubconfig.proxy.Settings(ip="127.0.0.1", port=port, api_port=port, hub_port=port)
    checks = preflight.ports(layout.Hub(tmp_path), settings, port)
    busy.close()
    assert {c.state for c in checks} == {"FAIL"} and "in use by another program" in checks[0].detail

    key = tmp_path / "course-key"
    assert preflight.key_and_tls(key, None, "127.0.0.1")[0].state == "WARN", "no key yet: make hub makes it"
    key.write_text("secret")
    key.chmod(0o644)
    assert preflight.key_and_tls(key, None, "127.0.0.1")[0].state == "FAIL", "a key others can read"
    key.chmod(0o600)
    (tmp_path / "course-key.pub").write_text("ed25519 x")
    assert preflight.key_and_tls(key, None, "127.0.0.1")[0].state == "OK"
    assert preflight.key_and_tls(key, None, "0.0.0.0")[1].state == "WARN", "plain HTTP on the network is said"
    cert, tls_key = tmp_path / "hub.crt", tmp_path / "hub.key"
    tls.self_signed(cert, tls_key, ["box.example"])
    assert preflight.key_and_tls(key, (str(cert), str(tls_key)), "0.0.0.0")[1].state == "OK"
    tls.self_signed(tmp_path / "other.crt", tmp_path / "other.key", ["x"])
    mismatch = preflight.key_and_tls(key, (str(cert), str(tmp_path / "other.key")), "0.0.0.0")[1]
    assert mismatch.state == "FAIL" and "is not the key of" in mismatch.detail
    assert preflight.disk(layout.Hub(tmp_path), 10**9)[0].state == "FAIL"
    quota = preflight.quotas(10**6)
    assert quota.state == "WARN" and ("fills before the quotas" in quota.detail or quota.detail.startswith("none: ")), quota


def test_a_self_signed_certificate_names_the_room_host(tmp_path):
    from cryptography import x509

    cert, key = tmp_path / "hub.crt", tmp_path / "hub.key"
    tls.self_signed(cert, key, ["box.example", "10.0.0.5"])
    assert tls.check(cert, key) is None
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    names = x509.load_pem_x509_certificate(cert.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert "box.example" in names.get_values_for_type(x509.DNSName)
    assert {str(a) for a in names.get_values_for_type(x509.IPAddress)} == {"10.0.0.5", "127.0.0.1"}
    assert "cannot read" in tls.check(tmp_path / "missing.crt", key)


def test_https_the_culler_and_the_outside_proxy_in_the_hubs_settings(monkeypatch, tmp_path):
    cert, key = tmp_path / "hub.crt", tmp_path / "hub.key"
    tls.self_signed(cert, key, ["box.example"])
    for name, value in {"MULTIGPU_HUB_ROOT": str(tmp_path), "MULTIGPU_HUB_TLS_CERT": str(cert),
                        "MULTIGPU_HUB_TLS_KEY": str(key), "MULTIGPU_HUB_IP": "0.0.0.0", "MULTIGPU_HUB_PORT": "8443",
                        "MULTIGPU_HUB_URL": "https://box.example:8443", "MULTIGPU_CULL_TIMEOUT": "600"}.items():
        monkeypatch.setenv(name, value)
    c = types.SimpleNamespace(**{n: types.SimpleNamespace() for n in (
        "JupyterHub", "ConfigurableHTTPProxy", "PAMAuthenticator", "Authenticator", "Spawner")})
    hubconfig.configure(c)
    assert c.JupyterHub.bind_url == "https://0.0.0.0:8443"
    assert c.ConfigurableHTTPProxy.should_start is False, "a hub restart must leave the proxy alone"
    assert "--ssl-cert" in hubconfig.proxy_settings().command()
    culler, grading = c.JupyterHub.services
    assert "--timeout=600" in culler["command"] and "delete:servers" in c.JupyterHub.load_roles[-1]["scopes"]
    assert grading["environment"]["MULTIGPU_ISSUER_URL"] == "https://box.example:8443/services/grading/issuer"
    assert c.JupyterHub.concurrent_spawn_limit == 0, "the hub's own limit would refuse a storm; spawnqueue queues it"
    monkeypatch.setenv("MULTIGPU_CULL_TIMEOUT", "0")
    assert hubconfig.culler_service() == ([], [])
    monkeypatch.delenv("MULTIGPU_HUB_TLS_KEY")
    with pytest.raises(ValueError, match="both a certificate and its key"):
        hubconfig.tls_files()


def test_the_hub_publishes_its_issuer_files_before_the_first_certificate(tmp_path, monkeypatch):
    from multigpu.credential import certificates
    from multigpu.workshop import issuer

    private, public = certificates.keygen(tmp_path / "keys" / "course-key")
    monkeypatch.setenv("MULTIGPU_CERTIFICATE_KEY", str(private))
    hub = layout.Hub(tmp_path / "root")
    hub.certificates.mkdir(parents=True)
    url = "https://box.example/services/grading/issuer"
    page = issuer.published(hub, "verify.html", issuer_url=url)
    assert issuer.published(hub, "course-key.pub").read_text() == public.read_text()
    assert url in issuer.published(hub, "issuer.json").read_text()
    assert page.stat().st_mtime == issuer.published(hub, "verify.html").stat().st_mtime, "written once, then served"
    with pytest.raises(KeyError):
        issuer.published(hub, "../state/queue.sqlite")


def test_names_for_the_formgrader_and_from_the_rooms_csv(tmp_path):
    assert accounts.gradebook_names("root") in ({"first_name": "", "last_name": "root"},
                                                {"first_name": "", "last_name": pwd.getpwnam("root").pw_gecos})
    assert accounts.gradebook_names("no-such-login-here") == {"first_name": "", "last_name": "no-such-login-here"}
    f = tmp_path / "room.csv"
    f.write_text("student_id,first_name,last_name,email\nana,Ana,Lima,a@x\nben,,Ode,b@x\n")
    assert accounts.names_from_csv(f) == ["ana", "ben"]
    assert accounts.full_names_from_csv(f) == {"ana": "Ana Lima", "ben": "Ode"}
    f.write_text("login\nana\n")
    assert accounts.full_names_from_csv(f) == {}


def test_the_grading_page_keeps_each_link_apart_from_the_message(tmp_path):
    hub = layout.Hub(tmp_path)
    queue = jobs.Queue(hub.queue_db)
    job = queue.add("ana+lab-00+t1+x", "ana", "lab-00", "t1")
    queue.take()
    queue.finish(job.id, "done", "notebooks 2/2 points; feedback released (Assignments tab: Fetch Feedback)",
                 {"autograde": {"notebooks": {"00-welcome": [2.0, 2.0]}}})
    feedback = hub.course / "feedback" / "ana" / "lab-00"
    feedback.mkdir(parents=True)
    (feedback / "00-welcome.html").write_text("<html></html>")
    page = gradingpage.render(hub, queue, "ana", False, "/services/grading/")
    assert "Fetch Feedback)<p><a href=" in page and ">00-welcome feedback</a></p>" in page
    assert "Fetch Feedback)00-welcome" not in page


def test_the_grading_page_shows_a_bounded_page_of_jobs_and_the_way_to_the_others(tmp_path):
    """A queue of thousands of jobs (a flood, or a long day) gives a page of PAGE_SIZE rows, newest
    first, with links to the older and newer pages; a learner's page and the status list likewise."""
    hub = layout.Hub(tmp_path)
    queue = jobs.Queue(hub.queue_db)
    count = 2 * gradingpage.PAGE_SIZE + 7
    for i in range(count):
        queue.add(f"ana+lab-00+t{i}+x", "ana", "lab-00", f"t{i}", state="failed", message=f"note-{i}-end")
    queue.add("ben+lab-00+t1+y", "ben", "lab-00", "t1")
    first = gradingpage.render(hub, queue, "teach", True, "/g/")
    assert first.count("<tr>") == gradingpage.PAGE_SIZE + 1 and "Page 1 of 3" in first
    assert "ben" in first and f"note-{count - 1}-end" in first and '<a href="/g/?page=2">older</a>' in first
    last = gradingpage.render(hub, queue, "teach", True, "/g/", page=3)
    assert last.count("<tr>") == 1 + (count + 1) - 2 * gradingpage.PAGE_SIZE and "note-0-end" in last
    assert '<a href="/g/?page=2">newer</a>' in last and "older" not in last
    assert "There is no page 9" in gradingpage.render(hub, queue, "teach", True, "/g/", page=9)
    mine = gradingpage.render(hub, queue, "ben", False, "/g/")
    assert "ben+lab-00" not in mine and mine.count("<tr>") == 2 and "Page 1 of" not in mine
    jobs_of_ana, pages = gradingpage.shown(queue, "ana", 3)
    assert pages == 3 and len(jobs_of_ana) == 7
    for given, page in (("2", 2), (None, 1), ("0", 1), ("-1", 1), ("x", 1), ("9" * 500, 1), ("\u0663", 1)):
        assert gradingpage.page_number(given) == page


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="offboarding removes Unix accounts: root")
def test_offboarding_archives_home_and_results_before_the_account_goes(tmp_path):
    from multigpu.workshop import offboard

    hub = layout.Hub(tmp_path / "hub")
    for p in (hub.results, hub.certificates, hub.course / "submitted"):
        p.mkdir(parents=True)
    login = f"mgo{os.getpid() % 100000}"
    accounts.add_learners([login])
    try:
        home = Path(pwd.getpwnam(login).pw_dir)
        (home / "lab-00").mkdir()
        (home / "lab-00" / "00-welcome.ipynb").write_text("{my work}")
        (hub.results / f"{login}.json").write_text('{"passed": true}')
        (hub.course / "submitted" / login / "lab-00").mkdir(parents=True)
        (hub.course / "submitted" / login / "lab-00" / "timestamp.txt").write_text("t1")
        (hub.state / "learners-sheet.csv").write_text(f"login,password\n{login},x\n")
        with pytest.raises(offboard.OffboardError, match="not workshop learner accounts"):
            offboard.offboard(hub, [login, "root"], tmp_path / "archive")
        assert accounts.exists(login), "nothing is done when one name is not a learner"
        done = offboard.offboard(hub, [login], tmp_path / "archive")
        assert not accounts.exists(login) and not home.exists()
        with tarfile.open(done[0][1]) as tar:
            names = set(tar.getnames())
            assert tar.extractfile(f"{login}/home/lab-00/00-welcome.ipynb").read() == b"{my work}"
            assert tar.extractfile(f"{login}/results.json").read() == b'{"passed": true}'
        assert f"{login}/submitted/lab-00/timestamp.txt" in names and f"{login}/grades.csv" in names
        assert oct(done[0][1].stat().st_mode & 0o777) == "0o600"
        if not accounts.members(layout.LEARNERS_GROUP):
            assert not (hub.state / "learners-sheet.csv").exists(), "the passwords go with the last account"
    finally:
        if accounts.exists(login):
            accounts.remove(login)


def test_verify_without_the_public_key_says_where_it_is(tmp_path, capsys):
    """``multigpu verify`` with a key file that is not there: a message naming where a hub
    publishes the key, exit 2, no traceback."""
    from multigpu import cli

    cert = tmp_path / "cert.json"
    cert.write_text("{}")
    code = cli.main(["verify", str(cert), "--public-key", str(tmp_path / "course-key.pem.pub")])
    err = capsys.readouterr().err
    assert code == 2 and "no public key at" in err and "/services/grading/issuer/course-key.pub" in err, err
    assert "Traceback" not in err
    assert cli.main(["verify", str(tmp_path / "missing.json"), "--public-key", str(cert)]) == 2
    assert "no certificate at" in capsys.readouterr().err


def test_hub_check_finds_copies_of_the_course_whose_solutions_learners_can_read():
    """A second clone made with a default umask (755) gives learners its solutions: found, however deep
    it sits within the search's depth, and no longer once its solutions/ is closed."""
    import shutil
    import tempfile

    from conftest import REPO

    tmp_path = Path(tempfile.mkdtemp(prefix="multigpu-checkouts-"))  # pytest's own folders are closed (700)
    tmp_path.chmod(0o755)
    try:
        copies_found_while_readable(tmp_path, REPO)
    finally:
        shutil.rmtree(tmp_path)


def copies_found_while_readable(tmp_path, repo):
    import shutil

    home = tmp_path / "home" / "someone"
    clone = home / "work" / "course"
    (clone / "solutions" / "assessments").mkdir(parents=True)
    shutil.copy(repo / "nbgrader_config.py", clone)
    (clone / "solutions" / "assessments" / "train.py").write_text("the reference\n")
    for p in (tmp_path, tmp_path / "home", home, home / "work", clone, clone / "solutions"):
        p.chmod(0o755)
    deep = tmp_path / "a" / "b" / "c" / "d" / "e" / "course"
    shutil.copytree(clone, deep)
    assert copies.course_copies([tmp_path / "home"]) == [clone]
    assert clone not in copies.course_copies([tmp_path], depth=2) and deep not in copies.course_copies([tmp_path])
    assert copies.readable_by_learners(clone / "solutions")
    (clone / "solutions").chmod(0o700)
    assert not copies.readable_by_learners(clone / "solutions")
    (clone / ".git").mkdir(mode=0o755)  # a clone's history holds the solutions as well
    assert copies.readable_by_learners(clone / ".git")
    (clone / "solutions").chmod(0o755)
    home.chmod(0o700)  # a closed home closes what is below it
    assert not copies.readable_by_learners(clone / "solutions")


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a folder at the top of the file system")
def test_hub_check_finds_a_readable_copy_in_a_folder_at_the_top_of_the_file_system():
    """A copy in /work, /data, /mnt or any folder of the file system's top that is not the system's
    (a red-team pass read the reference solution from /work/...: the check looked at a fixed list)."""
    import shutil

    from conftest import REPO

    top = Path(f"/multigpu-copy-{os.getpid()}")
    clone = top / "team" / "course"
    try:
        (clone / "solutions" / "assessments").mkdir(parents=True)
        shutil.copy(REPO / "nbgrader_config.py", clone)
        (clone / "solutions" / "assessments" / "train.py").write_text("the reference\n")
        for p in (top, top / "team", clone, clone / "solutions"):
            p.chmod(0o755)
        (check,) = preflight.other_checkouts()
        assert check.state == "FAIL" and str(clone) in check.detail, check
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_hub_check_warns_of_ways_to_start_processes_outside_a_servers_namespaces():
    assert preflight.outside_doors(set())[0].state == "OK"
    warned = preflight.outside_doors({"sshd", "cron", "python3"})[0]
    assert warned.state == "WARN" and "DenyGroups" in warned.detail and "cron.deny" in warned.detail


@pytest.mark.slow
def test_a_sigterm_runs_a_scratch_hubs_teardown(tmp_path):
    """``timeout`` or a CI runner stops a test run with SIGTERM: the scratch hub's ``finally`` (its
    accounts, mounts and processes removed) still runs, and the run ends with 128 + 15."""
    import signal
    import subprocess
    import sys
    import time

    marker = tmp_path / "torn-down"
    code = ("import sys, time\nfrom multigpu.workshop import scratch\nscratch.terminate_by_exception()\n"
            f"try:\n    print('up', flush=True)\n    time.sleep(60)\nfinally:\n    open({str(marker)!r}, 'w').close()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM and marker.exists()
