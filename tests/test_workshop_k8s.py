"""The Kubernetes deployment (deploy/kubernetes/): no cluster here, so this checks what can be
checked without one: the files parse, and the settings that matter agree with the course."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO
from multigpu.grading import rules
from multigpu.workshop import layout

K8S = REPO / "deploy" / "kubernetes"


def _pins() -> dict[str, str]:
    pyproject = (REPO / "pyproject.toml").read_text()
    install = (REPO / "deploy" / "hub" / "install.sh").read_text()
    found = {"torch": re.search(r'"torch==([^"]+)"', pyproject)}
    for name in ("jupyterhub", "ngshare", "ngshare_exchange"):
        found[name] = re.search(rf"^{name.upper()}_VERSION=(\S+)", install, re.M)
    assert all(found.values()), f"a pin is missing: {found}"
    return {name: m.group(1) for name, m in found.items() if m}


def _docs(name: str) -> dict[str, Any]:
    return {d["kind"] + "/" + d["metadata"]["name"]: d for d in yaml.safe_load_all((K8S / name).read_text())}


def test_values_give_each_learner_one_gpu_per_worker_on_the_gpu_pool():
    values = yaml.safe_load((K8S / "values.yaml").read_text())
    user = values["singleuser"]
    assert user["extraResource"]["limits"]["nvidia.com/gpu"] == str(rules.WORKERS)
    assert user["extraResource"]["guarantees"]["nvidia.com/gpu"] == str(rules.WORKERS)
    assert user["nodeSelector"] == {"multigpu/pool": "gpu"}
    assert user["cmd"] == "jupyterhub-singleuser" and user["uid"] != 0
    assert user["extraEnv"]["JUPYTER_CONFIG_PATH"].split(":")[-1].endswith("jupyter/learner")
    mounts = {m["name"]: m["mountPath"] for m in user["storage"]["extraVolumeMounts"]}
    hub = layout.Hub(Path(user["extraEnv"]["MULTIGPU_HUB_ROOT"]))
    assert mounts == {"learner-config": str(hub.learner_config)}, "a learner's pod mounts no shared volume"
    assert values["hub"]["config"]["JupyterHub"]["authenticator_class"] == "native"
    assert values["hub"]["config"]["NativeAuthenticator"]["open_signup"] is False


def test_grading_runs_alone_on_its_own_pool_and_the_hub_knows_it():
    values = yaml.safe_load((K8S / "values.yaml").read_text())
    docs = _docs("grading.yaml")
    deploy = docs["Deployment/multigpu-grading"]["spec"]
    assert deploy["replicas"] == 1 and deploy["strategy"]["type"] == "Recreate", "one grading at a time"
    pod = deploy["template"]["spec"]
    assert pod["nodeSelector"] == {"multigpu/pool": "grading"} != values["singleuser"]["nodeSelector"]
    (box,) = pod["containers"]
    assert box["command"][-1] == "multigpu.workshop.service"
    env = {e["name"]: e.get("value") for e in box["env"]}
    assert env["MULTIGPU_GRADING_PROFILE"] in rules.PROFILES and env["MULTIGPU_GRADING_PROFILE"] != "quick"
    assert box["resources"]["limits"]["nvidia.com/gpu"] == str(rules.WORKERS)
    service = values["hub"]["services"]["grading"]
    port = docs["Service/multigpu-grading"]["spec"]["ports"][0]["port"]
    assert service["url"] == f"http://multigpu-grading:{port}" and box["ports"][0]["containerPort"] == port
    assert "access:services!service=grading" in values["hub"]["loadRoles"]["user"]["scopes"]
    assert not any(d["spec"].get("accessModes") == ["ReadWriteMany"] for d in docs.values()
                   if d["kind"] == "PersistentVolumeClaim"), "no volume is shared with the learners"


def test_the_image_installs_the_course_with_its_pins():
    text = (K8S / "Dockerfile").read_text()
    pins = _pins()
    assert f'"torch=={pins["torch"]}"' in text and f'"jupyterhub=={pins["jupyterhub"]}"' in text
    assert "tools/install_horovod.sh" in text, "Horovod is built with the project's patch, as make setup does"
    assert re.search(r"^USER 1000$", text, re.M) and 'CMD ["jupyterhub-singleuser"]' in text
    values = yaml.safe_load((K8S / "values.yaml").read_text())
    image = values["singleuser"]["image"]
    assert f"{image['name']}:{image['tag']}" in text
    for manifest in ("grading.yaml", "ngshare.yaml"):
        assert f"{image['name']}:{image['tag']}" in (K8S / manifest).read_text()
    assert f'"ngshare=={pins["ngshare"]}"' in text
    # its declared jupyter-core<4.11.2 conflicts with the course's jupyter_server: no dependencies
    assert re.search(rf'--no-deps "ngshare_exchange=={re.escape(pins["ngshare_exchange"])}"', text)
    assert f"useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin {layout.GRADER_USER}" \
        in text, "the grading pod runs learners' notebooks as the grading account, which the image must have"
    copied = re.findall(r"^COPY (.+) /opt/course/", text, re.M)
    for part in " ".join(copied).split():
        assert (REPO / part).exists(), f"the Dockerfile copies {part}, which the repository lacks"


def test_ngshare_is_the_exchange_and_the_hub_knows_it():
    values = yaml.safe_load((K8S / "values.yaml").read_text())
    docs = _docs("ngshare.yaml")
    deploy = docs["Deployment/multigpu-ngshare"]["spec"]
    assert deploy["replicas"] == 1 and deploy["strategy"]["type"] == "Recreate", "one SQLite database"
    (box,) = deploy["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in box["env"]}
    port = docs["Service/ngshare"]["spec"]["ports"][0]["port"]
    service = values["hub"]["services"]["ngshare"]
    assert service["url"] == f"http://ngshare:{port}" and box["ports"][0]["containerPort"] == port
    assert env["JUPYTERHUB_SERVICE_URL"].endswith(f":{port}")
    assert env["JUPYTERHUB_SERVICE_NAME"] == "ngshare" and env["JUPYTERHUB_SERVICE_PREFIX"] == "/services/ngshare/"
    assert env["JUPYTERHUB_CLIENT_ID"] == "service-ngshare"
    grading_env = {e["name"]: e.get("value") for e in _docs("grading.yaml")["Deployment/multigpu-grading"]["spec"][
        "template"]["spec"]["containers"][0]["env"]}
    assert env["JUPYTERHUB_API_URL"] == grading_env["JUPYTERHUB_API_URL"]
    # the grading service reads the exchange the learners' nbgrader submits into
    learners = docs["ConfigMap/multigpu-learner-config"]["data"]["nbgrader_config.py"]
    assert f'configureExchange(c, "{grading_env["MULTIGPU_NGSHARE_URL"]}")' in learners
    assert grading_env["MULTIGPU_NGSHARE_URL"] == NGSHARE_IN_CLUSTER
    # the hub and the service hold the same token, distinct from the grading service's
    secret = docs["Secret/multigpu-ngshare-token"]["stringData"]["token"]
    ref = next(e for e in box["env"] if e["name"] == "JUPYTERHUB_API_TOKEN")["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "multigpu-ngshare-token", "key": "token"}
    assert service["apiToken"] == secret != values["hub"]["services"]["grading"]["apiToken"]
    # ngshare's admins may create courses and rosters: the hub's admins, nobody else
    args = box["command"]
    venv = args[0].removesuffix("/bin/python")
    assert args[1:3] == ["-m", "ngshare"] and venv != args[0]
    image = (K8S / "Dockerfile").read_text()
    sqlalchemy = re.search(r"^NGSHARE_SQLALCHEMY_VERSION=(\S+)", (REPO / "deploy" / "hub" / "install.sh").read_text(), re.M)
    assert sqlalchemy and sqlalchemy.group(1).startswith("1."), "ngshare 0.6.0 loses rows under SQLAlchemy 2"
    assert re.search(rf'python -m venv {venv} .*\n.*{venv}/bin/python -m pip install .*"SQLAlchemy=={sqlalchemy.group(1)}"',
                     image), "ngshare's own environment, with the SQLAlchemy it was written for"
    assert args[args.index("--admins") + 1].split(",") == values["hub"]["config"]["Authenticator"]["admin_users"]
    (mount,) = box["volumeMounts"]
    for option in ("--database", "--storage"):
        assert mount["mountPath"] in args[args.index(option) + 1], f"ngshare's {option} is on its volume"
    assert docs["PersistentVolumeClaim/multigpu-ngshare"]["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "access:services!service=ngshare" in values["hub"]["loadRoles"]["user"]["scopes"]


def test_every_users_nbgrader_sends_the_exchange_to_ngshare(monkeypatch):
    """The learners' nbgrader config (mounted in every user's pod) sets nbgrader's exchange to
    ngshare_exchange at the ngshare service's address inside the cluster, for the hub's course;
    tests/test_workshop_k8s.py's hub test runs the same text against a real ngshare."""
    from traitlets.config import Config

    values = yaml.safe_load((K8S / "values.yaml").read_text())
    calls = []
    stand_in = types.ModuleType("ngshare_exchange")
    stand_in.configureExchange = lambda c, url=None: calls.append((c, url))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ngshare_exchange", stand_in)
    config = Config()
    text = _docs("ngshare.yaml")["ConfigMap/multigpu-learner-config"]["data"]["nbgrader_config.py"]
    exec(compile(text, "nbgrader_config.py", "exec"), {"get_config": lambda: config})
    assert config.CourseDirectory.course_id == layout.COURSE_ID
    assert calls == [(config, values["hub"]["services"]["ngshare"]["url"] + "/services/ngshare")]
    assert "Exchange" not in config or "root" not in config.Exchange, "no file exchange"
    mounted = values["singleuser"]["storage"]["extraVolumes"]
    assert {"name": "learner-config", "configMap": {"name": "multigpu-learner-config"}} in mounted


