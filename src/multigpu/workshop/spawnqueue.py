"""A room logging in at once: servers start a few at a time, the others wait their turn.

Starting a learner's JupyterLab is CPU work (a second or more of imports and extensions). Thirty
started at once share the learners' cores and all become ready at the very end; started a few at
a time, the first are working in seconds and the median halves. JupyterHub's own
``concurrent_spawn_limit`` refuses the spawns past its limit ("Too many users trying to log in
right now", HTTP 429): here they wait instead, in order of arrival, and the spawn page shows each
learner their place (``WorkshopSpawner.progress``). A place is held from the fork until the
server answers on its port, so the limit bounds the expensive part.

While no grading runs, a starting server may use every core of the box (the grading cores too):
its start does not queue behind the room on the learners' cores alone. Once it answers it is
narrowed to the learners' cores (``limits.set_cores``), where it stays.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

#: Servers starting at once when ``MULTIGPU_SPAWN_LIMIT`` does not say (at least 2: part of a
#: start waits on the hub's API, not on a core).
MIN_LIMIT = 2


def default_limit(cores: int) -> int:
    return max(MIN_LIMIT, cores)


class SpawnQueue:
    """First come, first served places for ``limit`` starts at a time (one hub process, one loop)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the spawn limit must be at least 1, not {limit}")
        self.limit = limit
        self.active = 0
        self.waiting: list[str] = []
        self.changed: asyncio.Condition | None = None

    def place(self, name: str) -> int | None:
        """1 for the next to start; None when ``name`` is not waiting."""
        return self.waiting.index(name) + 1 if name in self.waiting else None

    async def enter(self, name: str) -> None:
        if self.changed is None:
            self.changed = asyncio.Condition()
        self.waiting.append(name)
        try:
            async with self.changed:
                await self.changed.wait_for(lambda: self.waiting[0] == name and self.active < self.limit)
                self.waiting.pop(0)
                self.active += 1
                self.changed.notify_all()
        except BaseException:  # a cancelled spawn gives up its place
            if name in self.waiting:
                self.waiting.remove(name)
            raise

    async def leave(self) -> None:
        assert self.changed is not None
        async with self.changed:
            self.active -= 1
            self.changed.notify_all()

    async def progress(self, name: str) -> AsyncIterator[dict[str, Any]]:
        """Events for JupyterHub's spawn page while ``name`` waits for its place."""
        while (place := self.place(name)) is not None:
            ahead = f"{place - 1} learner{'s' if place != 2 else ''} ahead of you" if place > 1 else "you are next"
            yield {"progress": 5, "message": f"Waiting to start: {self.active} servers starting, {ahead}"}
            await asyncio.sleep(1)


QUEUE: SpawnQueue | None = None


def queue(cores: int) -> SpawnQueue:
    """The hub's one queue (``MULTIGPU_SPAWN_LIMIT`` starts at a time, default :func:`default_limit`)."""
    global QUEUE
    if QUEUE is None:
        QUEUE = SpawnQueue(int(os.environ.get("MULTIGPU_SPAWN_LIMIT") or default_limit(cores)))
    return QUEUE


async def until_listening(ip: str, port: int, alive: Any, timeout: float) -> bool:
    """Wait until a server answers on ``ip:port``; False when ``alive()`` (a coroutine function
    returning None while the process runs) says it exited, or after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    host = "127.0.0.1" if ip in ("", "0.0.0.0") else ip
    while loop.time() < deadline:
        try:
            _reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 2)
            writer.close()
            return True
        except (OSError, asyncio.TimeoutError, socket.gaierror):
            pass
        if await alive() is not None:
            return False
        await asyncio.sleep(0.2)
    return False
