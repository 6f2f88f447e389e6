"""Lab 3: BatchNorm over several workers, with small per-worker batches.

A BatchNorm layer in training normalises each channel by the mean and variance of the batch it
sees. Under data parallelism each worker sees only its own few images, so plain BatchNorm
normalises by statistics of ``batch`` images (noisy when that is 2-4) and each rank keeps its own
running statistics: the weights are identical on every rank (Horovod averages the gradients), the
buffers are not. ``hvd.SyncBatchNorm`` normalises by the statistics of the global batch instead.

Horovod's ``SyncBatchNorm`` (0.28.1) accepts only CUDA tensors, in evaluation too (its ``forward``
raises on CPU input before it looks at the mode). In training its forward pass all-gathers each
worker's count, per-channel mean and inverse standard deviation (three all-gathers) and combines
them with CUDA-only torch kernels (``torch.batch_norm_stats`` and friends); its backward pass
all-reduces two per-channel sums (``sum_dy``, ``sum_dy_xmu``). :class:`SyncBatchNorm` here is that
class, and on CPU tensors it all-reduces the moments instead: each worker's per-channel count, sum
and sum of squares, summed over the workers in one ``hvd.allreduce`` (differentiable: its backward
is one all-reduce of the gradients of the moments, which is what the global statistics' gradient
needs); in evaluation it is a plain BatchNorm. The statistics, the normalisation and the
running-statistics update are those of a plain BatchNorm over the global batch, with one caveat:
the variance is ``E[x^2] - E[x]^2``, which in float32 cancels when a channel's mean is large against
its spread (measured on a 2 x 16 x 32 x 32 batch: at a mean 100 times the standard deviation the
variance is off by up to 0.3%, at 1000 times by up to 20%, at a few thousand times it is noise; the
clamp at zero hides a negative result). That is fine for the
normalised activations of the lab's network; Horovod's and torch's own versions combine each
worker's mean and variance instead, which does not cancel.

:func:`experiment` runs inside a Horovod job (``launch.run_horovod``): the same small BatchNorm
network (:func:`bn_net`) trained a few steps with plain and with synchronised BatchNorm, and what
differs between the two.
"""

from __future__ import annotations

import statistics
from typing import Any

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from torch import nn

from multigpu.core import data

#: What a BatchNorm to be replaced is: every plain BatchNorm layer torch has.
PLAIN_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


class SyncBatchNorm(hvd.SyncBatchNorm):
    """``hvd.SyncBatchNorm``; on CPU tensors the global batch's moments by ``hvd.allreduce`` (module docstring)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.is_cuda:
            return super().forward(input)  # Horovod's own: all-gathered moments, CUDA kernels
        if not (self.training or not self.track_running_stats) or not hvd.is_initialized() or hvd.size() == 1:
            return self._plain(input)  # evaluation with the running statistics, or one worker
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
        dims = [d for d in range(input.dim()) if d != 1]
        local = torch.cat([
            input.sum(dims), (input * input).sum(dims),
            torch.tensor([input.numel() / input.size(1)], dtype=input.dtype),
        ])
        total = hvd.allreduce(local, op=hvd.Sum, name="sync_batch_norm.moments")
        channels = input.size(1)
        count = total[-1]
        mean = total[:channels] / count
        var = (total[channels:2 * channels] / count - mean * mean).clamp(min=0)
        if self.training and self.track_running_stats:
            with torch.no_grad():
                momentum = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
                self.running_mean.lerp_(mean.detach(), momentum)
                self.running_var.lerp_(var.detach() * count / (count - 1).clamp(min=1), momentum)
        shape = [1, channels] + [1] * (input.dim() - 2)
        out = (input - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out

    def _plain(self, input: torch.Tensor) -> torch.Tensor:
        """One worker (or evaluation): exactly a plain BatchNorm."""
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
        momentum = self.momentum
        if self.training and self.track_running_stats and momentum is None:
            momentum = 1.0 / float(self.num_batches_tracked)
        return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                            self.training or not self.track_running_stats, momentum or 0.0, self.eps)


def convert(module: nn.Module) -> nn.Module:
    """Every plain BatchNorm in ``module``, at any depth, replaced by :class:`SyncBatchNorm` with its state.

    The package version of Lab 3's ``to_sync_batchnorm``: weights, biases and running statistics
    are kept (``load_state_dict``), and so are each layer's eps, momentum, mode (training or
    evaluation) and frozen parameters, as torch's ``convert_sync_batchnorm`` keeps them: a trained
    or restored network converts without a change. The new layers' parameters are new tensors:
    convert before the optimizer is built, which holds the parameters it was given.
    """
    if isinstance(module, PLAIN_BATCH_NORMS):
        sync = SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats)
        sync.load_state_dict(module.state_dict())
        sync.train(module.training)
        for new, old in zip(sync.parameters(), module.parameters()):
            new.requires_grad_(old.requires_grad)  # a frozen layer stays frozen
        return sync
    for name, child in module.named_children():
        setattr(module, name, convert(child))
    return module


def bn_net(num_classes: int = 10, width: int = 16) -> nn.Sequential:
    """A small BatchNorm network for 64x64 images: two conv-BN-ReLU blocks (the second nested), a linear head.

    Nested on purpose (a BatchNorm at the top level and one inside a block), the way real
    networks are: a conversion that only looks at the top level misses one.
    """
    return nn.Sequential(
        nn.Conv2d(3, width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Sequential(nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU()),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, num_classes),
    )


def load_images(root: Any, split: str, count: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` images of ``split`` (a seeded choice), decoded once, as (images, labels) tensors."""
    dataset = data.JPEGFolder(root, data.val_transform(64), split=split)
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:count]
    images, labels = data.collate([dataset[int(i)] for i in order])
    return images, labels