# ------------------------------------------------- ngshare against a real hub (make test-hub)
PREFIX = Path(os.environ.get("MULTIGPU_HUB_PREFIX", "/opt/multigpu-hub"))
HUB_PY = PREFIX / "bin" / "python"
NGSHARE_PY = Path(os.environ.get("MULTIGPU_NGSHARE_PREFIX", "/opt/multigpu-ngshare")) / "bin" / "python"
NGSHARE_IN_CLUSTER = "http://ngshare:8080/services/ngshare"


def _why_not_live() -> str | None:
    if os.environ.get("MULTIGPU_TEST_HUB") != "1":
        return "a hub test: run it with `make test-hub` (MULTIGPU_TEST_HUB=1)"
    if not shutil.which("configurable-http-proxy"):
        return "configurable-http-proxy is not installed: run `make hub-deps`"
    for python, modules in ((HUB_PY, "jupyterhub, nbgrader"), (NGSHARE_PY, "ngshare")):
        if not python.exists() or subprocess.run([str(python), "-c", f"import {modules}"]).returncode:
            return f"{python} cannot import {modules}: run `make hub-deps`"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LiveHub:
    """A JupyterHub (any name logs in: the test never logs in, it holds each user's token) with
    ngshare as its service, as on Kubernetes; every user's nbgrader configured by the ConfigMap."""

    tmp: Path
    base: str
    ngshare: str
    admin_token: str
    proc: subprocess.Popen[bytes]
    grading_token: str  # the grading service's, as grading.yaml gives it

    def api(self, method: str, path: str, token: str, **kwargs: Any) -> Any:
        import requests

        r = requests.request(method, self.base + "/hub/api" + path, headers={"Authorization": f"token {token}"},
                             timeout=30, **kwargs)
        assert r.ok, f"{method} {path}: {r.status_code} {r.text}"
        return r.json() if r.text else None

    def token(self, user: str) -> str:
        return str(self.api("POST", f"/users/{user}/tokens", self.admin_token, json={"note": "test"})["token"])

    def exchange(self, path: str, token: str) -> tuple[int, dict[str, Any]]:
        """A GET of ngshare's API as the owner of ``token``: (status, JSON answer, or {} if none)."""
        import requests

        r = requests.get(self.ngshare + path, headers={"Authorization": f"token {token}"}, timeout=30)
        try:
            return r.status_code, r.json()
        except ValueError:
            return r.status_code, {}

    def as_user(self, user: str, token: str, *argv: str, cwd: Path, name: str | None = None) -> str:
        """Run ``argv`` in ``user``'s server's environment: their hub token, the ConfigMap's nbgrader
        config; ``name`` is what JUPYTERHUB_USER says (a learner's server lets them set it)."""
        env = {"PATH": f"{PREFIX / 'bin'}:/usr/bin:/bin", "HOME": str(cwd), "JUPYTERHUB_USER": name or user,
               "USER": name or user, "JUPYTERHUB_API_TOKEN": token, "JUPYTER_CONFIG_PATH": str(self.tmp / "etc"),
               "JUPYTER_DATA_DIR": str(cwd / ".jupyter-data")}
        out = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"{' '.join(argv)} as {user} failed:\n{out.stdout}\n{out.stderr}"
        return out.stdout + out.stderr


