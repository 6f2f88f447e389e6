"""Lab 4: what a training run costs on 1..N GPUs, on demand and on spot instances.

Time to train on ``n`` GPUs is one GPU's time over ``n x efficiency(n)``; the bill is GPU-hours
times the price. Spot instances are cheaper but can be taken away, each on its own: with
interruptions arriving at random (a Poisson process of ``r`` per hour per instance), a job on ``m``
instances stops whenever any one of them goes, at ``rate = m r`` per hour (:func:`job_rate`). A job
of ``T`` hours that restarts from zero after each interruption takes ``(exp(rate T) - 1) / rate``
hours on average; one that saves its state every
``tau`` hours (a checkpoint costing ``c``, a restart costing ``r``) pays that only per segment:
``T / tau x exp(rate r) (exp(rate (tau + c)) - 1) / rate`` (the classical result for restarts
from checkpoints: Daly, "A higher order estimate of the optimum checkpoint interval for
restart dumps", 2006). Elastic training (Lab 4, part 3) is, to a first approximation, the same
with a commit for a checkpoint: what is lost is the work since the last commit, and the restart
is a reset of a few seconds instead of a job's start (it also goes on with fewer GPUs meanwhile,
which this model leaves out).

The default prices are the 2017 figures of the course's sources (the BEEVA blog post on
multi-GPU training on AWS): a K80 for about $0.3 an hour on spot, a third of its $0.9 on demand,
and an AWS p3 server from about $3 an hour on demand (1 V100) to about $24 (8 V100s). The sources
quote no steady spot price for the V100s: p3 spot prices were highly volatile, at times above
on-demand, and requests failed for lack of capacity. :data:`V100_SPOT_RANGE_2017` therefore is a
range, from the K80's discount (one-third of on-demand) to on-demand itself (above it spot never
pays), and a plan on spot should be priced at both ends; a capacity error (no spot instance at any
price) is outside this model. The prices are dated on purpose: pass today's as parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: Price per GPU-hour, in US dollars, as the sources quoted them in 2017.
PRICES_2017 = {
    "K80, spot": 0.30,
    "V100, on demand (1-GPU server, $3/h)": 3.0,
    "V100, on demand (8-GPU server, $24/h)": 24.0 / 8,
}

#: Price per GPU-hour of a V100 on spot in 2017, as a range (low, high): the K80's spot discount
#: (spot at a third of on-demand) applied to a V100's $3 on demand, up to on-demand itself.
V100_SPOT_RANGE_2017 = (PRICES_2017["V100, on demand (1-GPU server, $3/h)"] * 0.30 / 0.90,
                        PRICES_2017["V100, on demand (1-GPU server, $3/h)"])


def instances(gpus: int, gpus_per_instance: int) -> int:
    """How many instances (servers) a job on ``gpus`` GPUs runs on, ``gpus_per_instance`` each at most."""
    if gpus < 1 or gpus_per_instance < 1:
        raise ValueError(f"need gpus >= 1 and gpus_per_instance >= 1, got {gpus}, {gpus_per_instance}")
    return math.ceil(gpus / gpus_per_instance)


def job_rate(interruptions_per_instance_hour: float, gpus: int, gpus_per_instance: int) -> float:
    """Interruptions per hour of a whole job on ``gpus`` GPUs: losing any one of its instances stops
    it, so the instances' rates add up (independent Poisson processes)."""
    return interruptions_per_instance_hour * instances(gpus, gpus_per_instance)


def hours_to_train(one_gpu_hours: float, n: int, efficiency: float) -> float:
    """Wall-clock hours on ``n`` GPUs for a job of ``one_gpu_hours`` on one GPU, at ``efficiency``
    (measured or modelled; 1.0 = perfect scaling)."""
    if n < 1 or not 0 < efficiency <= 1.5:
        raise ValueError(f"need n >= 1 and 0 < efficiency <= 1.5, got n={n}, efficiency={efficiency}")
    return one_gpu_hours / (n * efficiency)


def expected_hours_with_interruptions(hours: float, rate_per_hour: float, *, checkpoint_every: float | None = None,
                                      checkpoint_cost: float = 0.0, restart_cost: float = 0.0) -> float:
    """Expected wall-clock hours of a job of ``hours`` when interruptions come at ``rate_per_hour``
    (Poisson; the whole job's rate, :func:`job_rate`). Without checkpoints every interruption starts the job again; with
    ``checkpoint_every=tau`` only the segment since the last checkpoint is lost (each checkpoint
    costs ``checkpoint_cost`` hours, each restart ``restart_cost``). ``rate_per_hour=0``: no
    interruption, the checkpoints still cost their time."""
    if hours < 0 or rate_per_hour < 0:
        raise ValueError("hours and rate must be >= 0")
    if checkpoint_every is None:
        tau, c, segments = hours, 0.0, 1.0
    else:
        if checkpoint_every <= 0:
            raise ValueError("checkpoint_every must be > 0")
        tau, c, segments = checkpoint_every, checkpoint_cost, hours / checkpoint_every
    if rate_per_hour == 0:
        return segments * (tau + c)
    lam = rate_per_hour
    if lam * (tau + c + restart_cost) > _LARGEST_EXPONENT:  # it never finishes, in practice
        return math.inf
    return segments * math.exp(lam * restart_cost) * math.expm1(lam * (tau + c)) / lam


