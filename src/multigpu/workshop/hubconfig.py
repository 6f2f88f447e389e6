"""JupyterHub's configuration for a workshop (``jupyter/hub/jupyterhub_config.py`` calls
:func:`configure`; ``make hub`` starts it).

- Accounts: PAM against the box's Unix users (``accounts`` makes them). PAM needs nothing beyond
  the box itself (no identity provider, no internet for the room, works on an air-gapped box),
  and since JupyterHub's local process spawner runs each server as the Unix user that logged in,
  the kernel's file permissions are what keep learners apart. Only members of the workshop's
  groups may log in; instructors are hub admins. Each sender's logins are checked a few at a time
  (``loginlimit``): PAM's slow refusals of one learner's flood hold no one else's login.
- Servers: :class:`WorkshopSpawner`, JupyterHub's ``LocalProcessSpawner`` that also confines each
  server (``limits.confine``: its own cgroup, the learners' cores only) and runs it, as its user,
  in PID, network, IPC and mount namespaces of its own (``namespaces``: no user sees another's
  processes, reaches their jobs' ports or leaves shared memory behind). A learner's server is
  JupyterLab as ``make lab`` configures it (``jupyter/learner``) plus nbgrader's exchange; the
  instructor's serves the hub course with the formgrader (``jupyter/instructor``).
- The grading service (``multigpu.workshop.service``), started and restarted by the hub.
- What a hub left running for a day needs: the idle culler (:func:`culler_service`; a busy kernel
  counts as activity, ``busykernels``), servers started a few at a time (``spawnqueue``), the proxy
  as a process of its own that a hub restart leaves alone (``proxy``), HTTPS (``tls``).

Settings come from the environment ``make hub`` passes (every one has a default):
``MULTIGPU_HUB_ROOT``, ``MULTIGPU_HUB_IP``/``_PORT`` (the address learners open),
``MULTIGPU_HUB_INTERNAL_PORT``, ``MULTIGPU_PROXY_API_PORT``, ``MULTIGPU_GRADING_PORT``,
``MULTIGPU_HUB_INSTRUCTORS`` (comma-separated logins), ``MULTIGPU_GRADING_CORES`` (cores kept for
grading), ``MULTIGPU_LEARNER_CPUS``, ``MULTIGPU_LEARNER_MEM_GB`` and ``MULTIGPU_LEARNER_PIDS`` (each
learner server's share), ``MULTIGPU_GRADING_PIDS``, ``MULTIGPU_GRADING_MEM_GB`` and
``MULTIGPU_GRADING_DISK_MB`` (a grading's),
``MULTIGPU_HUB_TLS_CERT``/``_KEY`` (HTTPS), ``MULTIGPU_CULL_TIMEOUT``/``_EVERY`` (seconds; timeout 0:
no culler), ``MULTIGPU_SPAWN_LIMIT`` (servers starting at once), ``MULTIGPU_HUB_URL`` (the address
learners and certificate verifiers use, when it is not ``http(s)://IP:PORT``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from multigpu.core import layout as course_layout
from multigpu.workshop import accesslog, copies, jobs, layout, limits, loginlimit, proxy, spawnqueue
from multigpu.workshop.layout import Hub

try:
    from jupyterhub.spawner import LocalProcessSpawner
except ImportError:  # the course's own venv has no JupyterHub; only the hub's environment needs it
    LocalProcessSpawner = object

#: Defaults of one learner server's share (a 4-worker lab job uses 2 cores well; see docs/workshop.md).
LEARNER_CPUS = 2.0
LEARNER_MEM_GB = 4.0
#: Processes and threads of one learner server at most: a fork bomb stops there (a 4-worker lab
#: job with its kernel and server uses about 150).
LEARNER_PIDS = 1024


#: What the grading service takes from the hub's environment (``make hub`` and the tests set them).
SERVICE_VARS = ("MULTIGPU_GRADING_PROFILE", "MULTIGPU_QUICK", "MULTIGPU_QUEUE_LIMIT", "MULTIGPU_GRADING_TIMEOUT",
                "MULTIGPU_GRADING_NOTEBOOK_S",
                "MULTIGPU_CERTIFICATE_KEY", "MULTIGPU_GRADING_PIDS", "MULTIGPU_GRADING_MEM_GB", "MULTIGPU_GRADING_JOB_MEM_GB",
                "MULTIGPU_SANDBOX_USER", "MULTIGPU_GRADING_DISK_MB",
                "PATH")
#: The idle culler's defaults: a server nobody used for an hour (no open tab, no busy kernel) is
#: stopped, checked every 5 minutes; the learner's files stay, a new login starts it again.
CULL_TIMEOUT_S = 3600
CULL_EVERY_S = 300
#: How often a server tells the hub of its activity (JupyterHub's default is 300 s).
ACTIVITY_INTERVAL_S = 60


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


def learner_may_listen(port: int) -> bool:
    """Whether an account without privileges may listen on ``port`` on this box."""
    try:
        start = int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text())
    except (OSError, ValueError):
        start = 1024
    return port >= start


def internal_ports() -> dict[str, int]:
    """The hub's own ports on 127.0.0.1 (``layout.HUB_INTERNAL_PORT`` ...), by the variable that
    sets each."""
    return {"MULTIGPU_HUB_INTERNAL_PORT": env_int("MULTIGPU_HUB_INTERNAL_PORT", layout.HUB_INTERNAL_PORT),
            "MULTIGPU_PROXY_API_PORT": env_int("MULTIGPU_PROXY_API_PORT", layout.PROXY_API_PORT),
            "MULTIGPU_GRADING_PORT": env_int("MULTIGPU_GRADING_PORT", layout.GRADING_PORT)}


def warn_of_learner_ports(ports: dict[str, int]) -> None:
    """Name in the hub's log each of its own ports a learner's process may listen on."""
    for name, number in ports.items():
        if learner_may_listen(number):
            print(f"WARNING: {name}={number}: a learner's process may listen there while the hub restarts and "
                  "answer on the hub's origin; use a port below 1024", file=sys.stderr, flush=True)


def instructors() -> list[str]:
    return [s.strip() for s in os.environ.get("MULTIGPU_HUB_INSTRUCTORS", layout.INSTRUCTOR).split(",") if s.strip()]


def cores() -> tuple[list[int], list[int]]:
    """(learner cores, grading cores) for this box (``MULTIGPU_GRADING_CORES`` reserves that many)."""
    reserved = os.environ.get("MULTIGPU_GRADING_CORES")
    return limits.split_cores(reserved=int(reserved) if reserved else None)


def server_env(hub: Hub, instructor: bool) -> dict[str, str]:
    """The environment of one user's server (learners: ``make lab``'s config plus the exchange)."""
    repo = course_layout.course_root()
    view = "instructor" if instructor else "learner"
    # nbgrader reads nbgrader_config.py from these folders: the hub course's own for the
    # instructor (the formgrader's course root), the exchange's settings for learners
    # jupyter/hub-server: what only a hub's servers need (a busy kernel counts as activity; the
    # terminal's shell keeps this PATH)
    paths = [str(hub.course if instructor else hub.learner_config), str(repo / "jupyter" / view),
             str(repo / "jupyter" / "hub-server")]
    bindir = str(Path(sys.executable).parent)
    return {
        "JUPYTER_CONFIG_PATH": os.pathsep.join(paths),
        "PATH": os.pathsep.join([bindir, "/usr/local/bin", "/usr/bin", "/bin"]),
        "MULTIGPU_HUB_ROOT": str(hub.root),
        "JUPYTERHUB_ACTIVITY_INTERVAL": str(env_int("MULTIGPU_ACTIVITY_INTERVAL", ACTIVITY_INTERVAL_S)),
        **{k: v for k, v in os.environ.items() if k == "MULTIGPU_BUSY_INTERVAL"},
    }


class WorkshopSpawner(LocalProcessSpawner):
    """LocalProcessSpawner that confines each server (see ``limits``), runs it in its user's own
    namespaces (see ``namespaces``) and gives instructors and learners their own view."""

    def is_instructor(self) -> bool:
        return self.user.name in instructors()

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        env.update(server_env(Hub.default(), self.is_instructor()))
        return env

    #: The cores a starting server may use (``spawnqueue``: every core while no grading runs).
    spawn_cores: list[int] | None = None
    port: int  # JupyterHub's traits, as this class uses them
    cmd: list[str]

    async def start(self) -> Any:
        hub = Hub.default()
        open_on(self, hub, self.is_instructor())
        if self.port == 0:
            from jupyterhub.utils import random_port

            self.port = random_port()
        self.cmd = server_command(self.user.name, self.port, self.cmd, None if self.is_instructor() else hub)
        learner_cores, grading_cores = cores()
        queue = spawnqueue.queue(len(set(learner_cores) | set(grading_cores)))
        await queue.enter(self.user.name)
        try:
            idle = jobs.Queue(hub.queue_db).count("running") == 0
            self.spawn_cores = sorted(set(learner_cores) | set(grading_cores)) if idle else learner_cores
            ip, port = await super().start()
            await spawnqueue.until_listening(ip, port, self.poll, self.http_timeout)
        finally:
            await queue.leave()
            if self.spawn_cores != learner_cores and self.pid:
                limits.set_cores(f"user-{self.user.name}", self.pid, learner_cores)
            self.spawn_cores = None
        return ip, port

    async def progress(self) -> Any:
        async for event in spawnqueue.queue(1).progress(self.user.name):
            yield event

    async def stop(self, now: bool = False) -> None:
        await super().stop(now=now)
        limits.release(f"user-{self.user.name}")

    def make_preexec_fn(self, name: str) -> Any:
        learner_cores, _grading = cores()
        learner_cores = self.spawn_cores or learner_cores
        cpu = None if self.is_instructor() else float(os.environ.get("MULTIGPU_LEARNER_CPUS") or LEARNER_CPUS)
        mem = None if self.is_instructor() else int(float(os.environ.get("MULTIGPU_LEARNER_MEM_GB") or LEARNER_MEM_GB) * 2**30)
        pids = None if self.is_instructor() else env_int("MULTIGPU_LEARNER_PIDS", LEARNER_PIDS)
        group = f"user-{name}"

        def confine() -> None:  # in the forked child, as root: it becomes the user inside its namespaces
            limits.confine(group, os.getpid(), cores=learner_cores, cpu_limit=cpu, mem_limit=mem, pids_limit=pids)

        return confine


def open_on(spawner: Any, hub: Hub, instructor: bool) -> None:
    """Where a user's JupyterLab opens: an instructor's in the hub's course, at its sources."""
    if instructor:
        spawner.notebook_dir = str(hub.course)
        spawner.default_url = "/lab/tree/source"
    else:
        spawner.default_url = "/lab"


