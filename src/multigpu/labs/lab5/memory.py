"""Lab 5, part 1: where a training step's memory goes, counted from the tensors themselves.

A step holds four kinds of bytes: the **parameters**, their **gradients**, the **optimizer's
state** (SGD's momentum, Adam's two moments, the float32 master weights of mixed precision) and
the **activations** the forward pass keeps for the backward pass. :func:`measure_state` builds a
model and an optimizer, runs one real step and adds up the storages of each kind; the
activations are the tensors autograd saved (:class:`SavedTensors`, through
``torch.autograd.graph.saved_tensors_hooks``), the parameters among them left out.

ZeRO's accounting (Rajbhandari et al., "ZeRO: Memory optimizations toward training trillion
parameter models", SC'20): mixed-precision Adam keeps 2 + 2 + 12 bytes per parameter (section
3.1: fp16 weights and gradients, and K = 12 bytes of fp32 master weights, momentum and variance);
sharding over N data-parallel workers leaves per device 4 + 12/N bytes (stage 1, the optimizer
state sharded), 2 + 14/N (stage 2, the gradients too) and 16/N (stage 3, the weights too):
section 5 and Figure 1. :func:`zero_bytes` is that table for any optimizer of
:data:`OPTIMIZER_BYTES`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

#: Bytes per parameter each optimizer's training keeps: (weights, gradients, optimizer state).
OPTIMIZER_BYTES: dict[str, tuple[int, int, int]] = {
    "sgd momentum": (4, 4, 4),  # fp32 weights and gradients, one fp32 momentum
    "adam": (4, 4, 8),  # fp32 weights and gradients, two fp32 moments
    "mixed adam": (2, 2, 12),  # bf16/fp16 weights and gradients; fp32 master weights and two moments
}
STAGES = (0, 1, 2, 3)


def zero_bytes_per_parameter(stage: int, workers: int, optimizer: str = "mixed adam") -> float:
    """Bytes each of ``workers`` data-parallel devices keeps per parameter at ZeRO ``stage`` (0: none)."""
    if stage not in STAGES:
        raise ValueError(f"ZeRO has stages 0 (plain data parallelism) to 3, not {stage}")
    w, g, k = OPTIMIZER_BYTES[optimizer]
    n = workers
    return {0: w + g + k, 1: w + g + k / n, 2: w + (g + k) / n, 3: (w + g + k) / n}[stage]


def zero_bytes(parameters: float, stage: int, workers: int, optimizer: str = "mixed adam") -> float:
    """Bytes of model state (weights, gradients, optimizer state) per device: ZeRO's table."""
    return parameters * zero_bytes_per_parameter(stage, workers, optimizer)


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views of one storage count once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())



class GradientMemory:
    """The bytes of gradient tensors a data-parallel rank holds (distinct storages), sampled
    wherever one is created or freed, and their peak (Lab 5's ZeRO stages)."""

    def __init__(self) -> None:
        self.peak = 0

    def sample(self, tensors: Iterable[torch.Tensor | None], counted: int = 0) -> None:
        """``counted``: bytes of other gradient storages, counted when they were made."""
        self.peak = max(self.peak, counted + storage_bytes(t for t in tensors if t is not None))

