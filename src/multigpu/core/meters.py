"""Honest meters: throughput without warm-up steps, and count-weighted averages."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


class ThroughputMeter:
    """Items per second over the steps after ``untimed_steps``.

    Call :meth:`step` with the number of items after each step. The first ``untimed_steps`` steps
    (memory allocation, cuDNN autotuning, loader start-up) are not counted: the clock starts
    when the last warm-up step ends. On a CUDA ``device`` every reading first calls
    ``torch.cuda.synchronize()`` so that queued GPU work is inside the measured time.
    If there are no more steps than warm-up steps, every step is counted instead (a short run
    still gets a number, flagged by ``warm`` being False).

    ``clock`` is injectable for tests (default ``time.perf_counter``).
    """

    def __init__(
        self,
        untimed_steps: int = 5,
        device: torch.device | str | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if untimed_steps < 0:
            raise ValueError("untimed_steps must be >= 0")
        self.untimed_steps = int(untimed_steps)
        self.device = torch.device(device) if device is not None else None
        self.clock = clock
        self.reset()

    def reset(self) -> None:
        """Forget all steps; the next :meth:`step` is warm-up step 1 again."""
        self.steps = 0
        self.items = 0  #: items counted after warm-up
        self.all_items = 0
        self._t0 = self._sync_time()  # start of step 1
        self._t_warm: float | None = self._t0 if self.untimed_steps == 0 else None
        self._t_last = self._t0

    def _sync_time(self) -> float:
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return self.clock()

    def start(self) -> None:
        """Restart the clock without forgetting steps (call right before the first step)."""
        self._t0 = self._sync_time()
        if self.steps == 0 and self.untimed_steps == 0:
            self._t_warm = self._t0
        self._t_last = self._t0

    def step(self, n_items: int) -> None:
        """Record one finished step of ``n_items`` items."""
        now = self._sync_time()
        self.steps += 1
        self.all_items += int(n_items)
        if self.steps > self.untimed_steps:
            self.items += int(n_items)
        elif self.steps == self.untimed_steps:
            self._t_warm = now
        self._t_last = now

    @property
    def warm(self) -> bool:
        """True when at least one step after warm-up was measured."""
        return self.steps > self.untimed_steps

    @property
    def elapsed(self) -> float:
        """Seconds covered by the measured steps."""
        if self.warm and self._t_warm is not None:
            return self._t_last - self._t_warm
        return self._t_last - self._t0

    @property
    def images_per_second(self) -> float:
        """Items per second after warm-up (all steps if no step after warm-up); 0.0 before any."""
        items = self.items if self.warm else self.all_items
        t = self.elapsed
        return items / t if t > 0 and items else 0.0

    def __repr__(self) -> str:
        return f"ThroughputMeter(steps={self.steps}, untimed={self.untimed_steps}, {self.images_per_second:.1f} items/s)"


class AverageMeter:
    """Running average weighted by count: ``update(value, n)`` with ``value`` a per-item mean."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.reset()

    def reset(self) -> None:
        self.sum = 0.0
        self.count = 0
        self.last = 0.0

    def update(self, value: float, n: int = 1) -> None:
        value = float(value)
        self.last = value
        self.sum += value * n
        self.count += int(n)

    @property
    def avg(self) -> float:
        """The weighted average (0.0 before any update)."""
        return self.sum / self.count if self.count else 0.0

    def __repr__(self) -> str:
        return f"AverageMeter({self.name!r}, avg={self.avg:.4f}, count={self.count})"
