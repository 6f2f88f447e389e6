"""One learner at a workshop hub, driven the way their browser drives it (the room load test,
``roomload``, and the hub tests): the hub's login form, the spawn and its progress events, the
JupyterLab page, a kernel over its websocket, a terminal over its websocket, and nbgrader's
Assignments tab (the same requests the tab's buttons send).

HTTP through ``requests`` and websockets through ``websocket-client`` (both come with JupyterHub
and Jupyter Server in the hub's environment): plain blocking calls, one thread per learner.
"""

from __future__ import annotations

import json
import ssl
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from multigpu.workshop import layout


class LearnerError(RuntimeError):
    """A step a learner's browser would have shown as an error; the message says which."""


@dataclass
class Execution:
    seconds: float
    status: str  # "ok", "error" or "died" (the kernel was killed or restarted while it ran)
    output: str
    error: str = ""


@dataclass
class Learner:
    base: str
    name: str
    password: str
    verify: str | None = None  # the hub's self-signed certificate, when it serves HTTPS
    session: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        import requests

        self.session = requests.Session()
        self.session.verify = self.verify or True

    @property
    def user_url(self) -> str:
        return f"{self.base}/user/{self.name}"

    def _xsrf(self, path: str) -> str:
        for cookie in self.session.cookies:
            if cookie.name == "_xsrf" and cookie.path.rstrip("/") == path.rstrip("/"):
                return str(cookie.value)
        return ""

    def login(self, timeout: float = 120) -> None:
        """The login form: fetch it (its XSRF cookie), post the login and password, follow the
        redirects as a browser does (they start the server)."""
        self.session.get(f"{self.base}/hub/login", timeout=timeout)
        r = self.session.post(f"{self.base}/hub/login", timeout=timeout,
                              data={"username": self.name, "password": self.password, "_xsrf": self._xsrf("/hub/")})
        if "/hub/login" in r.url or r.status_code >= 400:
            why = "invalid login or password" if "Invalid username or password" in r.text else f"HTTP {r.status_code}"
            raise LearnerError(f"{self.name}: the login form refused the login ({why})")

    def wait_ready(self, timeout: float = 900) -> list[str]:
        """Follow the spawn's progress events until the server is ready, then load JupyterLab's
        page; the progress messages seen (the spawn queue's among them)."""
        messages: list[str] = []
        url = f"{self.base}/hub/api/users/{self.name}/server/progress"
        deadline = time.monotonic() + timeout
        ready = False
        while not ready and time.monotonic() < deadline:
            with self.session.get(url, stream=True, timeout=(30, timeout),
                                  headers={"X-XSRFToken": self._xsrf("/hub/")}) as r:
                if r.status_code == 400 and "not running" not in r.text.lower():
                    raise LearnerError(f"{self.name}: spawn progress: HTTP 400 {r.text[:200]}")
                for line in r.iter_lines(decode_unicode=True):
                    if not line or not line.startswith("data:"):
                        continue
                    event = json.loads(line[5:])
                    if event.get("message"):
                        messages.append(event["message"])
                    if event.get("failed"):
                        raise LearnerError(f"{self.name}: the spawn failed: {event.get('message')}")
                    if event.get("ready"):
                        ready = True
                        break
            if not ready:
                time.sleep(1)
        page = self.session.get(f"{self.user_url}/lab", timeout=max(30.0, deadline - time.monotonic()))
        if page.status_code != 200 or not page.url.rstrip("/").endswith("/lab"):
            raise LearnerError(f"{self.name}: JupyterLab did not open (HTTP {page.status_code} at {page.url})")
        return messages

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        """A call to the learner's own server (``/user/<name>/<path>``) with its XSRF header."""
        headers = {"X-XSRFToken": self._xsrf(f"/user/{self.name}/"), **kwargs.pop("headers", {})}
        r = self.session.request(method, f"{self.user_url}/{path}", headers=headers, timeout=kwargs.pop("timeout", 300),
                                 **kwargs)
        if r.status_code >= 400:
            raise LearnerError(f"{self.name}: {method} {path}: HTTP {r.status_code} {r.text[:300]}")
        return r.json() if r.content else None

    def assignment(self, action: str, assignment: str) -> Any:
        """What the Assignments tab's Fetch / Submit / Fetch Feedback buttons send."""
        out = self.api("POST", f"assignments/{action}", data={"course_id": layout.COURSE_ID, "assignment_id": assignment})
        if not out or not out.get("success"):
            raise LearnerError(f"{self.name}: {action} {assignment} failed: {str(out)[-500:]}")
        return out["value"]

    def _websocket(self, path: str) -> Any:
        import websocket

        url = ("wss" if self.base.startswith("https") else "ws") + self.user_url[self.user_url.index(":"):] + "/" + path
        cookies = "; ".join(f"{c.name}={c.value}" for c in self.session.cookies
                            if c.path == "/" or c.path.rstrip("/") in (f"/user/{self.name}", "/hub"))
        sslopt = {"ca_certs": self.verify} if self.verify else {"cert_reqs": ssl.CERT_REQUIRED}
        return websocket.create_connection(url, cookie=cookies, sslopt=sslopt if self.base.startswith("https") else None,
                                           timeout=60)

    def start_kernel(self) -> str:
        return str(self.api("POST", "api/kernels", json={"name": "python3"})["id"])

    def execute(self, kernel: str, code: str, timeout: float = 600) -> Execution:
        """Run ``code`` in ``kernel`` through its websocket, as a notebook cell; its outputs."""
        ws = self._websocket(f"api/kernels/{kernel}/channels?session_id={uuid.uuid4().hex}")
        msg_id = uuid.uuid4().hex
        ws.send(json.dumps({"header": {"msg_id": msg_id, "username": self.name, "session": uuid.uuid4().hex,
                                       "msg_type": "execute_request", "version": "5.3"},
                            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                            "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                                        "allow_stdin": False, "stop_on_error": True}}))
        import websocket

        start = time.monotonic()
        out: list[str] = []
        error, status, idle = "", "", False
        try:
            while not (status and idle):
                left = timeout - (time.monotonic() - start)
                if left <= 0:
                    raise LearnerError(f"{self.name}: the cell did not finish within {timeout:.0f} s")
                ws.settimeout(left)  # a cell may print nothing for minutes
                try:
                    msg = json.loads(ws.recv())
                except (websocket.WebSocketException, OSError) as e:
                    raise LearnerError(f"{self.name}: the kernel's websocket failed: {e!r}") from None
                kind, content = msg["msg_type"], msg["content"]
                if kind == "status" and content["execution_state"] in ("restarting", "dead"):
                    return Execution(round(time.monotonic() - start, 2), "died", "".join(out),
                                     f"the kernel died ({content['execution_state']})")
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                if kind == "stream":
                    out.append(content["text"])
                elif kind == "error":
                    error = f"{content['ename']}: {content['evalue']}"
                elif kind == "execute_reply":
                    status = content["status"]
                elif kind == "status" and content["execution_state"] == "idle":
                    idle = True
        finally:
            ws.close()
        return Execution(round(time.monotonic() - start, 2), status, "".join(out), error)

    def terminal(self, command: str, expect: str, timeout: float = 60) -> str:
        """Open a JupyterLab terminal, type ``command``, return what it printed up to ``expect``."""
        name = self.api("POST", "api/terminals")["name"]
        ws = self._websocket(f"terminals/websocket/{quote(name)}")
        seen = ""
        try:
            ws.send(json.dumps(["stdin", command + "\r"]))
            deadline = time.monotonic() + timeout
            while expect not in seen.split(command, 1)[-1] and time.monotonic() < deadline:
                msg = json.loads(ws.recv())
                if msg[0] == "stdout":
                    seen += msg[1]
        finally:
            ws.close()
            self.api("DELETE", f"api/terminals/{quote(name)}")
        return seen

    def stop_server(self) -> None:
        r = self.session.delete(f"{self.base}/hub/api/users/{self.name}/server",
                                headers={"X-XSRFToken": self._xsrf("/hub/")}, timeout=120)
        if r.status_code not in (202, 204):
            raise LearnerError(f"{self.name}: stopping the server: HTTP {r.status_code} {r.text[:200]}")
