"""The hub's and the grading service's request log (multigpu.workshop.accesslog) on a real tornado
server: a flood of long-URL 404s adds a bounded number of short lines, no query (tokens) is ever
written, and the log says how many requests it left out."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import time

from tornado import httpclient, httpserver, web

from multigpu.workshop import accesslog


class Hello(web.RequestHandler):
    def get(self) -> None:
        self.write("hello")


def flood(log: accesslog.BoundedLog, paths: list[str]) -> list[int]:
    """Serve an app that logs through ``log`` on a free loopback port and request every path of
    ``paths`` from it (ten at a time); the answers' status codes."""

    async def run() -> list[int]:
        app = web.Application([(r"/hello", Hello)], log_function=log)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        sock.setblocking(False)
        server = httpserver.HTTPServer(app)
        server.add_sockets([sock])
        port = sock.getsockname()[1]
        client = httpclient.AsyncHTTPClient(force_instance=True, max_clients=10)
        try:
            answers = await asyncio.gather(*[client.fetch(f"http://127.0.0.1:{port}{p}", raise_error=False)
                                             for p in paths])
        finally:
            client.close()
            server.stop()
        return [a.code for a in answers]

    return asyncio.run(run())


def test_a_flood_of_long_urls_writes_a_bounded_number_of_short_lines_and_says_what_it_left_out(caplog):
    caplog.set_level(logging.DEBUG, logger="tornado.access")
    log = accesslog.BoundedLog(rate=1000.0, burst=5000.0)
    long = "/x" + "y" * 8000
    began = time.monotonic()
    codes = flood(log, [f"{long}{i}?token=SECRET{i}" for i in range(300)] + ["/hello?token=SECRET"])
    took = time.monotonic() - began
    assert codes == [404] * 300 + [200]
    lines = [r.getMessage() for r in caplog.records if r.name == "tornado.access"]
    written = sum(len(line) + 1 for line in lines)
    # 301 requests of 8 KB each: a plain log would hold 2.4 MB; this one holds the burst and the rate,
    # and at most one line a minute on what it left out
    assert written <= 5000 + 1000 * took + 400, (written, took)
    assert all(len(line) < 350 for line in lines), max(lines, key=len)
    assert not [line for line in lines if "SECRET" in line], "a query (where tokens travel) was logged"
    said = [line for line in lines if "were not logged" in line]
    assert len(said) == 1 and re.fullmatch(r"1 requests in the last 0\.0 s were not logged \(more than 1000 bytes a "
                                           r"second\); the most from: @127\.0\.0\.1 1", said[0]), said
    first = lines[0]
    assert re.fullmatch(r"404 GET /xy{198}\.\.\.\(800[3-5] chars\)\?\.\.\. \(@127\.0\.0\.1\) [0-9.]+ms", first), first


def test_within_its_rate_every_request_is_logged_at_jupyterhubs_levels(caplog):
    caplog.set_level(logging.DEBUG, logger="tornado.access")
    seen: list[int] = []
    log = accesslog.BoundedLog(rate=1000.0, burst=1000.0, also=lambda h: seen.append(h.get_status()))
    assert flood(log, ["/hello", "/nothing", "/hello"]) == [200, 404, 200]
    records = [(r.levelno, r.getMessage().split()[0]) for r in caplog.records if r.name == "tornado.access"]
    assert sorted(records) == [(logging.INFO, "200"), (logging.INFO, "200"), (logging.WARNING, "404")]
    assert sorted(seen) == [200, 200, 404], "the metrics hook missed a request"
    assert not [r for r in caplog.records if "not logged" in r.getMessage()]


def test_the_bucket_refills_at_its_rate_and_once_a_minute_a_line_says_whose_requests_were_left_out():
    now = [0.0]
    lines: list[str] = []

    class Log(logging.Logger):
        def log(self, level, msg, *args, **kwargs):
            lines.append(msg % args if args else msg)

        def warning(self, msg, *args, **kwargs):
            lines.append(msg % args if args else msg)

    class Request:
        path, query, method, remote_ip = "/p", "", "GET", "10.0.0.1"

        def request_time(self) -> float:
            return 0.001

    class Handler:
        request = Request()
        current_user = None

        def get_status(self) -> int:
            return 404

    class Learner(Handler):
        current_user = {"name": "ann"}

    cost = len(accesslog.line_of(Handler())) + accesslog.LINE_EXTRA
    log = accesslog.BoundedLog(rate=2.0 * cost, burst=3.0 * cost, clock=lambda: now[0], log=Log("t"))
    for _ in range(10):
        log(Handler())
    assert len(lines) == 3 + 1, lines  # the burst, then at once a line that lines are being left out
    assert lines[3] == (f"1 requests in the last 0.0 s were not logged (more than {2 * cost} bytes a second); "
                        "the most from: @10.0.0.1 1")
    now[0] = 1.0  # two lines' worth back; no second word on what is left out within the minute
    for _ in range(5):
        log(Handler())
    for _ in range(4):
        log(Learner())
    assert len(lines) == 4 + 2
    now[0] = 61.0
    log(Handler())
    assert lines[6] == (f"13 requests in the last 61.0 s were not logged (more than {2 * cost} bytes a second); "
                        "the most from: @10.0.0.1 9, ann@10.0.0.1 4") and len(lines) == 8


def test_the_hubs_own_lines_lose_the_xsrf_values_and_pass_at_their_rate():
    now = [0.0]
    bounded = accesslog.BoundedRecords(rate=36.0, burst=60.0, clock=lambda: now[0])  # 18 bytes a line
    log = logging.getLogger("multigpu-test-bounded-records")
    log.propagate = False
    kept: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            kept.append(record.getMessage())

    log.addHandler(Keep())
    log.addFilter(bounded)
    log.setLevel(logging.INFO)
    log.info("Setting new xsrf cookie for b'None:secret' {'path': '/hub/'}")
    for i in range(10):
        log.warning("Failed login for %s", f"x{i}")
    now[0] = 1.0
    log.warning("Failed login for %s", "y")
    assert kept == ["Failed login for x0", "Failed login for x1", "Failed login for x2",
                    "[7 log lines in the last 1.0 s were not logged (more than 36 bytes a second)] Failed login for y"], kept
    log.removeFilter(bounded)
    log.addFilter(accesslog.BoundedRecords())
    log.warning("%s", "u" * 5000)
    assert kept[-1] == "u" * 1000 + "...(5000 chars)"
    log.warning("403 GET /hub/api/users?token=SECRET&x=1 (127.0.0.1): Forbidden; then /a/b?c=d")
    assert kept[-1] == "403 GET /hub/api/users?... (127.0.0.1): Forbidden; then /a/b?...", kept[-1]