#: exp() of more overflows a float: an expected time beyond 10^300 hours is infinite here.
_LARGEST_EXPONENT = 700.0


@dataclass(frozen=True)
class Option:
    """One way to run the job, and what it is expected to take and cost."""

    gpus: int
    price_per_gpu_hour: float
    label: str
    hours: float  #: expected wall-clock hours, interruptions included
    cost: float  #: expected dollars

    def __str__(self) -> str:
        return f"{self.gpus:>3} GPUs, {self.label}: {self.hours:.2f} h, ${self.cost:,.2f}"


def options(one_gpu_hours: float, efficiency: Callable[[int], float], gpus: Sequence[int] = (1, 2, 4, 8, 16, 32, 64), *,
            on_demand: float = PRICES_2017["V100, on demand (1-GPU server, $3/h)"],
            spot: float | None = None, interruptions_per_hour: float = 0.1, gpus_per_instance: int = 1,
            checkpoint_every: float | None = None, checkpoint_cost: float = 0.0, restart_cost: float = 0.0) -> list[Option]:
    """Every way to run the job: each GPU count on demand, and (with a ``spot`` price) on spot,
    restarting from zero or, with ``checkpoint_every``, from the last checkpoint (or commit).
    ``efficiency(n)``: the scaling efficiency at ``n`` GPUs (a measured table's ``.get``, or a
    model's curve). ``interruptions_per_hour`` is each spot instance's rate; a job on ``n`` GPUs
    runs on ``ceil(n / gpus_per_instance)`` instances and is interrupted that many times as often
    (:func:`job_rate`)."""
    out = []
    for n in gpus:
        hours = hours_to_train(one_gpu_hours, n, efficiency(n))
        out.append(Option(n, on_demand, "on demand", hours, n * on_demand * hours))
        if spot is None:
            continue
        rate = job_rate(interruptions_per_hour, n, gpus_per_instance)
        plain = expected_hours_with_interruptions(hours, rate)
        out.append(Option(n, spot, "spot, restart from zero", plain, n * spot * plain))
        if checkpoint_every is not None:
            saved = expected_hours_with_interruptions(hours, rate, checkpoint_every=checkpoint_every,
                                                      checkpoint_cost=checkpoint_cost, restart_cost=restart_cost)
            out.append(Option(n, spot, "spot, from the last checkpoint", saved, n * spot * saved))
    return out


def cheapest_within(choices: Sequence[Option], deadline_hours: float) -> Option | None:
    """The cheapest option expected to finish within ``deadline_hours`` (ties: the faster one);
    None when none does."""
    fitting = [o for o in choices if o.hours <= deadline_hours]
    return min(fitting, key=lambda o: (o.cost, o.hours)) if fitting else None


def plot_options(choices: Sequence[Option], deadline_hours: float | None = None, ax: Any = None) -> Any:
    """Expected hours against expected dollars of every option, one colour per kind of instance,
    labelled with the GPU count; the deadline as a line and the cheapest option within it circled."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4.5))
    # restarts from zero can take 10^20 hours: left off the chart beyond 10x the slowest on-demand run
    limit = 10 * max((o.hours for o in choices if o.label == "on demand"), default=math.inf)
    for i, label in enumerate(dict.fromkeys(o.label for o in choices)):
        mine = [o for o in choices if o.label == label and o.hours <= limit]
        off = sum(1 for o in choices if o.label == label) - len(mine)
        label += f" ({off} off the chart: > {limit:,.0f} h)" if off else ""
        ax.plot([o.hours for o in mine], [o.cost for o in mine], "o-", color=f"C{i}", label=label, ms=4)
        for o in mine:
            ax.annotate(str(o.gpus), (o.hours, o.cost), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if deadline_hours is not None:
        ax.axvline(deadline_hours, color="k", ls="--", lw=1, label=f"deadline: {deadline_hours:g} h")
        best = cheapest_within(choices, deadline_hours)
        if best is not None:
            ax.plot(best.hours, best.cost, "o", ms=14, mfc="none", mec="k", label=f"cheapest in time: {best}")
    ax.set(xscale="log", yscale="log", xlabel="expected hours to train", ylabel="expected cost ($)",
           title="Time and cost of each option (numbers: GPUs)")
    ax.legend(fontsize=7)
    return ax
