"""Lab 1, part 5: LARS, a layer-wise learning rate for large batches.

You, Gitman and Ginsburg, "Large Batch Training of Convolutional Networks" (2017): with one global
learning rate, a large batch's scaled rate is too large for some layers (whose gradient is large
against their weights) and too small for others. LARS gives each layer ``l`` its own rate
``lr x trust ratio``, the trust ratio being ``eta ||w_l|| / (||g_l|| + weight_decay ||w_l||)``:
every step then moves a layer by about ``lr x eta`` of its own norm, whatever its gradient's size.

:func:`trust_ratio` is the reference of the lab's exercise; :class:`LARS` is SGD with momentum
and weight decay whose step for each weight matrix or kernel is scaled by a trust ratio (the
learner's function in the lab). Biases and BatchNorm parameters (1-d tensors) keep the global rate
and no weight decay, as is usual since the paper.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from multigpu.core.training import REFERENCE

#: A trust-ratio function: (weight, gradient, eta, weight_decay) -> float.
TrustRatio = Callable[[torch.Tensor, torch.Tensor, float, float], float]


def trust_ratio(weight: torch.Tensor, grad: torch.Tensor, eta: float = 0.001, weight_decay: float = 0.0) -> float:
    """``eta ||w|| / (||g|| + weight_decay ||w||)``; 1.0 where that is undefined or zero (a layer
    whose weights are all zero, or whose gradient and decay are both zero), so such a layer keeps
    the global rate instead of freezing or dividing by zero."""
    w = float(weight.detach().double().norm())  # in float64: no overflow for large layers
    denominator = float(grad.detach().double().norm()) + weight_decay * w
    if w == 0.0 or denominator == 0.0:
        return 1.0
    return eta * w / denominator


def adapted(param: torch.Tensor) -> bool:
    """Whether LARS scales this parameter's step: weight matrices and kernels, not biases or
    BatchNorm's scales and shifts."""
    return param.ndim > 1


class LARS(torch.optim.Optimizer):
    """SGD with momentum where each adapted layer's step is ``lr x trust ratio x (g + wd w)``:

    ``v = momentum v + lr x ratio x (g + weight_decay w)``, ``w = w - v`` (the paper's update;
    1-d parameters: ratio 1 and no weight decay). ``ratio`` is computed by ``trust_ratio_fn``
    (:func:`trust_ratio` by default) from the weight and the raw gradient.
    """

    def __init__(self, params: Iterable[torch.Tensor], lr: float, *, momentum: float = REFERENCE.momentum,
                 weight_decay: float = REFERENCE.weight_decay, eta: float = 0.001,
                 trust_ratio_fn: TrustRatio | None = None) -> None:
        if lr < 0 or eta <= 0:
            raise ValueError(f"lr must be >= 0 and eta > 0, got lr={lr}, eta={eta}")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, eta=eta))
        self.trust_ratio_fn = trust_ratio_fn or trust_ratio

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if adapted(p):
                    ratio = float(self.trust_ratio_fn(p, p.grad, group["eta"], group["weight_decay"]))
                    update = p.grad.add(p, alpha=group["weight_decay"])
                else:
                    ratio, update = 1.0, p.grad
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buf = state["momentum_buffer"]
                buf.mul_(group["momentum"]).add_(update, alpha=group["lr"] * ratio)
                p.sub_(buf)
        return loss


def make_lars(model: nn.Module, lr: float, eta: float = 0.001, trust_ratio_fn: TrustRatio | None = None) -> LARS:
    """LARS over ``model``'s parameters with the course's momentum and weight decay (as
    :func:`multigpu.core.training.make_optimizer`)."""
    return LARS(model.parameters(), lr, eta=eta, trust_ratio_fn=trust_ratio_fn)
