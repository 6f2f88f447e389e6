"""Emulated network links: a Horovod job whose workers talk over a loopback limited to a rate.

Lab 4 runs the course's jobs as if their workers were on machines joined by a 100
Mb/s, 1 Gb/s or 10 Gb/s link, on one box and without root: the job starts in a new user
namespace with its own network namespace (``unshare --user --map-root-user --net``), whose only
interface is a loopback of its own; ``tc``'s token bucket filter (``tbf``) on it limits every byte
the workers send each other. What this machine showed (2026-11-24 21:51, the 2-core CPU machine,
Horovod 0.28.1 over Gloo, 2 workers, a 4 MiB all-reduce, ``make bench``'s links section, which
times with :func:`multigpu.running.hvdtools.allreduce_times`): 5.5 ms on the namespace's unlimited
loopback, 8.4 ms at 10 Gb/s, 67.6 ms at 1 Gb/s and 675 ms at 100 Mb/s, against 6.7, 67 and 671 ms
that :func:`predicted_allreduce_s` gives for the link alone: the slower the link, the more of the
time it explains. Three facts shape the module:

- ``burst`` must hold at least one full-size segment of the loopback (its MTU, 65,536 bytes): with
  a smaller bucket Gloo's connections time out ("Read error ... Connection timed out").
- One ``tbf`` on the loopback is a *shared* medium: the time is all workers' bytes over the rate,
  not each worker's bytes over a link of its own (:func:`predicted_allreduce_s`).
- Over MPI the workers of one machine exchange data through shared memory and never touch the
  loopback: a job on an emulated link runs Horovod over Gloo (TCP).

Where user namespaces are not allowed (hardened kernels), :func:`unavailable` says so and how to
allow them; nothing falls back silently.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: tbf's bucket in bytes: four full-size loopback segments (the MTU, 65,536 bytes, is the least
#: that works; see the module doc).
BURST_BYTES = 4 * 65536
#: How long a packet may wait in tbf's queue before it is dropped (TCP resends it).
QUEUE_LATENCY_MS = 50
#: The links Lab 4 compares, in bits per second (None: the namespace's loopback, unlimited).
PRESETS: dict[str, float | None] = {"100 Mb/s": 100e6, "1 Gb/s": 1e9, "10 Gb/s": 10e9, "unlimited": None}


@dataclass(frozen=True)
class EmulatedLink:
    """A job's network: its own loopback, limited to ``rate_bps`` bits per second (None: unlimited)."""

    rate_bps: float | None = None

    def __post_init__(self) -> None:
        if self.rate_bps is not None and not self.rate_bps > 0:
            raise ValueError(f"a link's rate must be > 0 bits/s (None: unlimited), got {self.rate_bps}")

    @property
    def label(self) -> str:
        if self.rate_bps is None:
            return "unlimited loopback"
        for name, rate in PRESETS.items():
            if rate == self.rate_bps:
                return name
        return f"{self.rate_bps / 1e6:g} Mb/s"

    def setup_script(self) -> str:
        """The shell lines run inside the new namespace before the job (then ``exec "$@"``)."""
        lines = ["ip link set lo up"]
        if self.rate_bps is not None:
            lines.append(f"tc qdisc add dev lo root tbf rate {int(self.rate_bps)}bit "
                         f"burst {BURST_BYTES} latency {QUEUE_LATENCY_MS}ms")
        return " && ".join(lines + ['exec "$@"'])

    def why_unavailable(self) -> str | None:
        """None where emulated links work on this machine (:func:`unavailable`), else why not."""
        return unavailable()

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in a new user + network namespace behind this link (one namespace for the
        whole job: wrap the launcher, e.g. ``horovodrun``, not each worker)."""
        return ["unshare", "--user", "--map-root-user", "--net", "sh", "-c", self.setup_script(), "sh", *argv]


@functools.lru_cache(maxsize=None)
def unavailable() -> str | None:
    """None where emulated links work on this machine, else why not and what to do."""
    missing = [tool for tool in ("unshare", "ip", "tc") if shutil.which(tool) is None]
    if missing:
        return (f"{', '.join(missing)} not found: emulated links need util-linux (unshare) and iproute2 "
                "(ip, tc), e.g. `sudo apt-get install util-linux iproute2`")
    probe = EmulatedLink(100e6).wrap(["true"])
    try:
        proc = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "`unshare --user --net` did not finish within 30 s"
    if proc.returncode != 0:
        return ("this machine does not let an unprivileged user create a user + network namespace "
                f"({(proc.stderr or proc.stdout).strip()[-300:]}). Ask the machine's administrator to allow "
                "them: `sudo sysctl kernel.unprivileged_userns_clone=1` (Debian), "
                "`sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0` (Ubuntu 24.04 and later), "
                "or a non-zero `user.max_user_namespaces`; in a container, run it with user namespaces allowed. "
                "Until then the lab shows the model's predictions alone.")
    return None


def total_ring_bytes(nbytes: float, n: int) -> float:
    """Bytes all ``n`` workers together send in a ring all-reduce of ``nbytes`` (Lab 2's count per
    worker, times ``n``)."""
    from multigpu.labs.lab2 import scaling_model

    return n * scaling_model.ring_bytes_per_worker(nbytes, n)


def predicted_allreduce_s(nbytes: float, n: int, rate_bps: float) -> float:
    """Seconds a ring all-reduce of ``nbytes`` over ``n`` workers needs on one shared link of
    ``rate_bps`` bits/s: every worker's bytes cross it (latency and computation left out)."""
    return total_ring_bytes(nbytes, n) * 8 / rate_bps