def server_command(name: str, port: int, cmd: list[str], learners_hub: Hub | None = None) -> list[str]:
    """A user's server command, run as that user in namespaces of their own (``namespaces``): the
    proxy reaches it at ``127.0.0.1:port`` and it reaches the hub's API; nothing else crosses.
    Its shared memory is bounded by a learner's memory share; a learner's (``learners_hub``) sees
    that hub's exchange read-only, its inbound folder their own (``inbound``), and every other copy
    of the course they could read as an empty folder (``copies.to_hide``)."""
    if "multigpu.workshop.namespaces" in cmd:
        return cmd  # already wrapped (a restart of the same spawner)
    hub_port = internal_ports()["MULTIGPU_HUB_INTERNAL_PORT"]
    shm = int(float(os.environ.get("MULTIGPU_LEARNER_MEM_GB") or LEARNER_MEM_GB) * 2**30)
    return [sys.executable, "-I", "-m", "multigpu.workshop.namespaces", "--user", name, "--port", str(port),
            "--relay", str(hub_port), "--shm-bytes", str(shm),
            *(["--exchange", str(learners_hub.exchange), "--inbound", str(learners_hub.inbound)] if learners_hub else []),
            *[arg for copy in (copies.to_hide() if learners_hub else []) for arg in ("--hide", str(copy))],
            "--", *cmd]


