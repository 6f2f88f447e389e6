"""Where one device's time goes: the input pipeline stage by stage, and the model step alone.

Lab 2 starts here. Before adding devices, check that the input pipeline alone ("test-io")
delivers more images per second than the model consumes; if it does not, more devices only
wait longer for data.

- :func:`time_stages` times each stage of the pipeline on real JPEG files, one after the
  other in this process: ``read`` (file -> bytes), ``decode`` (bytes -> RGB image), ``augment``
  (the training transform: for the course's transforms, the pixels out of each image, then
  random crop, flip and normalisation once per batch), ``collate`` (samples -> batch) and
  ``copy`` (batch -> device; on a CPU-only machine there is no device memory, so this is a
  plain memory copy of the batch, flagged in the result).
- :func:`model_images_per_s` times training steps of a model on synthetic in-memory data:
  compute alone, no I/O.
- :func:`loader_images_per_s` times a DataLoader alone (every batch also copied to the device).
- :func:`pipeline_vs_model` measures both, interleaved, and returns their ratio: the number the
  DataLoader exercise is graded on.
- :func:`profile_steps` runs a few training steps under ``torch.profiler`` and returns its table.

Making that one device's step faster (:func:`compare_step_options`) is
:mod:`multigpu.labs.lab2.step_options`; its names are importable from here too.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from multigpu.labs.lab2.step_options import EAGER_OPTIONS as EAGER_OPTIONS  # Lab 2's step options, importable from here too
from multigpu.labs.lab2.step_options import STEP_OPTIONS as STEP_OPTIONS
from multigpu.labs.lab2.step_options import WITHOUT_BF16_ISA as WITHOUT_BF16_ISA
from multigpu.labs.lab2.step_options import compare_step_options as compare_step_options
from multigpu.labs.lab2.step_options import format_step_options as format_step_options
from multigpu.labs.lab2.step_options import mixed_precision_dtype as mixed_precision_dtype
from multigpu.labs.lab2.step_options import step_options_worker as step_options_worker
from multigpu.labs.lab2.step_options import synchronize, synthetic_batch, train_step

if TYPE_CHECKING:
    from multigpu.core.data import ImageTransform

T = TypeVar("T")

#: Pipeline stages in the order an image goes through them.
STAGES: tuple[str, ...] = ("read", "decode", "augment", "collate", "copy")
#: The ranges :func:`profile_steps` wraps each training step in.
PHASES: tuple[str, ...] = ("load", "forward", "backward", "optimizer")


@dataclass
class StageTimes:
    """Seconds spent in each stage for ``images`` images (one process, stages run in sequence)."""

    images: int
    seconds: dict[str, float]
    device: str = "cpu"
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def images_per_s(self) -> dict[str, float]:
        """Images per second each stage alone could deliver (one core)."""
        return {s: (self.images / t if t > 0 else float("inf")) for s, t in self.seconds.items()}

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    @property
    def pipeline_images_per_s(self) -> float:
        """Images per second of all stages in sequence in one process: ``1 / sum(1 / rate)``."""
        return self.images / self.total_seconds if self.total_seconds > 0 else float("inf")

    @property
    def bottleneck(self) -> str:
        """The slowest stage."""
        return max(self.seconds, key=self.seconds.__getitem__)

    def table(self) -> str:
        """A small text table: stage, ms per image, images/s, share of the time."""
        lines = [f"{'stage':<9}{'ms/image':>10}{'images/s':>11}{'share':>8}"]
        total = self.total_seconds or 1.0
        for s, t in self.seconds.items():
            rate = self.images_per_s[s]
            note = f"  ({self.notes[s]})" if s in self.notes else ""
            lines.append(f"{s:<9}{1000 * t / self.images:>10.3f}{rate:>11.0f}{t / total:>8.0%}{note}")
        lines.append(f"{'all':<9}{1000 * self.total_seconds / self.images:>10.3f}{self.pipeline_images_per_s:>11.0f}{1:>8.0%}")
        return "\n".join(lines)


def time_stages(
    dataset: Any,
    n_images: int = 256,
    batch_size: int = 64,
    *,
    device: torch.device | str | None = None,
    transform: Callable[[Any], torch.Tensor] | None = None,
    start: int = 0,
) -> StageTimes:
    """Time each input-pipeline stage on ``n_images`` images of a :class:`multigpu.core.data.JPEGFolder`.

    Each stage runs over all images before the next starts, so its clock holds nothing else.
    ``transform`` defaults to the dataset's own (the training augmentation for a training set).
    Images are taken spread over the data set (every class), starting at ``start``.

    The stages are timed as the default loader runs them. With one of the course's transforms
    (:class:`multigpu.core.data.ImageTransform`) ``augment`` is its per-image half (the pixels out
    of the decoded image) plus its per-batch half (crop, flip, normalise the stacked batch),
    and ``collate`` is the stacking in between; any other transform runs per image and
    ``collate`` stacks its tensors.
    """
    from multigpu.core.data import ImageTransform, decode

    device = torch.device(device) if device is not None else torch.device("cpu")
    transform = transform or dataset.transform
    if transform is None:
        raise ValueError("the dataset has no transform: pass transform=data.train_transform(size)")
    indices = _spread(len(dataset), n_images, start)
    labels = [dataset.samples[i][1] for i in indices]
    seconds: dict[str, float] = {}
    blobs = _timed(seconds, "read", lambda: [dataset.read(i) for i in indices])
    staged = transform if isinstance(transform, ImageTransform) else None
    size = staged.size if staged is not None else None  # as the dataset decodes for it (JPEG draft mode)
    images = _timed(seconds, "decode", lambda: [decode(b, size) for b in blobs])
    if staged is not None:
        samples: list[Any] = _timed(seconds, "augment", lambda: [staged.sample(im) for im in images])
    else:
        samples = _timed(seconds, "augment", lambda: [transform(im) for im in images])
    batches = _timed(seconds, "collate", lambda: _batches(samples, labels, batch_size, staged))
    if staged is not None:  # the transform's per-batch half: augmentation, once per batch
        batches = _timed(seconds, "augment", lambda: [(staged.batch(x), y) for x, y in batches])
    notes: dict[str, str] = {}
    seconds["copy"] = _time_copy(batches, device, notes)
    return StageTimes(images=len(indices), seconds=seconds, device=str(device), notes=notes)


def _spread(length: int, n_images: int, start: int) -> list[int]:
    """Indices of ``n_images`` images (at most all) spread over a data set of ``length``, from ``start``."""
    n = min(int(n_images), length)
    if n < 1:
        raise ValueError("need at least one image")
    stride = max(1, length // n)
    return [(start + i * stride) % length for i in range(n)]


def _timed(seconds: dict[str, float], stage: str, work: Callable[[], T]) -> T:
    """``work()``, its seconds added to ``seconds[stage]``."""
    t0 = time.perf_counter()
    out = work()
    seconds[stage] = seconds.get(stage, 0.0) + time.perf_counter() - t0
    return out


def _batches(samples: list[Any], labels: list[int], batch_size: int,
             staged: ImageTransform | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The samples in batches as the default loader collates them: with one of the course's
    transforms (``staged``) what ``data.collate`` does before the transform's batch step, else
    ``data.collate`` itself."""
    from multigpu.core.data import collate

    n = len(samples)
    if staged is not None:
        return [
            (staged.stack(samples[i : i + batch_size]), torch.tensor(labels[i : i + batch_size]))
            for i in range(0, n, batch_size)
        ]
    return [collate(list(zip(samples[i : i + batch_size], labels[i : i + batch_size]))) for i in range(0, n, batch_size)]