@pytest.fixture(scope="module")
def live_hub() -> Iterator[LiveHub]:
    why = _why_not_live()
    if why:
        pytest.skip(why)
    import requests

    tmp = Path(tempfile.mkdtemp(prefix="multigpu-ngshare-"))
    port, ngshare_port = _free_port(), _free_port()
    admin_token, grading_token = secrets.token_hex(16), secrets.token_hex(16)
    values = yaml.safe_load((K8S / "values.yaml").read_text())
    admins = values["hub"]["config"]["Authenticator"]["admin_users"]
    args = _docs("ngshare.yaml")["Deployment/multigpu-ngshare"]["spec"]["template"]["spec"]["containers"][0]["command"]
    command = [str(NGSHARE_PY), "-m", "ngshare", "--admins", args[args.index("--admins") + 1],
               "--database", f"sqlite:///{tmp}/ngshare.db", "--storage", f"{tmp}/files/"]
    config = {
        "JupyterHub": {"ip": "127.0.0.1", "port": port, "hub_port": _free_port(), "db_url": f"sqlite:///{tmp}/hub.sqlite",
                       "cookie_secret_file": f"{tmp}/cookie_secret", "authenticator_class": "dummy",
                       "services": [{"name": "ngshare", "url": f"http://127.0.0.1:{ngshare_port}", "command": command,
                                     "oauth_no_confirm": True},
                                    {"name": "tester", "api_token": admin_token},
                                    {"name": "grading", "api_token": grading_token}],
                       "load_roles": [{"name": "tester", "scopes": ["admin:users", "tokens"], "services": ["tester"]}]},
        "ConfigurableHTTPProxy": {"api_url": f"http://127.0.0.1:{_free_port()}", "pid_file": f"{tmp}/proxy.pid"},
        "Authenticator": {"allow_all": True, "admin_users": admins},
    }
    (tmp / "jupyterhub_config.py").write_text(f"import json\nc = get_config()\nc.merge(type(c)(json.loads({json.dumps(config)!r})))\n")
    text = _docs("ngshare.yaml")["ConfigMap/multigpu-learner-config"]["data"]["nbgrader_config.py"]
    assert NGSHARE_IN_CLUSTER in text
    (tmp / "etc").mkdir()
    (tmp / "etc" / "nbgrader_config.py").write_text(text.replace(NGSHARE_IN_CLUSTER,
                                                                 f"http://127.0.0.1:{ngshare_port}/services/ngshare"))
    log = open(tmp / "hub.log", "wb")
    proc = subprocess.Popen([str(HUB_PY), "-m", "jupyterhub", "-f", str(tmp / "jupyterhub_config.py")], cwd=tmp,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    hub = LiveHub(tmp, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{ngshare_port}/services/ngshare", admin_token, proc,
                  grading_token)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp / "hub.log").read_text()[-3000:]
            try:
                if all(requests.get(url, timeout=5).ok for url in (hub.base + "/hub/api", hub.ngshare + "/healthz")):
                    break
            except requests.RequestException:
                pass
            time.sleep(1)
        yield hub
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass
class Course:
    """The course in ngshare: an instructor and two learners, each with a hub token and a home."""

    hub: LiveHub
    tokens: dict[str, str]
    homes: dict[str, Path]

    def release(self, assignment: str, notebook: str = "00-welcome.ipynb") -> None:
        released = self.homes["instructor"] / "release" / assignment
        released.mkdir(parents=True)
        (released / notebook).write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
        out = self.hub.as_user("instructor", self.tokens["instructor"], NBGRADER, "release_assignment", assignment,
                               "--force", cwd=self.homes["instructor"])
        assert f"Successfully released {assignment}" in out, out

    def fetch(self, learner: str, assignment: str) -> None:
        home = self.homes[learner]
        out = self.hub.as_user(learner, self.tokens[learner], NBGRADER, "fetch_assignment", assignment, cwd=home)
        assert (home / assignment).is_dir() and any((home / assignment).glob("*.ipynb")), (out, sorted(home.rglob("*")))


