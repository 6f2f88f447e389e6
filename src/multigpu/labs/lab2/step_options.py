"""One device first (Lab 2): the ways of making one device's training step faster (mixed
precision, channels_last, ``torch.compile``), measured side by side on one synthetic batch.

:func:`train_step`, :func:`synthetic_batch` and :func:`synchronize` are the timed step, its
batch and the clock's fence that :mod:`multigpu.labs.lab2.profiling` times with as well.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch import nn

#: The ways Lab 2 compares of making one device's training step faster, in the order measured.
STEP_OPTIONS: tuple[str, ...] = ("float32", "mixed precision", "channels_last", "channels_last + mixed precision",
                                 "torch.compile")
#: The same without ``torch.compile`` (whose first step compiles for tens of seconds).
EAGER_OPTIONS: tuple[str, ...] = tuple(o for o in STEP_OPTIONS if o != "torch.compile")

#: Seconds after which a timed round of one option stops (after the step that passed it).
ROUND_S = 3.0

#: What :func:`step_options_worker` sets to hide a CPU's bfloat16 instructions from oneDNN (the
#: library behind PyTorch's CPU convolutions and matrix multiplies): AVX-512 with VNNI, without
#: AVX512_BF16 or AMX, as on most CPUs before 2020.
WITHOUT_BF16_ISA = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"}


def synchronize(device: torch.device) -> None:
    """Wait for the GPU's queued work (nothing to wait for on a CPU), so that a clock read after
    it counts that work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    """One float32 training step (cross-entropy, backward, optimizer step); returns the loss."""
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def synthetic_batch(batch_size: int, image_size: int, device: torch.device,
                    num_classes: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """The same random batch every time (seed 0), on ``device``: images and labels."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch_size, 3, image_size, image_size, generator=g).to(device)
    y = torch.randint(0, num_classes, (batch_size,), generator=g).to(device)
    return x, y


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
    round_s: float = ROUND_S,
) -> list[dict[str, Any]]:
    """Training images/s of a fresh ``model_name`` under each of ``options`` (:data:`STEP_OPTIONS`),
    side by side: one model per option, all on the same synthetic batch; the first step of each is
    timed alone (for ``torch.compile`` it holds the compilation), then ``repeats`` rounds of
    ``steps`` steps go through the options in turn and each option's median round counts. A round
    ends early after the step that takes it past ``round_s`` seconds (its rate is over the steps
    it ran): an option 20x slower than float32 (autocast on a CPU without bfloat16 instructions)
    costs one step a round, not minutes.

    ``amp_step(model, optimizer, scaler, images, labels, dtype)`` is the mixed-precision step (Lab
    2's exercise); ``scaler`` is a ``torch.amp.GradScaler``, enabled only for float16. An option
    that fails (``torch.compile`` needs a C++ compiler on a CPU) gets its error instead of a rate.
    Rows: ``option``, ``images_per_s``, ``first_step_s``, ``speedup`` (over float32), ``error``.
    """
    from multigpu.core import models

    device = torch.device(device)
    x, y = synthetic_batch(batch_size, image_size or models.default_image_size(model_name), device)
    runs: dict[str, Callable[[], Any]] = {}
    rows: dict[str, dict[str, Any]] = {}
    for option in options:
        if option not in STEP_OPTIONS:
            raise ValueError(f"unknown option {option!r}; choose from {STEP_OPTIONS}")
        run = _option_step(option, model_name, amp_step, x, y, device)
        rows[option] = _first_steps(option, run, device)
        if rows[option]["error"] is None:
            runs[option] = run
    rates = _timed_rounds(runs, steps, batch_size, repeats, device, round_s)
    base = statistics.median(rates["float32"]) if rates.get("float32") else None
    for option, values in rates.items():
        rows[option]["images_per_s"] = statistics.median(values)
        if base:
            rows[option]["speedup"] = rows[option]["images_per_s"] / base
    return list(rows.values())


def _option_step(option: str, model_name: str, amp_step: Callable[..., Any], x: torch.Tensor, y: torch.Tensor,
                 device: torch.device) -> Callable[[], Any]:
    """One training step of a fresh ``model_name`` (seed 0) under ``option``, ready to call."""
    from multigpu.core import models

    torch.manual_seed(0)
    model = models.build_model(model_name).to(device).train()
    images = x
    if "channels_last" in option:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        images = x.contiguous(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    if option == "torch.compile":
        model = cast(nn.Module, torch.compile(model))
    if "mixed precision" in option:
        dtype = mixed_precision_dtype(device)
        scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
        return functools.partial(amp_step, model, optimizer, scaler, images, y, dtype)
    return functools.partial(train_step, model, optimizer, images, y)


def _first_steps(option: str, run: Callable[[], Any], device: torch.device) -> dict[str, Any]:
    """``option``'s row after its first step (timed alone) and a second, untimed one; its error
    instead when either fails."""
    row: dict[str, Any] = {"option": option, "images_per_s": None, "first_step_s": None, "speedup": None, "error": None}
    try:
        t0 = time.perf_counter()
        run()
        synchronize(device)
        row["first_step_s"] = time.perf_counter() - t0
        run()  # a second untimed step: allocations and caches settle
    except Exception as exc:  # one option failing must not hide the others
        first_line = (str(exc).strip().splitlines() or [""])[0]
        row["error"] = f"{type(exc).__name__}: {first_line[:200]}"
    return row


def _timed_rounds(runs: dict[str, Callable[[], Any]], steps: int, batch_size: int, repeats: int,
                  device: torch.device, round_s: float = float("inf")) -> dict[str, list[float]]:
    """Images/s of each option's ``steps`` steps (fewer once a round passes ``round_s``),
    ``repeats`` rounds through the options in turn."""
    rates: dict[str, list[float]] = {option: [] for option in runs}
    for _ in range(repeats):
        for option, run in runs.items():
            synchronize(device)
            t0 = time.perf_counter()
            done = 0
            while done < steps and (done == 0 or time.perf_counter() - t0 < round_s):
                run()
                synchronize(device)
                done += 1
            rates[option].append(done * batch_size / (time.perf_counter() - t0))
    return rates


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
