"""What a learner's server may write to the hub's log (multigpu.workshop.serverlog): empty lines
cost nothing, the budget counts the bytes written (prefix included) and outlives a restart of the
server, and a new hour gives a new one."""

from __future__ import annotations

import asyncio
import io
import os

from multigpu.workshop import serverlog


def feed(log: serverlog.ServerLog, write: int, data: bytes) -> None:
    """``data`` through the pipe, then its end, as the server's output."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        loop.add_reader(log.fd, log.readable)
        for i in range(0, len(data), 1 << 15):
            os.write(write, data[i:i + (1 << 15)])
            await asyncio.sleep(0)
            log.readable()
        os.close(write)
        log.readable()

    asyncio.run(run())


def server(tmp_path, now, monkeypatch, budget=2000):
    monkeypatch.setattr(serverlog, "LOG_BYTES", budget)
    read, write = os.pipe()
    out = io.StringIO()
    return serverlog.ServerLog(read, "ann", budgets=tmp_path / "budgets", clock=lambda: now[0], out=out), write, out


def test_empty_lines_cost_nothing_and_the_budget_counts_what_is_written(tmp_path, monkeypatch):
    now = [1000.0]
    log, write, out = server(tmp_path, now, monkeypatch)
    feed(log, write, b"\n" * 100_000 + b"   \n\x1b[31mred\n" + b"Setting new xsrf cookie for b'x'\n" + b"y" * 50 + b"\n")
    assert out.getvalue() == "[server of ann] ?[31mred\n" + "[server of ann] " + "y" * 50 + "\n"
    assert (tmp_path / "budgets" / "ann").read_text().split() == ["1000.0", str(len(out.getvalue().encode()))]


def test_a_restart_of_the_server_keeps_the_hours_budget_and_a_new_hour_gives_a_new_one(tmp_path, monkeypatch):
    now = [1000.0]
    log, write, out = server(tmp_path, now, monkeypatch)
    feed(log, write, b"x" * 100 + b"\n" + b"z\n" * 200)
    first = out.getvalue()
    assert len(first.encode()) < 2000 + 200 and "past 0 MB, is not logged" in first
    now[0] = 1500.0  # the server restarted within the hour: nothing more
    log, write, out = server(tmp_path, now, monkeypatch)
    feed(log, write, b"again\n" * 10)
    assert out.getvalue() == ""
    now[0] = 1000.0 + serverlog.WINDOW_S  # an hour on
    log, write, out = server(tmp_path, now, monkeypatch)
    feed(log, write, b"again\n")
    assert out.getvalue() == "[server of ann] again\n"
