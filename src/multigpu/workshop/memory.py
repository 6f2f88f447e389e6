"""What a learner's server costs in memory: the PSS of every process of their Unix account (the
server, its kernels, their workers), shared pages (torch's libraries, mapped by every kernel)
counted once across the box rather than once per process. Root reads it (``/proc/PID/smaps_rollup``)."""

from __future__ import annotations

import pwd
import threading
from typing import Any


def user_pss_mb(names: list[str]) -> dict[str, float]:
    """``{login: MB}``: the summed PSS of each account's processes now."""
    import psutil

    uids = {pwd.getpwnam(n).pw_uid: n for n in names}
    total = {n: 0.0 for n in names}
    for proc in psutil.process_iter(["uids"]):
        uid = proc.info["uids"].real if proc.info["uids"] else None
        if uid in uids:
            try:
                total[uids[uid]] += proc.memory_full_info().pss / 2**20
            except psutil.Error:  # gone since the list was taken
                continue
    return {n: round(mb, 1) for n, mb in total.items()}


class PeakSampler:
    """The largest :func:`user_pss_mb` of each account while the ``with`` block runs."""

    def __init__(self, names: list[str], interval: float = 1.0) -> None:
        self.names, self.interval = names, interval
        self.peaks: dict[str, float] = {n: 0.0 for n in names}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)

    def sample(self) -> None:
        while not self.stop.is_set():
            for name, mb in user_pss_mb(self.names).items():
                self.peaks[name] = max(self.peaks[name], mb)
            self.stop.wait(self.interval)

    def __enter__(self) -> PeakSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join()


def system_used_gb() -> float:
    """The box's memory in use (total less available), GB."""
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) for line in f}
    return round((info["MemTotal"] - info["MemAvailable"]) / 2**20, 2)
