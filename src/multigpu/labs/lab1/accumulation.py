"""Lab 1, part 7: gradient accumulation, a batch larger than memory holds.

The backward pass needs the activations the forward pass saved, and they grow with the batch.
Gradient accumulation splits a batch of ``B`` into ``k`` micro-batches, runs forward and backward
on each in turn and lets the gradients add up in ``.grad`` (each micro-batch's mean loss weighted
by its share of the batch), then takes one optimizer step: the same gradient as one batch of ``B``
(for a model without BatchNorm, whose output for one example does not depend on the others), with
the activations of only ``B / k`` examples alive at a time. It costs speed: ``k`` smaller steps
use the hardware less well than one large one.

:func:`accumulate` is the reference of the lab's exercise. :class:`SavedTensors` measures the bytes
the autograd graph keeps for the backward pass (through
``torch.autograd.graph.saved_tensors_hooks``): the peak of those alive at once, parameters
excluded. :func:`measure` compares ``k`` micro-batches against one batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

import numpy as np
import torch
from torch import nn

#: A loss: (outputs, targets) -> a scalar tensor, the mean over the batch.
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: An accumulation: (model, loss_fn, inputs, targets, micro_batches) -> the batch's loss.
Accumulate = Callable[[nn.Module, LossFn, torch.Tensor, torch.Tensor, int], Any]


def accumulate(model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor, targets: torch.Tensor, micro_batches: int) -> float:
    """Fill every parameter's ``.grad`` with the gradient of ``loss_fn`` over the whole batch,
    computed on ``micro_batches`` pieces (``torch.tensor_split``: sizes differ by at most one), one
    forward and backward at a time; return the whole batch's loss. Takes no optimizer step."""
    if micro_batches < 1:
        raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
    model.zero_grad(set_to_none=True)
    total = 0.0
    for x, y in zip(torch.tensor_split(inputs, micro_batches), torch.tensor_split(targets, micro_batches)):
        if len(x):
            loss = loss_fn(model(x), y) * (len(x) / len(inputs))  # mean over the piece -> its share of the batch's mean
            loss.backward()
            total += loss.item()
    return total


class _Held:
    """A saved tensor, packed: tells its :class:`SavedTensors` when autograd frees it."""

    def __init__(self, tensor: torch.Tensor, owner: SavedTensors, key: tuple[int, int] | None) -> None:
        self.tensor, self.owner, self.key = tensor, owner, key

    def __del__(self) -> None:
        if self.key is not None:
            self.owner.release(self.key)


class SavedTensors:
    """``with SavedTensors(model) as saved: ...``: ``saved.peak_bytes`` is the most bytes of tensors
    the autograd graph held for backward at any one time inside the block (each storage counted
    once, by its own size; the model's parameters, which exist anyway, left out)."""

    def __init__(self, model: nn.Module) -> None:
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.refs: dict[tuple[int, int], int] = {}  # (address, bytes) -> packs alive
        self.live_bytes = 0
        self.peak_bytes = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, tensor: torch.Tensor) -> _Held:
        nbytes = tensor.numel() * tensor.element_size()  # the tensor's own bytes: a view of a batch is not the batch
        key = (tensor.data_ptr(), nbytes)
        if tensor.untyped_storage().data_ptr() in self.params or not nbytes:
            return _Held(tensor, self, None)
        if key not in self.refs:
            self.refs[key] = 0
            self.live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self.refs[key] += 1
        return _Held(tensor, self, key)

    @staticmethod
    def unpack(held: _Held) -> torch.Tensor:
        return held.tensor

    def release(self, key: tuple[int, int]) -> None:
        self.refs[key] -= 1
        if not self.refs[key]:
            del self.refs[key]
            self.live_bytes -= key[1]

    def __enter__(self) -> SavedTensors:
        self._hooks.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._hooks.__exit__(kind, error, tb)


def gradients(model: nn.Module) -> list[torch.Tensor]:
    """A copy of every parameter's ``.grad`` (zeros where it is None)."""
    return [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def max_difference(model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor, targets: torch.Tensor, micro_batches: int,
                   accumulate_fn: Accumulate = accumulate) -> float:
    """The largest difference between ``accumulate_fn``'s gradient and one batch's, relative to the
    largest gradient element, in the mode the model is in (in training mode BatchNorm normalises
    each micro-batch by its own statistics, so they differ; dropout draws other masks)."""
    model.zero_grad(set_to_none=True)
    loss_fn(model(inputs), targets).backward()
    whole = gradients(model)
    accumulate_fn(model, loss_fn, inputs, targets, micro_batches)
    pieces = gradients(model)
    scale = max(float(g.abs().max()) for g in whole)
    return max(float((a - b).abs().max()) for a, b in zip(whole, pieces)) / scale


def measure(model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor, targets: torch.Tensor, micro_batches: Iterable[int],
            accumulate_fn: Accumulate = accumulate, repeats: int = 3) -> list[dict[str, Any]]:
    """For each ``k`` in ``micro_batches``: the peak bytes saved for backward while
    ``accumulate_fn`` runs on ``k`` micro-batches, and its seconds per example (the median of
    ``repeats`` timed calls after one untimed call)."""
    rows = []
    for k in micro_batches:
        with SavedTensors(model) as saved:
            accumulate_fn(model, loss_fn, inputs, targets, k)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            accumulate_fn(model, loss_fn, inputs, targets, k)
            times.append(time.perf_counter() - started)
        rows.append({"micro_batches": k, "micro_batch": -(-len(inputs) // k), "saved_bytes": saved.peak_bytes,
                     "s_per_example": float(np.median(times)) / len(inputs)})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """:func:`measure`'s rows as text, each against one batch (the first row)."""
    first = rows[0]
    lines = [f"{'k':>3} {'micro-batch':>11} {'saved for backward':>19} {'vs one batch':>13} {'ms per example':>15} {'vs one batch':>13}"]
    for r in rows:
        lines.append(f"{r['micro_batches']:>3} {r['micro_batch']:>11} {r['saved_bytes'] / 2**20:>16.1f} MB "
                     f"{r['saved_bytes'] / first['saved_bytes']:>12.2f}x {1e3 * r['s_per_example']:>15.2f} "
                     f"{r['s_per_example'] / first['s_per_example']:>12.2f}x")
    return "\n".join(lines)