def _time_copy(batches: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device, notes: dict[str, str]) -> float:
    """Seconds to copy ``batches`` to ``device`` (pinned first on a GPU); on a CPU, a host memory
    copy stands in (said in ``notes``)."""
    if device.type == "cuda":
        batches = [(x.pin_memory(), y.pin_memory()) for x, y in batches]
    synchronize(device)
    t0 = time.perf_counter()
    if device.type == "cpu":
        moved = [(x.clone(), y.clone()) for x, y in batches]  # no device memory: a host memcpy stands in
        notes["copy"] = "CPU mode: host memory copy, no device"
    else:
        moved = [(x.to(device, non_blocking=True), y.to(device, non_blocking=True)) for x, y in batches]
    synchronize(device)
    seconds = time.perf_counter() - t0
    del moved
    return seconds


def model_images_per_s(
    model: nn.Module,
    batch_size: int = 64,
    image_size: int = 64,
    *,
    steps: int = 5,
    warmup: int = 1,
    device: torch.device | str | None = None,
    num_classes: int = 10,
    optimizer: torch.optim.Optimizer | None = None,
) -> float:
    """Training images/s of ``model`` alone: forward, backward and SGD step on one synthetic
    batch that already sits on the device (no reading, decoding or copying).

    The first ``warmup`` steps are not timed. The model's parameters change (it trains).
    """
    device = torch.device(device) if device is not None else next(model.parameters()).device
    model.to(device).train()
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x, y = synthetic_batch(batch_size, image_size, device, num_classes)
    for _ in range(warmup):
        train_step(model, optimizer, x, y)
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        train_step(model, optimizer, x, y)
    synchronize(device)
    return steps * batch_size / (time.perf_counter() - t0)