def tls_files() -> tuple[str, str] | None:
    """The certificate and key the proxy serves (``MULTIGPU_HUB_TLS_CERT``/``_KEY``), or None: HTTP."""
    cert, key = os.environ.get("MULTIGPU_HUB_TLS_CERT", ""), os.environ.get("MULTIGPU_HUB_TLS_KEY", "")
    if bool(cert) != bool(key):
        raise ValueError("HTTPS needs both a certificate and its key (make hub TLS_CERT=... TLS_KEY=...)")
    return (str(Path(cert).resolve()), str(Path(key).resolve())) if cert else None


def proxy_settings() -> proxy.Settings:
    """The proxy of this hub (``multigpu workshop hub`` starts it, the hub's config points at it)."""
    tls = tls_files()
    internal = internal_ports()
    return proxy.Settings(ip=os.environ.get("MULTIGPU_HUB_IP", "127.0.0.1"), port=env_int("MULTIGPU_HUB_PORT", 8000),
                          api_port=internal["MULTIGPU_PROXY_API_PORT"], hub_port=internal["MULTIGPU_HUB_INTERNAL_PORT"],
                          tls_cert=tls[0] if tls else "", tls_key=tls[1] if tls else "")


def public_url() -> str:
    """The hub's address for learners and for certificate verifiers (``MULTIGPU_HUB_URL``, else
    ``http(s)://IP:PORT``, the box's name for 0.0.0.0)."""
    given = os.environ.get("MULTIGPU_HUB_URL")
    if given:
        return given.rstrip("/")
    import socket

    settings = proxy_settings()
    host = socket.getfqdn() if settings.ip in ("", "0.0.0.0") else settings.ip
    return f"{'https' if settings.tls_cert else 'http'}://{host}:{settings.port}"


