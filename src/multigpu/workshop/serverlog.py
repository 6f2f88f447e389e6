"""What a learner's server may write to the hub's log (:mod:`namespaces` copies its output there), and
the proxy to its own (:func:`main`).

The server's output (its stdout and stderr, and every kernel's, which inherit them) is the
learner's to choose: each line goes to the hub's log under the learner's name, control characters
(escape sequences) shown as ``?``, cut at 2000 characters; empty lines are not written (a line of
``"\\n"`` would cost the log its prefix); and each learner has :data:`LOG_BYTES` an hour, counted in
bytes written, prefix included. The budget is kept across the server's restarts in
:data:`BUDGETS` (root's, on ``/run``: a reboot forgets it), so stopping and starting one's server
does not give a fresh one. Past it the output is read and dropped (the server never blocks on a full
pipe), once said. JupyterLab's own "Setting new xsrf cookie" lines (they hold the cookie) are dropped.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

#: Bytes of one learner's server output the hub's log takes in an hour.
LOG_BYTES = 10 * 2**20
WINDOW_S = 3600.0
#: Where each learner's use of the hour is kept (one small file per learner).
BUDGETS = Path("/run/multigpu/server-log")
#: The budget's file is written again after this many more bytes, and when the output ends.
SAVE_EVERY = 64 * 2**10
DROPPED = ("Setting new xsrf cookie",)
_CONTROL = {c: "?" for c in [*range(0, 9), *range(10, 32), 127]}


class ServerLog:
    """Reads the pipe ``fd`` (its reader in the event loop: :meth:`readable`) and writes the lines
    to ``out`` (the hub's log: this process's stderr) as the module doc says."""

    def __init__(self, fd: int, user: str, budgets: Path = BUDGETS, clock: Callable[[], float] = time.time,
                 out: TextIO | None = None, prefix: str | None = None) -> None:
        self.fd, self.user, self.partial = fd, user, b""
        self.prefix = f"[server of {user}] " if prefix is None else prefix
        self.budgets, self.clock, self.out = budgets, clock, out
        self.window, self.written = self.load()
        self.saved = self.written
        os.set_blocking(fd, False)

    def load(self) -> tuple[float, int]:
        now = self.clock()
        try:
            start, used = (self.budgets / self.user).read_text().split()
            if now - float(start) < WINDOW_S:
                return float(start), int(used)
        except (OSError, ValueError):
            pass
        return now, 0

    def save(self) -> None:
        try:
            self.budgets.mkdir(parents=True, exist_ok=True, mode=0o700)
            made = self.budgets / f".{self.user}.new"
            made.write_text(f"{self.window} {self.written}\n")
            made.replace(self.budgets / self.user)
            self.saved = self.written
        except OSError as e:  # the log goes on; only a restart's fresh budget is at stake
            self.write(f"{self.prefix}(its log budget could not be kept: {e})\n")

    def write(self, text: str) -> None:
        (self.out or sys.stderr).write(text)

    def readable(self) -> None:
        try:
            chunk = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return
        if not chunk:
            asyncio.get_running_loop().remove_reader(self.fd)
        self.feed(chunk)

    def feed(self, chunk: bytes) -> None:
        """One read's bytes (``b""``: the output ended)."""
        if not chunk:
            chunk, self.partial = self.partial + b"\n" if self.partial else b"", b""
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        if len(self.partial) > 2000:
            self.partial = self.partial[:2000]
        for raw in lines:
            self.line(raw[:2000].decode("utf-8", "replace").translate(_CONTROL))
        if not chunk or self.written - self.saved >= SAVE_EVERY:
            self.save()
        (self.out or sys.stderr).flush()

    def line(self, text: str) -> None:
        if not text.strip() or any(d in text for d in DROPPED):
            return
        now = self.clock()
        if now - self.window >= WINDOW_S:
            self.window, self.written = now, 0
        if self.written >= LOG_BYTES:
            return
        line = self.prefix + text + "\n"
        self.written += len(line.encode())
        if self.written >= LOG_BYTES:
            line = f"{self.prefix}{text} (the rest of {self.user}'s server output this hour, past " \
                   f"{LOG_BYTES // 2**20} MB, is not logged)\n"
            self.save()
        self.write(line)


def main(argv: list[str] | None = None) -> int:
    """``python -m multigpu.workshop.serverlog --name NAME --out FILE``: standard input into FILE
    under the same rules and budget (``NAME``'s): the proxy's output (``proxy.ensure``), which anyone
    who reaches the room's port can make long (a 503 line holds the whole URL)."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--name", required=True)
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args(argv)
    with open(args.out, "a", encoding="utf-8", errors="replace") as out:
        log = ServerLog(0, args.name, out=out, prefix="")
        os.set_blocking(0, True)
        while chunk := os.read(0, 1 << 16):
            log.feed(chunk)
        log.feed(b"")
    return 0


if __name__ == "__main__":
    sys.exit(main())