def loader_images_per_s(
    loader: Iterable,
    *,
    batches: int = 10,
    warmup: int = 1,
    device: torch.device | str | None = None,
) -> float:
    """Images/s a DataLoader delivers alone ("test-io"): iterate ``batches`` batches after
    ``warmup`` (worker start-up is not counted) and copy each batch to ``device``.

    Starts a fresh iterator each call: with ``persistent_workers`` the workers are reused.
    """
    device = torch.device(device) if device is not None else torch.device("cpu")
    t0 = time.perf_counter()
    it = iter(loader)
    for _ in range(warmup):
        if next(it, None) is None:
            raise ValueError("the loader ran out during the warm-up: use a larger data set")
    synchronize(device)
    t0 = time.perf_counter() if warmup else t0
    images = 0
    for _ in range(batches):
        batch = next(it, None)
        if batch is None:
            break
        x, y = batch
        if device.type != "cpu":
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
        images += int(y.shape[0])
    synchronize(device)
    if images == 0:
        raise ValueError("the loader gave no batch after the warm-up: use a larger data set or fewer warm-up batches")
    return images / (time.perf_counter() - t0)


@dataclass
class Comparison:
    """Pipeline alone vs model alone, measured interleaved in one call (medians over repeats)."""

    pipeline_images_per_s: float
    model_images_per_s: float
    pipeline_runs: list[float]
    model_runs: list[float]

    @property
    def ratio(self) -> float:
        """Pipeline images/s over model images/s: above 1 the pipeline keeps up."""
        return self.pipeline_images_per_s / self.model_images_per_s

    def __str__(self) -> str:
        verdict = "keeps up" if self.ratio >= 1 else "is the bottleneck"
        return (
            f"pipeline {self.pipeline_images_per_s:,.0f} images/s, model {self.model_images_per_s:,.0f} images/s: "
            f"ratio {self.ratio:.2f}, the input pipeline {verdict}"
        )


