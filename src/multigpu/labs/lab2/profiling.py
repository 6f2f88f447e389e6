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
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

#: Pipeline stages in the order an image goes through them.
STAGES: tuple[str, ...] = ("read", "decode", "augment", "collate", "copy")
#: The ranges :func:`profile_steps` wraps each training step in.
PHASES: tuple[str, ...] = ("load", "forward", "backward", "optimizer")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    from multigpu.core.data import ImageTransform, collate, decode

    device = torch.device(device) if device is not None else torch.device("cpu")
    transform = transform or dataset.transform
    if transform is None:
        raise ValueError("the dataset has no transform: pass transform=data.train_transform(size)")
    n = min(int(n_images), len(dataset))
    if n < 1:
        raise ValueError("need at least one image")
    stride = max(1, len(dataset) // n)
    indices = [(start + i * stride) % len(dataset) for i in range(n)]
    labels = [dataset.samples[i][1] for i in indices]
    seconds: dict[str, float] = {}

    t0 = time.perf_counter()
    blobs = [dataset.read(i) for i in indices]
    seconds["read"] = time.perf_counter() - t0

    split = isinstance(transform, ImageTransform)
    staged = cast(ImageTransform, transform)  # read only where split is True
    size = staged.size if split else None  # as the dataset decodes for it (JPEG draft mode)
    t0 = time.perf_counter()
    images = [decode(b, size) for b in blobs]
    seconds["decode"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    samples: list[Any] = [staged.sample(im) for im in images] if split else [transform(im) for im in images]
    seconds["augment"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    if split:  # what data.collate does before the transform's batch step
        batches = [
            (staged.stack(samples[i : i + batch_size]), torch.tensor(labels[i : i + batch_size]))
            for i in range(0, n, batch_size)
        ]
    else:
        batches = [
            collate(list(zip(samples[i : i + batch_size], labels[i : i + batch_size])))
            for i in range(0, n, batch_size)
        ]
    seconds["collate"] = time.perf_counter() - t0

    if split:  # the transform's per-batch half: augmentation, once per batch
        t0 = time.perf_counter()
        batches = [(staged.batch(x), y) for x, y in batches]
        seconds["augment"] += time.perf_counter() - t0

    notes: dict[str, str] = {}
    pin = device.type == "cuda"
    if pin:
        batches = [(x.pin_memory(), y.pin_memory()) for x, y in batches]
    _sync(device)
    t0 = time.perf_counter()
    if device.type == "cpu":
        moved = [(x.clone(), y.clone()) for x, y in batches]  # no device memory: a host memcpy stands in
        notes["copy"] = "CPU mode: host memory copy, no device"
    else:
        moved = [(x.to(device, non_blocking=True), y.to(device, non_blocking=True)) for x, y in batches]
    _sync(device)
    seconds["copy"] = time.perf_counter() - t0
    del moved
    return StageTimes(images=n, seconds=seconds, device=str(device), notes=notes)


def _train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def _synthetic_batch(batch_size: int, image_size: int, device: torch.device,
                     num_classes: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """The same random batch every time (seed 0), on ``device``: images and labels."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch_size, 3, image_size, image_size, generator=g).to(device)
    y = torch.randint(0, num_classes, (batch_size,), generator=g).to(device)
    return x, y


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
    x, y = _synthetic_batch(batch_size, image_size, device, num_classes)
    for _ in range(warmup):
        _train_step(model, optimizer, x, y)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        _train_step(model, optimizer, x, y)
    _sync(device)
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
    _sync(device)
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
    _sync(device)
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
    ``loader_images`` images (at least 3 batches). ``batch_size`` for the model defaults to the
    loader's.
    """
    batch_size = batch_size or getattr(loader, "batch_size", None) or 64
    device = torch.device(device) if device is not None else next(model.parameters()).device
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    classes = linears[-1].out_features if linears else 10
    loader_bs = getattr(loader, "batch_size", None) or batch_size
    loader_batches = max(3, -(-loader_images // loader_bs))
    p_runs, m_runs = [], []
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
            _sync(device)
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


# --------------------------------------------------------------------------- one device first (Lab 2, 1.4)

#: The ways Lab 2 compares of making one device's training step faster, in the order measured.
STEP_OPTIONS: tuple[str, ...] = ("float32", "mixed precision", "channels_last", "channels_last + mixed precision",
                                 "torch.compile")
#: The same without ``torch.compile`` (whose first step compiles for tens of seconds).
EAGER_OPTIONS: tuple[str, ...] = tuple(o for o in STEP_OPTIONS if o != "torch.compile")


def mixed_precision_dtype(device: torch.device | str) -> torch.dtype:
    """The half-precision type for autocast on ``device``: bfloat16 on a CPU (the one CPUs
    support), bfloat16 on a GPU that has it (Ampere and later), else float16 (which needs a
    gradient scaler: its range is small)."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16


def compare_step_options(
    model_name: str,
    amp_step: Callable[..., Any],
    *,
    batch_size: int = 64,
    image_size: int | None = None,
    device: torch.device | str = "cpu",
    steps: int = 5,
    repeats: int = 2,
    options: Sequence[str] = STEP_OPTIONS,
) -> list[dict[str, Any]]:
    """Training images/s of a fresh ``model_name`` under each of ``options`` (:data:`STEP_OPTIONS`),
    side by side: one model per option, all on the same synthetic batch; the first step of each is
    timed alone (for ``torch.compile`` it holds the compilation), then ``repeats`` rounds of
    ``steps`` steps go through the options in turn and each option's median round counts.

    ``amp_step(model, optimizer, scaler, images, labels, dtype)`` is the mixed-precision step (Lab
    2's exercise); ``scaler`` is a ``torch.amp.GradScaler``, enabled only for float16. An option
    that fails (``torch.compile`` needs a C++ compiler on a CPU) gets its error instead of a rate.
    Rows: ``option``, ``images_per_s``, ``first_step_s``, ``speedup`` (over float32), ``error``.
    """
    from multigpu.core import models

    device = torch.device(device)
    dtype = mixed_precision_dtype(device)
    x, y = _synthetic_batch(batch_size, image_size or models.default_image_size(model_name), device)
    runs: dict[str, Callable[[], Any]] = {}
    rows: dict[str, dict[str, Any]] = {}
    for option in options:
        if option not in STEP_OPTIONS:
            raise ValueError(f"unknown option {option!r}; choose from {STEP_OPTIONS}")
        torch.manual_seed(0)
        model = models.build_model(model_name).to(device).train()
        images = x
        if "channels_last" in option:
            model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
            images = x.contiguous(memory_format=torch.channels_last)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        if option == "torch.compile":
            model = cast(nn.Module, torch.compile(model))
        run: Callable[[], Any]
        if "mixed precision" in option:
            scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
            run = functools.partial(amp_step, model, optimizer, scaler, images, y, dtype)
        else:
            run = functools.partial(_train_step, model, optimizer, images, y)
        row: dict[str, Any] = {"option": option, "images_per_s": None, "first_step_s": None, "speedup": None, "error": None}
        try:
            t0 = time.perf_counter()
            run()
            _sync(device)
            row["first_step_s"] = time.perf_counter() - t0
            run()  # a second untimed step: allocations and caches settle
            runs[option] = run
        except Exception as exc:  # one option failing must not hide the others
            first_line = (str(exc).strip().splitlines() or [""])[0]
            row["error"] = f"{type(exc).__name__}: {first_line[:200]}"
        rows[option] = row
    rates: dict[str, list[float]] = {option: [] for option in runs}
    for _ in range(repeats):
        for option, run in runs.items():
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(steps):
                run()
            _sync(device)
            rates[option].append(steps * batch_size / (time.perf_counter() - t0))
    base = statistics.median(rates["float32"]) if rates.get("float32") else None
    for option, values in rates.items():
        rows[option]["images_per_s"] = statistics.median(values)
        if base:
            rows[option]["speedup"] = rows[option]["images_per_s"] / base
    return list(rows.values())


#: What :func:`step_options_worker` sets to hide a CPU's bfloat16 instructions from oneDNN (the
#: library behind PyTorch's CPU convolutions and matrix multiplies): AVX-512 with VNNI, without
#: AVX512_BF16 or AMX, as on most CPUs before 2020.
WITHOUT_BF16_ISA = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"}


def step_options_worker(rank: int, world_size: int, model_name: str, amp_step: Callable[..., Any],
                        kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """:func:`compare_step_options` in a worker of :func:`multigpu.running.launch.run` (``backend=None``),
    so that it can run under another environment, e.g. :data:`WITHOUT_BF16_ISA`."""
    return compare_step_options(model_name, amp_step, **kwargs)


def format_step_options(rows: Sequence[dict[str, Any]]) -> str:
    """The rows of :func:`compare_step_options` as a table."""
    lines = [f"{'option':<34} {'images/s':>9} {'x float32':>10} {'first step':>11}"]
    for r in rows:
        if r["error"]:
            lines.append(f"{r['option']:<34} failed: {r['error']}")
        else:
            lines.append(f"{r['option']:<34} {r['images_per_s']:>9,.0f} {r['speedup'] or 0:>9.2f}x {r['first_step_s']:>10.2f}s")
    return "\n".join(lines)
