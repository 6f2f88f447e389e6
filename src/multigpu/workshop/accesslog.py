"""A request log that no visitor can grow without bound: the hub's (``hubconfig``) and the grading
service's (``service``) tornado ``log_function``.

Every request a web server answers is one line of its log, and anyone who reaches the port chooses
how many requests and how long their URLs are: a flood of 404s with long URLs, from a learner's
kernel or from the room's network before any login, would otherwise fill the box's disk wherever the
operator keeps the hub's output. Here each line names the request's path cut at :data:`PATH_CHARS`
(its query, where tokens travel, is never written) and at most :data:`RATE` lines a second are
written (a burst of :data:`BURST` first); the requests past that are counted, and the next line
written says how many were not. A flood then adds at most about ``RATE x 300`` bytes a second
(about 22 MB an hour), whatever it sends. The server's other loggers, which a request can make
write as well, pass at most 5 KB a second after a burst of 250 KB, each line cut at 1000
characters (:class:`BoundedRecords`: about 18 MB an hour); JupyterHub's line for each visitor
without an xsrf cookie (it holds the cookie's value) is not written at all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

#: Lines a second, on average, and the burst allowed above it.
RATE = 20.0
BURST = 200.0
#: The longest path a line shows.
PATH_CHARS = 200

access_log = logging.getLogger("tornado.access")


def level_of(handler: Any) -> int:
    """JupyterHub's levels: redirects and successes info (static files and 304 debug), client
    errors warning, server errors error; a slow answer (1 s or more) is info at least."""
    status = handler.get_status()
    static = type(handler).__name__ in ("StaticFileHandler", "CacheControlStaticFilesHandler", "HealthCheckHandler")
    if status == 304 or (status < 300 and static):
        level = logging.DEBUG
    elif status < 400:
        level = logging.INFO
    elif status < 500:
        level = logging.WARNING
    else:
        level = logging.ERROR
    if handler.request.request_time() >= 1.0:
        level = max(level, logging.INFO)
    return level


def user_of(handler: Any) -> str:
    try:
        user = handler.current_user
    except Exception:  # a handler whose login check fails here (a bad token, no hub) logs no name
        return ""
    if isinstance(user, dict):
        return str(user.get("name", ""))
    return str(getattr(user, "name", user or ""))


def line_of(handler: Any) -> str:
    request = handler.request
    path = request.path
    shown = path[:PATH_CHARS] + (f"...({len(path)} chars)" if len(path) > PATH_CHARS else "")
    query = "?..." if request.query else ""
    return (f"{handler.get_status()} {request.method[:10]} {shown!s}{query} "
            f"({user_of(handler)[:40]}@{request.remote_ip}) {1000.0 * request.request_time():.2f}ms")


class Bucket:
    """At most ``rate`` a second on average, ``burst`` at once: :meth:`take` says whether one more
    may go, and :meth:`left_out` how many did not since the last that went (then resets)."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens, self.last, self.dropped, self.dropped_since = burst, clock(), 0, 0.0

    def take(self, cost: float = 1.0) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens < cost:
            if not self.dropped:
                self.dropped_since = now
            self.dropped += 1
            return False
        self.tokens -= cost
        return True

    def left_out(self) -> str:
        """Words for the lines left out since the last one that went ("" when none)."""
        if not self.dropped:
            return ""
        said = (f"{self.dropped} requests in the last {self.last - self.dropped_since:.1f} s were not logged "
                f"(more than {self.rate:.0f} a second)")
        self.dropped = 0
        return said


class BoundedLog:
    """``log_function`` for ``tornado.web.Application``; ``also`` is called for every request, logged
    or not (JupyterHub's request metrics)."""

    def __init__(self, rate: float = RATE, burst: float = BURST, also: Callable[[Any], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, log: logging.Logger = access_log) -> None:
        self.bucket, self.also, self.log = Bucket(rate, burst, clock), also, log

    def __call__(self, handler: Any) -> None:
        if self.also is not None:
            self.also(handler)
        level = level_of(handler)
        if not self.log.isEnabledFor(level) or not self.bucket.take():
            return
        left_out = self.bucket.left_out()
        if left_out:
            self.log.warning(left_out)
        self.log.log(level, line_of(handler))


class BoundedRecords(logging.Filter):
    """A filter for a server's own loggers (JupyterHub's and tornado's, which a request can make
    write: an uncaught exception's line holds the whole URL): lines that hold a secret and come
    once per visitor (JupyterHub's "Setting new xsrf cookie for ...", one per request without a
    cookie) are dropped, each message is cut at :data:`RECORD_CHARS`, and at most ``rate`` bytes a
    second pass after a burst of ``burst`` (a traceback counted as :data:`TRACEBACK_BYTES`); the next
    line that passes says how many did not."""

    DROPPED = ("Setting new xsrf cookie",)

    def __init__(self, rate: float = 5000.0, burst: float = 250_000.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.bucket = Bucket(rate, burst, clock)

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(self.DROPPED):
            return False
        message = record.getMessage()
        if len(message) > RECORD_CHARS:
            message = message[:RECORD_CHARS] + f"...({len(message)} chars)"
        if not self.bucket.take(len(message) + (TRACEBACK_BYTES if record.exc_info else 0)):
            return False
        left_out = self.bucket.left_out().replace("requests", "log lines")
        record.msg, record.args = f"[{left_out}] {message}" if left_out else message, ()
        return True


#: The longest message a line of a server's own loggers shows, and what a traceback counts for.
RECORD_CHARS, TRACEBACK_BYTES = 1000, 4000


def bound_loggers(names: tuple[str, ...]) -> None:
    """:class:`BoundedRecords` on each logger of ``names`` (one budget for them all)."""
    bounded = BoundedRecords()
    for name in names:
        logging.getLogger(name).addFilter(bounded)


#: The loggers a request can make write on the hub (tornado's access log has its own bound).
HUB_LOGGERS = ("JupyterHub", "tornado.application", "tornado.general")


def for_the_hub() -> BoundedLog:
    """The hub's request log (JupyterHub's request metrics kept); its own loggers bounded too."""
    bound_loggers(HUB_LOGGERS)
    try:
        from jupyterhub.log import prometheus_log_method
    except ImportError:  # pragma: no cover - the hub's environment has JupyterHub
        return BoundedLog()
    return BoundedLog(also=prometheus_log_method)