def _relative_gap(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """The largest difference between two ranks' buffers, relative to the buffer's size."""
    return max(float((x - y).abs().max() / x.abs().max().clamp(min=1e-12)) for x, y in zip(a, b))


@torch.no_grad()
def _population(layer: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per channel, the mean and standard deviation of ``layer``'s output over all of ``x``, each
    rank computing its share of the images (the same weights on every rank, so the same result)."""
    features = layer(x[hvd.rank()::hvd.size()]).double()
    per_channel = features.transpose(0, 1).flatten(1)
    moments = torch.cat([per_channel.sum(1), (per_channel * per_channel).sum(1),
                         torch.tensor([float(per_channel.shape[1])], dtype=torch.float64)])
    total = hvd.allreduce(moments, op=hvd.Sum, name="syncbn.population")
    channels = features.shape[1]
    mean = total[:channels] / total[-1]
    var = total[channels:2 * channels] / total[-1] - mean * mean
    return mean.float(), var.clamp(min=1e-12).sqrt().float()


def one_run(images: tuple[torch.Tensor, ...], sync: bool, seed: int, batch: int, steps: int, lr: float) -> dict[str, Any]:
    """Train :func:`bn_net` ``steps`` steps on this rank's ``batch`` images of a global batch; what it measured.

    ``images``: (train x, train y, val x, val y), the same on every rank. Each step draws one
    global batch of ``batch x size`` images (same draw on every rank) and gives this rank its
    slice. ``deviation``: how far the mean the first BatchNorm normalised this rank's images by
    was from the mean over every training image, per channel in their standard deviations,
    averaged over the channels and steps (plain: this rank's batch's mean; sync: the global
    batch's). Both means are taken with the same weights, the step's before its update.
    """
    x, y, xv, yv = images
    torch.manual_seed(seed)
    model = bn_net()
    if sync:
        convert(model)  # in place: the same Sequential, its BatchNorms replaced
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                                   named_parameters=model.named_parameters())
    seen: list[torch.Tensor] = []
    hook = model[1].register_forward_pre_hook(lambda m, inp: seen.append(inp[0].detach().mean((0, 2, 3))))
    draw, deviations, losses = torch.Generator().manual_seed(seed), [], []
    for _ in range(steps):
        chosen = torch.randperm(len(x), generator=draw)[hvd.rank() * batch:(hvd.rank() + 1) * batch]
        opt.zero_grad()
        loss = F.cross_entropy(model(x[chosen]), y[chosen])
        population, spread = _population(model[0], x)  # with the weights the batch's mean was taken with
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        used = hvd.allreduce(seen[-1], name="syncbn.global_mean") if sync else seen[-1]
        deviations.append(float(((used - population) / spread).abs().mean()))
    hook.remove()
    model.eval()
    with torch.no_grad():
        logits = model(xv)
    return {
        "deviation": statistics.fmean(deviations),
        "buffers": [b.clone() for name, b in model.named_buffers() if name.endswith(("running_mean", "running_var"))],
        "val_acc": float((logits.argmax(1) == yv).float().mean()),
        "val_loss": float(F.cross_entropy(logits, yv)),
        "train_loss": statistics.fmean(losses[-max(1, steps // 4):]),
    }


def experiment(root: Any, batch: int = 2, steps: int = 40, seeds: tuple[int, ...] = (0, 1, 2), lr: float = 0.05,
               train_images: int = 320, val_images: int = 200) -> dict[tuple[str, int], dict[str, Any]]:
    """In every worker of a Horovod job: :func:`one_run` with plain and with synchronised BatchNorm, per seed."""
    hvd.init()
    torch.set_num_threads(1)
    images = (*load_images(root, "train", train_images), *load_images(root, "val", val_images, seed=1))
    return {(mode, seed): one_run(images, mode == "sync", seed, batch, steps, lr)
            for mode in ("plain", "sync") for seed in seeds}


def summarise(per_rank: list[dict[tuple[str, int], dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per mode ("plain", "sync"): the figures :func:`experiment`'s ranks measured, side by side.

    deviation (mean over ranks and seeds), stats_gap (the largest relative difference of the
    running statistics between rank 0 and any other rank), acc_gap (the largest difference of
    validation accuracy between rank 0 and any other rank, same weights), val_acc and its spread
    over seeds (rank 0's copy), train_loss (mean over seeds, rank 0).
    """
    out: dict[str, dict[str, float]] = {}
    for mode in ("plain", "sync"):
        keys = [k for k in per_rank[0] if k[0] == mode]
        accs = [per_rank[0][k]["val_acc"] for k in keys]
        out[mode] = {
            "deviation": statistics.fmean(r[k]["deviation"] for r in per_rank for k in keys),
            "stats_gap": max(_relative_gap(per_rank[0][k]["buffers"], r[k]["buffers"]) for r in per_rank[1:] for k in keys),
            "acc_gap": max(abs(per_rank[0][k]["val_acc"] - r[k]["val_acc"]) for r in per_rank[1:] for k in keys),
            "val_acc": statistics.fmean(accs),
            "val_acc_spread": max(accs) - min(accs),
            "train_loss": statistics.fmean(per_rank[0][k]["train_loss"] for k in keys),
        }
    return out


def deviation_ratios(per_rank: list[dict[tuple[str, int], dict[str, Any]]]) -> list[float]:
    """Per seed: how much further from the data's mean plain BatchNorm normalised than synchronised
    (each mode's deviation averaged over the ranks). Their spread says whether one seed's gap is luck."""
    seeds = sorted(seed for mode, seed in per_rank[0] if mode == "plain")
    return [statistics.fmean(r["plain", s]["deviation"] for r in per_rank)
            / statistics.fmean(r["sync", s]["deviation"] for r in per_rank) for s in seeds]