def issuer_url() -> str:
    """Where the hub publishes the issuer files its certificates name (the grading service's
    ``issuer/``: the public key, the status list, the verification page), unless
    ``MULTIGPU_ISSUER_URL`` names another place the instructor publishes them."""
    return os.environ.get("MULTIGPU_ISSUER_URL") or public_url() + "/services/grading/issuer"


def culler_service() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """JupyterHub's idle culler as a hub service, and its role: ``([service], [role])``, or
    nothing with ``MULTIGPU_CULL_TIMEOUT=0``. It stops a server whose last activity is older than
    the timeout; an open JupyterLab tab (it polls its server) and a busy kernel (``busykernels``)
    are activity, the grading service is not a server and is never culled."""
    timeout = env_int("MULTIGPU_CULL_TIMEOUT", CULL_TIMEOUT_S)
    if timeout <= 0:
        return [], []
    every = env_int("MULTIGPU_CULL_EVERY", CULL_EVERY_S)
    service = {"name": "idle-culler", "command": [sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={timeout}",
                                                  f"--cull-every={every}", "--cull-admin-users=false"]}
    role = {"name": "idle-culler", "services": ["idle-culler"],
            "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]}
    return [service], [role]


def configure(c: Any) -> None:
    """Fill JupyterHub's config object ``c`` (see the module doc)."""
    hub = Hub.default()
    hub.state.mkdir(parents=True, exist_ok=True)
    ports = internal_ports()
    warn_of_learner_ports(ports)
    grading_port = ports["MULTIGPU_GRADING_PORT"]
    settings = proxy_settings()
    c.JupyterHub.bind_url = f"{'https' if settings.tls_cert else 'http'}://{settings.ip}:{settings.port}"
    c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{settings.hub_port}"
    # the proxy is a process of its own (``proxy``: started by ``multigpu workshop hub``), so a hub
    # restart leaves it, its routes and every open connection alone
    c.ConfigurableHTTPProxy.should_start = False
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{settings.api_port}"
    c.ConfigurableHTTPProxy.auth_token = proxy.token(hub)
    c.JupyterHub.db_url = f"sqlite:///{hub.state / 'jupyterhub.sqlite'}"
    c.JupyterHub.cookie_secret_file = str(hub.state / "jupyterhub_cookie_secret")
    c.JupyterHub.pid_file = str(hub.state / "jupyterhub.pid")
    # a hub restart leaves running servers alone; they are found again
    c.JupyterHub.cleanup_servers = False
    c.JupyterHub.cleanup_proxy = False
    # a room logging in at once waits in ``spawnqueue`` (JupyterHub's own limit would refuse them)
    c.JupyterHub.concurrent_spawn_limit = 0
    # anyone who reaches the hub chooses how many requests it logs, and how long their URLs are
    c.JupyterHub.tornado_settings = {"log_function": accesslog.for_the_hub()}

    c.JupyterHub.authenticator_class = loginlimit.AUTHENTICATOR  # PAM, each source's logins bounded
    c.PAMAuthenticator.allowed_groups = {layout.LEARNERS_GROUP, layout.INSTRUCTORS_GROUP}
    c.PAMAuthenticator.open_sessions = False
    c.Authenticator.admin_users = set(instructors())

    c.JupyterHub.spawner_class = WorkshopSpawner
    c.Spawner.cmd = [str(Path(sys.executable).parent / "jupyterhub-singleuser")]
    # extra arguments of every user's server (tests: --LabApp.expose_app_in_browser=True)
    c.Spawner.args = os.environ.get("MULTIGPU_HUB_SERVER_ARGS", "").split()
    # a start may wait its turn in ``spawnqueue`` first, and a busy box imports slowly
    c.Spawner.start_timeout = 900
    c.Spawner.http_timeout = 300
    learner_cores, grading_cores = cores()
    culler, culler_roles = culler_service()
    c.JupyterHub.services = [*culler, {
        "name": "grading",
        "url": f"http://127.0.0.1:{grading_port}",
        "command": [sys.executable, "-m", "multigpu.workshop.service"],
        "environment": {"MULTIGPU_HUB_ROOT": str(hub.root), "MULTIGPU_GRADING_CORES_LIST": limits.cpulist(grading_cores),
                        "MULTIGPU_HUB_INSTRUCTORS": ",".join(instructors()), "MULTIGPU_ISSUER_URL": issuer_url(),
                        **{k: v for k, v in os.environ.items() if k in SERVICE_VARS}},
        "display": True,
        "oauth_no_confirm": True,
    }]
    c.JupyterHub.load_roles = [
        # every user may open the grading service's page (it shows each learner only their own)
        {"name": "user", "scopes": ["self", "access:services!service=grading"]},
        *culler_roles,
    ]