NBGRADER = str(PREFIX / "bin" / "nbgrader")
MANAGE = str(PREFIX / "bin" / "ngshare-course-management")
#: ngshare wants an instructor's names and address: docs/workshop.md's command gives these
GRADING_NAME = ("-f", "Grading", "-l", "Service", "-e", "grading@localhost")


@pytest.fixture(scope="module")
def course(live_hub: LiveHub) -> Course:
    hub = live_hub
    hub.api("POST", "/users", hub.admin_token, json={"usernames": ["instructor", "alice", "bob"]})
    tokens = {u: hub.token(u) for u in ("instructor", "alice", "bob")}
    homes = {u: hub.tmp / "home" / u for u in tokens}
    for home in homes.values():
        home.mkdir(parents=True)
    hub.as_user("instructor", tokens["instructor"], MANAGE, "create_course", layout.COURSE_ID, "instructor",
                cwd=homes["instructor"])
    for learner in ("alice", "bob"):
        hub.as_user("instructor", tokens["instructor"], MANAGE, "add_student", layout.COURSE_ID, learner, "--no-gb",
                    cwd=homes["instructor"])
    return Course(hub, tokens, homes)


@pytest.mark.slow
def test_ngshare_names_each_submitter_by_their_hub_token(course):
    """The instructor releases Lab 0 through ngshare with the ConfigMap's nbgrader config; a
    learner fetches and submits it; another, pretending to be the first (JUPYTERHUB_USER is theirs
    to set), is recorded as themself, and can read neither the first's submission nor feedback."""
    hub, tokens, homes = course.hub, course.tokens, course.homes
    course.release("lab-00")
    for learner in ("alice", "bob"):
        course.fetch(learner, "lab-00")
    hub.as_user("alice", tokens["alice"], NBGRADER, "submit", "lab-00", cwd=homes["alice"])
    hub.as_user("bob", tokens["bob"], NBGRADER, "submit", "lab-00", cwd=homes["bob"], name="alice")

    status, listed = hub.exchange(f"/submissions/{layout.COURSE_ID}/lab-00", tokens["instructor"])
    assert status == 200 and sorted(s["student_id"] for s in listed["submissions"]) == ["alice", "bob"], listed
    for path in (f"/submissions/{layout.COURSE_ID}/lab-00", f"/submission/{layout.COURSE_ID}/lab-00/alice",
                 f"/submissions/{layout.COURSE_ID}/lab-00/alice"):
        status, answer = hub.exchange(path, tokens["bob"])
        assert status == 403 and answer["success"] is False, f"bob read {path}: {answer}"
    status, own = hub.exchange(f"/submissions/{layout.COURSE_ID}/lab-00/bob", tokens["bob"])
    assert status == 200 and [s["student_id"] for s in own["submissions"]] == ["bob"]
    status, answer = hub.exchange(f"/submissions/{layout.COURSE_ID}/lab-00/alice", "not-a-hub-token")
    assert status >= 400 and not answer.get("success"), "a token the hub does not know reads nothing"