def pipeline_vs_model(
    loader: Iterable,
    model: nn.Module,
    *,
    batch_size: int | None = None,
    image_size: int = 64,
    repeats: int = 3,
    loader_images: int = 512,
    model_steps: int = 3,
    device: torch.device | str | None = None,
) -> Comparison:
    """Measure the loader alone and the model alone, alternating ``repeats`` times; medians.

    Interleaving keeps both under the same machine load, so the ratio holds on a noisy,
    shared machine even when the absolute numbers do not. Each loader run covers about
    ``loader_images`` images (at least 3 batches). One untimed loader run comes first: the
    first read of a file comes from the disk (later epochs find it in the page cache) and
    loader workers start, so the ratio is that of the steady state. ``batch_size`` for the
    model defaults to the loader's.
    """
    batch_size = batch_size or getattr(loader, "batch_size", None) or 64
    device = torch.device(device) if device is not None else next(model.parameters()).device
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    classes = linears[-1].out_features if linears else 10
    loader_bs = getattr(loader, "batch_size", None) or batch_size
    loader_batches = max(3, -(-loader_images // loader_bs))
    p_runs, m_runs = [], []
    loader_images_per_s(loader, batches=loader_batches, device=device)  # untimed: page cache, workers
    for _ in range(repeats):
        p_runs.append(loader_images_per_s(loader, batches=loader_batches, device=device))
        m_runs.append(
            model_images_per_s(model, batch_size, image_size, steps=model_steps, device=device, num_classes=classes)
        )
    return Comparison(statistics.median(p_runs), statistics.median(m_runs), p_runs, m_runs)


def profile_steps(
    model: nn.Module,
    loader: Iterable,
    *,
    steps: int = 3,
    device: torch.device | str | None = None,
    row_limit: int = 12,
    sort_by: str | None = None,
) -> str:
    """Run ``steps`` training steps (loading included) under ``torch.profiler``; return its table.

    Each step is wrapped in ``record_function`` ranges ``load``, ``forward``, ``backward`` and
    ``optimizer``. The first line gives their CPU milliseconds per step, every phase however
    small (a batch of 64x64 JPEGs loads in a few ms, below the top operators of the table);
    the table below ranks the ranges and operators by time.
    """
    from torch.profiler import ProfilerActivity, profile, record_function

    device = torch.device(device) if device is not None else next(model.parameters()).device
    model.to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort_by = sort_by or ("device_time_total" if device.type == "cuda" else "cpu_time_total")
    it = iter(loader)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            with record_function("load"):
                x, y = next(it)
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with record_function("forward"):
                loss = nn.functional.cross_entropy(model(x), y)
            with record_function("backward"):
                loss.backward()
            with record_function("optimizer"):
                optimizer.step()
            synchronize(device)
    averages = prof.key_averages()
    ms = {e.key: e.cpu_time_total / 1000 / steps for e in averages if e.key in PHASES}
    phases = ", ".join(f"{name} {ms.get(name, 0.0):.1f}" for name in PHASES)
    return f"step phases, CPU ms per step: {phases}\n" + averages.table(sort_by=sort_by, row_limit=row_limit)


def plot_stages(stage_rates: dict[str, float], model_rate: float, ax: Any = None, title: str | None = None) -> Any:
    """Bar chart: images/s of each pipeline stage alone, the whole pipeline, and the model step.

    A bar below the model's line is a stage that would starve the model.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.2))
    names = list(stage_rates)
    values = [stage_rates[n] for n in names]
    colours = ["tab:blue"] * len(names)
    finite = [v for v in values if v != float("inf")]
    top = max(finite + [model_rate]) * 4
    ax.bar(names, [min(v, top) for v in values], color=colours)
    ax.axhline(model_rate, color="tab:red", linestyle="--", label=f"model step alone: {model_rate:,.0f} images/s")
    ax.set_yscale("log")
    # headroom above the tallest bar (a decade and a half on the log scale): the legend and the
    # value labels sit there instead of on the bars
    ax.set_ylim(top=max(min(v, top) for v in values + [model_rate]) * 40)
    ax.set_ylabel("images/s (log scale)")
    ax.set_title(title or "Each stage alone vs the model step alone (one core)")
    ax.legend(loc="upper right", fontsize=8)
    for i, v in enumerate(values):
        ax.text(i, min(v, top), f"{v:,.0f}", ha="center", va="bottom", fontsize=8)
    return ax


def serial_rate(stage_rates: Sequence[float] | dict[str, float]) -> float:
    """Images/s of stages run one after the other in one process: ``1 / sum(1 / rate)``."""
    rates = list(stage_rates.values()) if isinstance(stage_rates, dict) else list(stage_rates)
    return 1.0 / sum(1.0 / r for r in rates)
