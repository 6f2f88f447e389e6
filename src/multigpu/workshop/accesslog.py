"""A request log that no visitor can grow without bound: the hub's (``hubconfig``) and the grading
service's (``service``) tornado ``log_function``.

Every request a web server answers is one line of its log, and anyone who reaches the port chooses
how many requests and how long their URLs are: a flood of 404s with long URLs, from a learner's
kernel or from the room's network before any login, would otherwise fill the box's disk wherever the
operator keeps the hub's output. Here each line names the request's path cut at :data:`PATH_CHARS`
(its query, where tokens travel, is never written) and the lines take at most :data:`RATE` bytes a
second (about 2 MB an hour) after a burst of :data:`BURST`; the requests past that are counted, by
who made them, and once a minute at most one line says how many were not logged and whose most
were. The server's other loggers, which a request can make write as well, pass at most
:data:`RECORD_RATE` bytes a second after a burst of 250 KB, each line cut at 1000 characters and no
URL's query shown (:class:`BoundedRecords`: about 3.6 MB an hour); JupyterHub's line for each
visitor without an xsrf cookie (it holds the cookie's value) is not written at all. A flood then
adds at most about 6 MB an hour to the log, whatever it sends.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

#: Bytes a second, on average, that request lines take, and the burst allowed above it.
RATE = 600.0
BURST = 100_000.0
#: The longest path a line shows.
PATH_CHARS = 200
#: What a line costs besides its text: the log's own prefix (``[W 2026-11-28 18:20:01.123 JupyterHub
#: log:191] ``) and the newline.
LINE_EXTRA = 60
#: At most one line in this many seconds says what was left out; it names at most
#: :data:`WHO_SHOWN` of those who made the requests (counted for at most :data:`WHO_KEPT`).
SUMMARY_S = 60.0
WHO_SHOWN, WHO_KEPT = 3, 1000

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
    """At most ``rate`` a second on average, ``burst`` at once: :meth:`take` says whether ``cost`` more
    may go, and :meth:`left_out` how many did not since it was last asked (then resets)."""

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

    def left_out(self, what: str = "lines") -> str:
        """Words for the ``what`` left out since the last call ("" when none)."""
        if not self.dropped:
            return ""
        said = (f"{self.dropped} {what} in the last {self.last - self.dropped_since:.1f} s were not logged "
                f"(more than {self.rate:.0f} bytes a second)")
        self.dropped = 0
        return said


class BoundedLog:
    """``log_function`` for ``tornado.web.Application``; ``also`` is called for every request, logged
    or not (JupyterHub's request metrics)."""

    def __init__(self, rate: float = RATE, burst: float = BURST, also: Callable[[Any], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, log: logging.Logger = access_log) -> None:
        self.bucket, self.also, self.log, self.clock = Bucket(rate, burst, clock), also, log, clock
        self.who: Counter[str] = Counter()
        self.said = -SUMMARY_S

    def __call__(self, handler: Any) -> None:
        if self.also is not None:
            self.also(handler)
        level = level_of(handler)
        if not self.log.isEnabledFor(level):
            return
        line = line_of(handler)
        if self.bucket.take(len(line) + LINE_EXTRA):
            self.summary()
            self.log.log(level, line)
            return
        who = f"{user_of(handler)[:40]}@{handler.request.remote_ip}"
        if who in self.who or len(self.who) < WHO_KEPT:
            self.who[who] += 1
        else:
            self.who["others"] += 1
        if self.clock() - self.said >= SUMMARY_S:
            self.summary()

    def summary(self) -> None:
        """The line that says what was left out, at most once in :data:`SUMMARY_S` (a line written
        sooner waits for the next)."""
        if not self.bucket.dropped or self.clock() - self.said < SUMMARY_S:
            return
        most = ", ".join(f"{who} {n}" for who, n in self.who.most_common(WHO_SHOWN))
        self.log.warning(f"{self.bucket.left_out('requests')}; the most from: {most}")
        self.who.clear()
        self.said = self.clock()


#: The longest message a line of a server's own loggers shows, and what a traceback counts for.
RECORD_CHARS, TRACEBACK_BYTES = 1000, 4000
#: Bytes a second, on average, that a server's own loggers take.
RECORD_RATE = 1000.0
#: A URL's query in a message (tornado's line for an HTTP error shows the whole URL): shown as ``?...``.
QUERY = re.compile(r"(/[^\s?]*)\?[^\s)]*")


class BoundedRecords(logging.Filter):
    """A filter for a server's own loggers (JupyterHub's and tornado's, which a request can make
    write: an uncaught exception's line holds the whole URL): lines that hold a secret and come
    once per visitor (JupyterHub's "Setting new xsrf cookie for ...", one per request without a
    cookie) are dropped, a URL's query is shown as ``?...``, each message is cut at
    :data:`RECORD_CHARS`, and at most ``rate`` bytes a second pass after a burst of ``burst`` (a
    traceback counted as :data:`TRACEBACK_BYTES`); the next line that passes says how many did not."""

    DROPPED = ("Setting new xsrf cookie",)

    def __init__(self, rate: float = RECORD_RATE, burst: float = 250_000.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.bucket = Bucket(rate, burst, clock)

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(self.DROPPED):
            return False
        message = QUERY.sub(r"\1?...", record.getMessage())
        if len(message) > RECORD_CHARS:
            message = message[:RECORD_CHARS] + f"...({len(message)} chars)"
        if not self.bucket.take(len(message) + (TRACEBACK_BYTES if record.exc_info else 0)):
            return False
        left_out = self.bucket.left_out("log lines")
        record.msg, record.args = f"[{left_out}] {message}" if left_out else message, ()
        return True


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
