"""The hub's proxy (configurable-http-proxy), run as a process of its own.

Every learner's JupyterLab and kernel websockets pass through the proxy. JupyterHub, when it
starts the proxy itself, stops the one an earlier hub left running and starts its own, so a hub
restart would cut every open connection. ``multigpu workshop hub`` therefore starts the proxy
(:func:`ensure`, before JupyterHub) and tells the hub not to (``hubconfig``): a hub restart then
leaves the proxy, its routes and every learner's open connections alone; the hub's own pages
answer the proxy's 503 for the seconds the hub takes to start. ``multigpu workshop stop`` stops it.

The proxy terminates HTTPS when the hub is given a certificate (``make hub TLS_CERT=... TLS_KEY=...``).
Its settings are kept in ``state/proxy.json``: a proxy started with other settings (another port,
another certificate) is stopped and started again.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from multigpu.workshop.layout import Hub

START_S = 30


@dataclass(frozen=True)
class Settings:
    ip: str
    port: int
    api_port: int
    hub_port: int
    tls_cert: str = ""
    tls_key: str = ""

    def command(self) -> list[str]:
        cmd = [shutil.which("configurable-http-proxy") or "configurable-http-proxy",
               "--ip", self.ip, "--port", str(self.port), "--api-ip", "127.0.0.1", "--api-port", str(self.api_port),
               "--error-target", f"http://127.0.0.1:{self.hub_port}/hub/error", "--log-level", "warn"]
        if self.tls_cert:
            cmd += ["--ssl-cert", self.tls_cert, "--ssl-key", self.tls_key]
        return cmd


def token(hub: Hub) -> str:
    """The secret the hub and the proxy share for the proxy's API (``state/proxy-token``, root only)."""
    path = hub.state / "proxy-token"
    if not path.exists():
        hub.state.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return path.read_text().strip()


def pid_file(hub: Hub) -> Path:
    return hub.state / "proxy.pid"


def running_pid(hub: Hub) -> int | None:
    """The proxy this hub started, if it still runs."""
    import psutil

    try:
        pid = int(pid_file(hub).read_text().strip())
        cmdline = " ".join(psutil.Process(pid).cmdline())
    except (OSError, ValueError, psutil.Error):
        return None
    return pid if "configurable-http-proxy" in cmdline else None


def listening(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0


def log_name(hub: Hub) -> str:
    """The name under which the proxy's output has its budget (``serverlog``), removed by ``make hub-stop``."""
    return f"proxy-{hub.tag}"


def ensure(hub: Hub, settings: Settings) -> int:
    """The proxy's pid: the one already running with these settings, or a new one."""
    recorded = hub.state / "proxy.json"
    pid = running_pid(hub)
    if pid is not None:
        try:
            same = json.loads(recorded.read_text()) == asdict(settings)
        except (OSError, ValueError):
            same = False
        if same:
            return pid
        stop(hub)
    env = dict(os.environ, CONFIGPROXY_AUTH_TOKEN=token(hub))
    # its output through serverlog's bounds into proxy.log: a 503 line holds the whole URL a visitor chose
    read, write = os.pipe()
    subprocess.Popen([sys.executable, "-m", "multigpu.workshop.serverlog", "--name", log_name(hub),
                      "--out", str(hub.state / "proxy.log")], stdin=read, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        proc = subprocess.Popen(settings.command(), env=env, stdin=subprocess.DEVNULL, stdout=write, stderr=write,
                                start_new_session=True)
    finally:
        os.close(read)
        os.close(write)
    pid_file(hub).write_text(str(proc.pid))
    recorded.write_text(json.dumps(asdict(settings)))
    deadline = time.monotonic() + START_S
    while not (listening(settings.api_port) and listening(settings.port, "127.0.0.1" if settings.ip in ("", "0.0.0.0")
                                                           else settings.ip)):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = (hub.state / "proxy.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"configurable-http-proxy did not start on port {settings.port}:\n{tail}")
        time.sleep(0.2)
    return proc.pid


def stop(hub: Hub, timeout: float = 10) -> bool:
    """Stop the proxy this hub started; whether there was one."""
    import psutil

    pid = running_pid(hub)
    pid_file(hub).unlink(missing_ok=True)
    if pid is None:
        return False
    try:
        proc = psutil.Process(pid)
        proc.terminate()
        proc.wait(timeout)
    except psutil.TimeoutExpired:
        proc.kill()
    except psutil.NoSuchProcess:
        pass
    return True
