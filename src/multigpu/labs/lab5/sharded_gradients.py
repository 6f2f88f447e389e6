"""Lab 5, part 2: ZeRO stage 2 by hand over Horovod, the gradient sharded as backward produces it.

Stage 1 (:mod:`~multigpu.labs.lab5.zero`) shards the optimizer state, but every rank holds the
whole gradient until backward ends. ZeRO's stage 2 (Rajbhandari et al. 2020, section 5.2, P_g)
reduces each bucket of the gradient as soon as backward has produced it and keeps only the part
the rank owns. :class:`Stage2Adam` does it with Horovod:

- each rank owns a contiguous block of rows of every parameter (:func:`rows_of`: the rows
  Horovod's reduce-scatter gives it) and Adam steps those rows only;
- a bucket is one layer's parameters: when backward has produced all their gradients (a
  post-accumulate-grad hook on each), they are reduce-scattered asynchronously
  (``hvd.grouped_reducescatter_async``, averaged) and backward goes on with the layers below;
- just before each layer's backward, the reductions already done are taken in (their rows
  added to the shards' gradients, the full gradients freed), and while the layer would bring the
  full gradients of more than ``in_flight`` layers, the oldest reduction is waited for;
- after the step, the updated rows are all-gathered (``hvd.grouped_allgather``) into the weights.

So a rank holds its 1/N of the gradient plus at most ``in_flight`` layers' full gradients: the
bound is set by the largest layers, since autograd produces each layer's gradient whole. In a
model of many layers (:data:`~multigpu.labs.lab5.zero.MANY_LAYERS`) that is a small share;
:class:`~multigpu.labs.lab5.memory.GradientMemory` samples what is held, from the tensors.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from multigpu.labs.lab5.memory import GradientMemory, optimizer_state_bytes

#: The layers whose full gradients may exist at once: the one backward just produced and the
#: ones still being reduce-scattered while backward goes on.
IN_FLIGHT = 4


def rows_of(rows: int, rank: int, workers: int) -> tuple[int, int]:
    """The rows ``[a, b)`` of a first dimension of ``rows`` that Horovod's reduce-scatter gives
    ``rank`` (as ``torch.tensor_split``: the first ``rows % workers`` ranks get one more)."""
    base, extra = divmod(rows, workers)
    a = rank * base + min(rank, extra)
    return a, a + base + (1 if rank < extra else 0)


class Stage2Adam:
    """ZeRO stage 2 over Horovod (see the module's docstring): each layer's gradient reduce-scattered
    in backward as soon as it is complete and freed when reduced; Adam over this rank's rows of
    every parameter; the updated rows all-gathered after the step."""

    def __init__(self, model: nn.Module, lr: float = 1e-3, in_flight: int = IN_FLIGHT) -> None:
        import horovod.torch as hvd

        rank, n = hvd.rank(), hvd.size()
        self.params = list(model.parameters())
        self.rows = [rows_of(p.shape[0], rank, n) for p in self.params]
        self.shards = [p.detach()[a:b].clone().requires_grad_(True) for p, (a, b) in zip(self.params, self.rows)]
        self.optimizer = torch.optim.Adam(self.shards, lr=lr)
        self.memory, self.in_flight = GradientMemory(), in_flight
        self.shard_grad_bytes = 0  # the shards' gradients, counted when the step's first reduction makes each
        self.pending: list[tuple[Any, list[int], list[torch.Tensor | None]]] = []  # (handle, bucket, full gradients)
        index = {id(p): i for i, p in enumerate(self.params)}
        layers = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
        self.arrived = [0] * len(layers)
        for k, layer in enumerate(layers):
            bucket = [index[id(p)] for p in layer.parameters(recurse=False)]
            layer.register_forward_hook(self.watch_output)
            for i in bucket:
                self.params[i].register_post_accumulate_grad_hook(lambda _, k=k, bucket=bucket: self.grad_ready(k, bucket))

    def sample(self) -> None:
        """The gradient bytes this rank holds now: its shards', backward's, and those being reduced."""
        whole = [*(p.grad for p in self.params), *(g for *_, grads in self.pending for g in grads)]
        self.memory.sample(whole, counted=self.shard_grad_bytes)

    def watch_output(self, module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
        if output.requires_grad:
            output.register_hook(self.before_layer_backward)

    def before_layer_backward(self, grad: torch.Tensor) -> torch.Tensor:
        """A layer's backward is about to produce its gradients: take in what is reduced already,
        and wait for the oldest reductions while the layer would bring more than ``in_flight``."""
        import horovod.torch as hvd

        while self.pending and (len(self.pending) >= self.in_flight or hvd.poll(self.pending[0][0])):
            self.take_oldest()
        return grad

    def grad_ready(self, k: int, bucket: list[int]) -> None:
        import horovod.torch as hvd

        self.sample()
        self.arrived[k] += 1
        if self.arrived[k] < len(bucket):
            return
        self.arrived[k] = 0
        grads = [self.params[i].grad for i in bucket]
        handle = hvd.grouped_reducescatter_async(grads, op=hvd.Average, name=f"zero2.layer{k}")
        for i in bucket:
            self.params[i].grad = None
        self.pending.append((handle, bucket, grads))

    def take_oldest(self) -> None:
        """Wait for the oldest reduce-scatter, add its rows to the shards' gradients, free its inputs."""
        import horovod.torch as hvd

        handle, bucket, _ = self.pending[0]
        for i, rows in zip(bucket, hvd.synchronize(handle)):
            shard = self.shards[i]
            if shard.grad is None:
                shard.grad = rows
                self.shard_grad_bytes += rows.untyped_storage().nbytes()
            else:
                shard.grad.add_(rows)
        self.sample()
        self.pending.pop(0)

    def zero_grad(self) -> None:
        for s in self.shards:
            s.grad = None
        self.shard_grad_bytes = 0

    def step(self) -> None:
        import horovod.torch as hvd

        while self.pending:
            self.take_oldest()
        self.optimizer.step()
        gathered = hvd.grouped_allgather([s.detach() for s in self.shards], name="zero2.weights")
        with torch.no_grad():
            for p, full in zip(self.params, gathered):
                p.copy_(full.view_as(p))

    def owned_gradient(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The flat indices (the parameters' order, each flattened) of this rank's rows, and their gradient."""
        index, values, offset = [], [], 0
        for p, (a, b), s in zip(self.params, self.rows, self.shards):
            if s.grad is None:
                return None
            cols = p.numel() // p.shape[0]
            index.append(torch.arange(offset + a * cols, offset + b * cols))
            values.append(s.grad.detach().flatten().clone())
            offset += p.numel()
        return torch.cat(index), torch.cat(values)

    def state_bytes(self) -> int:
        return optimizer_state_bytes(self.optimizer)