@pytest.mark.slow
def test_the_grading_service_reads_submissions_from_ngshare_and_returns_feedback_through_it(course, tmp_path,
                                                                                            monkeypatch):
    """What the grading service does on Kubernetes (multigpu.workshop.ngshare), against the real
    ngshare: with its own hub token, once the instructor has made it one of the course's
    instructors, it lists a learner's submission, downloads its files and uploads feedback that
    the learner fetches from their Assignments tab. Before that, and for a learner's token,
    ngshare lists nothing."""
    from multigpu.workshop import grading, jobs, ngshare
    from multigpu.workshop import service as workshop_service
    from multigpu.workshop.layout import Hub

    hub, tokens, homes = course.hub, course.tokens, course.homes
    course.release("lab-01", "01-gd-vs-sgd.ipynb")
    course.fetch("alice", "lab-01")
    (homes["alice"] / "lab-01" / "answer.txt").write_text("alice's work")
    hub.as_user("alice", tokens["alice"], NBGRADER, "submit", "lab-01", cwd=homes["alice"])
    service = ngshare.Ngshare(hub.ngshare, hub.grading_token)
    with pytest.raises(ngshare.NgshareError, match="403"):
        service.submissions()
    hub.as_user("instructor", tokens["instructor"], MANAGE, "add_instructor", layout.COURSE_ID, "grading",
                *GRADING_NAME,
                cwd=homes["instructor"])
    subs = [s for s in service.submissions() if s.assignment == "lab-01"]
    assert [s.student for s in subs] == ["alice"], subs
    # the service's queue and the grading job's first step, as on the grading pod
    box = Hub(tmp_path / "hub")
    queue = jobs.Queue(box.queue_db)
    queued = {(j.student, j.assignment): j for j in workshop_service.scan(box, queue, service)}
    assert ("alice", "lab-01") in queued, queued
    assert not workshop_service.scan(box, queue, service), "a submission is queued once"
    monkeypatch.setenv(ngshare.URL_VAR, hub.ngshare)
    monkeypatch.setenv(ngshare.TOKEN_VAR, hub.grading_token)
    dest = grading.collect(box, queued[("alice", "lab-01")])
    assert dest == box.course / "submitted" / "alice" / "lab-01"
    assert (dest / "answer.txt").read_text() == "alice's work" and (dest / "01-gd-vs-sgd.ipynb").is_file()
    assert (dest / layout.STAMP_FILE).read_text() == subs[0].timestamp
    assert grading.released_labs(box) == ["lab-00", "lab-01"]
    feedback = tmp_path / "feedback"
    feedback.mkdir()
    (feedback / "01-gd-vs-sgd.html").write_text("<p>alice: 3 of 14 points</p>")
    assert service.upload_feedback(subs[0], feedback) == ["01-gd-vs-sgd.html"]
    hub.as_user("alice", tokens["alice"], NBGRADER, "fetch_feedback", "lab-01", cwd=homes["alice"])
    pages = sorted((homes["alice"] / "lab-01" / "feedback").rglob("*.html"))
    assert [p.read_text() for p in pages] == ["<p>alice: 3 of 14 points</p>"], pages
    with pytest.raises(ngshare.NgshareError, match="403"):
        ngshare.Ngshare(hub.ngshare, tokens["bob"]).submissions()
