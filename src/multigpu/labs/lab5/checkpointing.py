"""Lab 5, part 6: activation checkpointing (``torch.utils.checkpoint``), measured.

A chain of ``n`` layers keeps every layer's input for the backward pass: activations grow with
``n``. Checkpointing cuts the chain into ``k`` segments and keeps only each segment's input; in
the backward pass it runs each segment's forward again, keeping that segment's activations just
while it goes backward through it. At the peak a step holds ``k`` segment inputs plus one
segment's ``n / k`` layers: ``k + n / k`` layers' worth, smallest at ``k = sqrt(n)`` (Chen et al.,
"Training deep nets with sublinear memory cost", 2016, section 4.3), for one extra forward pass.

:func:`measure` counts both from the tensors autograd saves
(:class:`~multigpu.labs.lab5.memory.SavedTensors`: the bytes held when the forward pass ends,
and the peak over forward and backward, recomputation included) and times whole steps,
interleaved. The segments are checkpointed with ``use_reentrant=True``: its recomputation runs
under the caller's saved-tensor hooks, so the peak counts it (the non-reentrant form recomputes
out of their sight).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from multigpu.labs.lab5.memory import SavedTensors


def segments_of(modules: Sequence[nn.Module], k: int) -> list[nn.Sequential]:
    """``modules`` cut into ``k`` consecutive segments of (nearly) equal length."""
    n = len(modules)
    return [nn.Sequential(*modules[i * n // k:(i + 1) * n // k]) for i in range(k)]


def run_checkpointed(modules: Sequence[nn.Module], x: torch.Tensor, k: int) -> torch.Tensor:
    """``modules`` applied in turn to ``x``; with ``k`` > 0 in ``k`` checkpointed segments."""
    if k == 0:
        for m in modules:
            x = m(x)
        return x
    if not x.requires_grad:  # a reentrant checkpoint needs an input that requires grad
        x = x.detach().requires_grad_(True)
    for segment in segments_of(modules, k):
        x = checkpoint(segment, x, use_reentrant=True)
    return x


def chain(layers: int, width: int, seed: int = 0) -> list[nn.Module]:
    """``layers`` Linear+ReLU blocks of ``width``."""
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(layers)]


def one_step(forward: Callable[[], torch.Tensor], params: Sequence[torch.Tensor]) -> dict[str, float]:
    """Forward, backward of ``forward()``'s mean; the activation bytes held and the time."""
    saved = SavedTensors(exclude=params)
    for p in params:
        p.grad = None
    t0 = time.perf_counter()
    with saved.hooks():
        out = forward()
        saved.after_forward()
        out.float().mean().backward()
    return {"held_after_forward": saved.held_after_forward, "peak": saved.peak, "step_s": time.perf_counter() - t0}


def measure(modules: Sequence[nn.Module], make_input: Callable[[], torch.Tensor], segments: Sequence[int],
            repeats: int = 3, loss: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[int, dict[str, float]]:
    """Per number of segments (0: no checkpointing): activation bytes held after the forward pass
    and at the peak, and the median step time over ``repeats`` rounds, interleaved."""
    params = [p for m in modules for p in m.parameters()]
    rows: dict[int, list[dict[str, float]]] = {k: [] for k in segments}
    x = make_input()
    for k in segments:  # one untimed round first (allocator, thread pools)
        one_step(lambda: run_checkpointed(modules, x, k), params)
    for _ in range(repeats):
        for k in segments:
            rows[k].append(one_step(lambda: (loss or (lambda y: y))(run_checkpointed(modules, x, k)), params))
    return {k: {"held_after_forward": r[0]["held_after_forward"], "peak": max(s["peak"] for s in r),
                "step_s": statistics.median(s["step_s"] for s in r)} for k, r in rows.items()}


def sqrt_rule(layers: int) -> int:
    """The number of segments Chen et al.'s rule picks: the integer nearest sqrt(n)."""
    return max(1, round(math.sqrt(layers)))


def course_model_modules(model: nn.Module) -> list[nn.Module]:
    """The course model (AlexNetSmall) as a list of modules to checkpoint: its convolutional
    blocks one by one, then the pool, flatten and classifier as one module."""
    head = nn.Sequential(model.avgpool, nn.Flatten(), model.classifier)  # type: ignore[arg-type]
    return [*model.features, head]  # type: ignore[misc]


def course_model(batch: int, segments: Sequence[int], repeats: int = 3, seed: int = 0) -> dict[int, dict[str, Any]]:
    """:func:`measure` on the course's AlexNetSmall (64 x 64 images, ``batch`` of them; the ReLUs
    not in place, which a recomputed segment cannot share)."""
    from multigpu.core import models

    torch.manual_seed(seed)
    model = models.build_model("alexnet_small")
    for m in model.modules():
        if isinstance(m, nn.ReLU):
            m.inplace = False
    model.train()
    modules = course_model_modules(model)
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 3, models.CPU_IMAGE_SIZE, models.CPU_IMAGE_SIZE, generator=g)
    labels = torch.randint(0, 10, (batch,), generator=g)
    return measure(modules, lambda: images, segments, repeats, loss=lambda y: F.cross_entropy(y, labels))