#: The factor within which Lab 4 expects a measured step to sit of the model's prediction, either way.
MODEL_FACTOR = 1.5


def gradient_bytes(model: str = "alexnet_small", *, fp16: bool = False) -> int:
    """Bytes of one gradient of the course's ``model`` as Horovod sends it (float32, or float16 with
    ``--fp16-allreduce``)."""
    from multigpu.core import models

    return models.count_parameters(models.build_model(model))["total"] * (2 if fp16 else 4)


def measure_step(workers: int, rate_bps: float | None, *, out: str | os.PathLike, batch_size: int = 64,
                 steps: int = 4, fp16: bool = False, timeout: float = 300.0, echo: bool = False) -> dict[str, Any]:
    """Seconds per training step of the course's Horovod script on ``workers`` workers whose traffic
    crosses a link of ``rate_bps`` (None: unlimited), on synthetic images (no data loading, no
    validation): ``steps`` steps, the first ones untimed (:func:`multigpu.core.training.train`).

    The step time is the slowest worker's (a step ends when its all-reduce does). Where emulated
    links are unavailable (:func:`unavailable`), an unlimited "link" is the machine's own loopback
    (Gloo over TCP, no namespace) and a limited one raises :class:`RuntimeError` with why.
    """
    from multigpu.running import hvdtools

    emulated = unavailable() is None
    if rate_bps is not None and not emulated:
        raise RuntimeError(f"no emulated link on this machine: {unavailable()}")
    args = ["--synthetic", str(max(workers * batch_size * steps, 256)), "--max-steps", str(steps), "--epochs", "1",
            "--batch-size", str(batch_size), "--quiet", *(["--fp16-allreduce"] if fp16 else [])]
    records = hvdtools.run_script(workers, args, out=Path(out), launcher="horovodrun --gloo", timeout=timeout, echo=echo,
                                  link=EmulatedLink(rate_bps) if emulated else None)
    slowest = min(r["history"]["images_per_s_worker"][0] for r in records)
    return {"workers": workers, "rate_bps": rate_bps, "link": EmulatedLink(rate_bps).label, "batch": batch_size,
            "fp16": fp16, "step_s": batch_size / slowest, "images_per_s": workers * slowest, "emulated": emulated}


def plot_prediction(rows: Sequence[dict[str, Any]], ax: Any = None) -> Any:
    """Measured against predicted step time (rows with ``step_s`` and ``predicted_s``), log-log,
    with the line where they agree and the band of :data:`MODEL_FACTOR` around it."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4.5))
    counts = sorted({row["workers"] for row in rows})
    for i, n in enumerate(counts):
        mine = [row for row in rows if row["workers"] == n]
        ax.scatter([r["predicted_s"] for r in mine], [r["step_s"] for r in mine], color=f"C{i}", label=f"{n} workers", zorder=3)
        for row in mine:
            ax.annotate(row["link"].replace(" loopback", "") + (" fp16" if row.get("fp16") else "")
                        + (f" batch {row['batch']}" if row["batch"] != rows[0]["batch"] else ""),
                        (row["predicted_s"], row["step_s"]), fontsize=7, xytext=(5, -8 if i else 4), textcoords="offset points")
    values = [v for row in rows for v in (row["predicted_s"], row["step_s"])]
    lo, hi = min(values) / 2, max(values) * 2
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="measured = predicted")
    ax.fill_between([lo, hi], [lo / MODEL_FACTOR, hi / MODEL_FACTOR], [lo * MODEL_FACTOR, hi * MODEL_FACTOR],
                    color="0.85", label=f"within {MODEL_FACTOR}x")
    ax.set(xscale="log", yscale="log", xlabel="predicted step time (s)", ylabel="measured step time (s)",
           title="Step time on an emulated link: model vs measurement")
    ax.legend(loc="upper left", fontsize=8)
    return ax