class _Held:
    """What autograd stores for one saved tensor while :class:`SavedTensors` watches."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class SavedTensors:
    """What autograd keeps for the backward pass, live and at its peak, in bytes.

    Use as ``with saved.hooks(): loss = ...; loss.backward()``. Every tensor autograd saves
    passes :meth:`pack`, which hands autograd a holder of it; a storage counts while autograd
    keeps a holder of a tensor on it (autograd frees them as the backward pass uses them). The
    storages of ``exclude`` (the parameters, which exist anyway) never count.
    ``after_forward()`` marks the bytes held when the forward pass ends.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self.excluded = {t.untyped_storage().data_ptr() for t in exclude}
        self.live: dict[int, list[int]] = {}  # storage -> [bytes, holders on it]
        self.now = self.peak = self.held_after_forward = 0

    def pack(self, t: torch.Tensor) -> Any:
        key = t.untyped_storage().data_ptr()
        if key in self.excluded:
            return t
        if key not in self.live:
            self.live[key] = [t.untyped_storage().nbytes(), 0]
            self.now += self.live[key][0]
            self.peak = max(self.peak, self.now)
        self.live[key][1] += 1
        held = _Held(t)
        weakref.finalize(held, self._release, key)
        return held

    @staticmethod
    def unpack(held: Any) -> torch.Tensor:
        return held.tensor if isinstance(held, _Held) else held

    def _release(self, key: int) -> None:
        entry = self.live[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.now -= entry[0]
            del self.live[key]

    def hooks(self) -> Any:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def after_forward(self) -> int:
        self.held_after_forward = self.now
        return self.now


class MixedPrecisionAdam:
    """Mixed-precision training with Adam, as ZeRO counts it: the model computes in bfloat16
    (2-byte weights and gradients); the optimizer keeps fp32 master weights and Adam's two fp32
    moments (12 bytes per parameter) and copies the updated masters back into the model."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float = 1e-3) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.masters = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        self.adam = torch.optim.Adam(self.masters, lr=lr)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for p, m in zip(self.params, self.masters):
            m.grad = None if p.grad is None else p.grad.float()
        self.adam.step()
        for p, m in zip(self.params, self.masters):
            m.grad = None
            p.copy_(m)

    def state_tensors(self) -> list[torch.Tensor]:
        return [*self.masters, *optimizer_state_tensors(self.adam)]


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor an optimizer keeps between steps (momentum, moments, step counters)."""
    return [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of an optimizer's state tensors (Adam's moments; not its scalar step counters)."""
    return sum(t.numel() * t.element_size() for t in optimizer_state_tensors(optimizer) if t.dim() > 0)


def make_optimizer(name: str, model: nn.Module, lr: float = 1e-3) -> Any:
    """The optimizer of :data:`OPTIMIZER_BYTES` called ``name`` over ``model`` ("mixed adam"
    first moves the model to bfloat16)."""
    if name == "sgd momentum":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr)
    if name == "mixed adam":
        model.to(torch.bfloat16)
        return MixedPrecisionAdam(model.parameters(), lr=lr)
    raise ValueError(f"unknown optimizer {name!r}; choose one of {sorted(OPTIMIZER_BYTES)}")


def state_tensors(optimizer: Any) -> list[torch.Tensor]:
    """The optimizer state of :func:`make_optimizer`'s optimizers."""
    if isinstance(optimizer, MixedPrecisionAdam):
        return optimizer.state_tensors()
    return optimizer_state_tensors(optimizer)


def measure_state(build: Callable[[], nn.Module], optimizer: str, inputs: torch.Tensor,
                  targets: torch.Tensor, device: str | torch.device = "cpu") -> dict[str, float]:
    """One training step of ``build()`` with ``optimizer`` on a batch, on ``device``; the bytes of
    each kind, counted from the tensors after the step (activations: saved by the forward pass)."""
    model = build().to(device)
    inputs, targets = inputs.to(device), targets.to(device)
    opt = make_optimizer(optimizer, model)
    dtype = next(model.parameters()).dtype
    params = list(model.parameters())
    saved = SavedTensors(exclude=params)
    for _ in range(2):  # the second step finds the optimizer state created by the first
        opt.zero_grad()
        with saved.hooks():
            loss = F.cross_entropy(model(inputs.to(dtype)).float(), targets)
            saved.after_forward()
            loss.backward()
        opt.step()
    count = sum(p.numel() for p in params)
    out = {
        "parameters": float(count),
        "weights": float(storage_bytes(params)),
        "gradients": float(storage_bytes(p.grad for p in params if p.grad is not None)),
        "optimizer state": float(storage_bytes(state_tensors(opt))),
        "activations": float(saved.held_after_forward),
    }
    out["model state per parameter"] = (out["weights"] + out["gradients"] + out["optimizer state"]) / count
    return out
