"""Calls made from inside a network namespace (``ip netns add NAME``), for a hub that runs in
one: the hub on the Slurm test cluster (``tests/test_cluster_hub.py``) lives in the controller's
namespace, where the nodes' addresses exist, and its learners' HTTP calls must start there too.

A thread may join another network namespace on its own (``setns(2)`` changes the calling thread
only), and the sockets it opens stay in that namespace; the rest of the process is unchanged.
Root only (CAP_SYS_ADMIN).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

#: ``CLONE_NEWNET`` of <sched.h>: setns(2) joins a network namespace
CLONE_NEWNET = 0x40000000

T = TypeVar("T")


def path(name: str) -> str:
    """Where ``ip netns`` keeps the namespace ``name``."""
    return f"/run/netns/{name}"


def prefix(name: str) -> list[str]:
    """What runs a command inside the namespace ``name`` (its other namespaces are the caller's)."""
    return ["nsenter", f"--net={path(name)}"]


def join(name: str) -> None:
    """Move the calling thread into the network namespace ``name``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path(name), os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def call_in(name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` run in a thread of its own inside the namespace ``name``: its
    value, or its exception raised here."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            join(name)
            result["value"] = fn(*args, **kwargs)
        except BaseException as e:  # handed to the caller
            result["error"] = e

    thread = threading.Thread(target=run, name=f"netns-{name}", daemon=True)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]
