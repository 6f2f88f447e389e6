"""Logins checked a few at a time per source, so that no one's flood of wrong passwords delays the room.

PAM answers a wrong password after about 2 s (pam_unix's delay against guessing), on one of the
authenticator's threads. With nothing else, one learner's kernel sending a hundred wrong logins at
once held every thread, and another learner's login waited two minutes. Here each source (a
laptop's address, or a learner's server: :func:`multigpu.workshop.namespaces.loopback_of`) has
:data:`PER_SOURCE` checks running and :data:`WAITING_PER_SOURCE` waiting, at most; its further
attempts fail at once, as a wrong password does. A source's attempts beyond that cost the hub a
failed request each, never a thread, and :data:`THREADS` threads leave room for many sources.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

#: PAM checks of one source running at once, and waiting behind them, at most.
PER_SOURCE = 2
WAITING_PER_SOURCE = 20
#: The authenticator's threads (each check of a wrong password sleeps in PAM, using no CPU).
THREADS = 16
#: The root side's own address: a request from it came through the proxy, which names its sender.
PROXY_PEERS = ("127.0.0.1", "::1", "::ffff:127.0.0.1")


def source_of(handler: Any) -> str:
    """Who sends a login: the connection's peer, or, for a request through the proxy (the root
    side's loopback), the address the proxy saw (the last of X-Forwarded-For, which it appends; a
    sender cannot put another after it). A learner's server reaches the hub directly, from an
    address of its own, so a forged X-Forwarded-For does not change its source."""
    request = handler.request
    try:
        peer = request.connection.stream.socket.getpeername()[0]
    except (AttributeError, OSError, TypeError, IndexError):
        peer = ""
    return str(request.remote_ip) if peer in PROXY_PEERS or not peer else str(peer)


@dataclass
class Gate:
    """One source's checks: those running (``slots``), and those running or waiting (``holding``)."""

    slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(PER_SOURCE))
    holding: int = 0


class Gates:
    """Every source's :class:`Gate` (one is forgotten when its source has nothing running or waiting)."""

    def __init__(self) -> None:
        self.gates: dict[str, Gate] = {}

    async def run(self, source: str, check: Callable[[], Awaitable[Any]]) -> Any:
        """``check()``'s answer, once one of ``source``'s slots is free; None at once when its slots
        and waiting places are all taken."""
        gate = self.gates.setdefault(source, Gate())
        if gate.holding >= PER_SOURCE + WAITING_PER_SOURCE:
            return None  # the login page says the name or password is wrong; the hub's log, a failed login
        gate.holding += 1
        try:
            async with gate.slots:
                return await check()
        finally:
            gate.holding -= 1
            if gate.holding == 0:
                self.gates.pop(source, None)


#: How the hub's configuration names the authenticator (the module's ``RoomAuthenticator``).
AUTHENTICATOR = f"{__name__}.RoomAuthenticator"


def __getattr__(name: str) -> type:
    """``RoomAuthenticator``: JupyterHub's PAM authenticator (the box's accounts), each source's
    checks bounded by :class:`Gates`, on :data:`THREADS` threads. Built when the hub imports it:
    only the hub has JupyterHub."""
    if name != "RoomAuthenticator":
        raise AttributeError(f"module {__name__} has no attribute {name!r}")
    from jupyterhub.auth import PAMAuthenticator
    from traitlets import Integer

    class RoomAuthenticator(PAMAuthenticator):
        executor_threads = Integer(THREADS, config=True, help="threads that run PAM's checks")

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.gates = Gates()

        async def authenticate(self, handler: Any, data: dict[str, str]) -> Any:
            source = source_of(handler) if handler is not None else ""
            return await self.gates.run(source, lambda: super(RoomAuthenticator, self).authenticate(handler, data))

    globals()[name] = RoomAuthenticator
    return RoomAuthenticator
