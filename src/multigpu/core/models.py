"""AlexNet for GPUs and a scaled-down AlexNet of the same shape for the CPU default.

Both have 5 convolutions (with overlapping 3x3/stride-2 max-pools after conv1, conv2 and conv5),
ReLU, and 3 fully-connected layers with dropout. In both, almost all parameters sit in the
fully-connected layers while almost all arithmetic sits in the convolutions: the gradient that
data parallelism must all-reduce is large compared with the compute that produced it. That is
what makes AlexNet the textbook communication-bound network.

Image sizes live here, in one place: ``CPU_IMAGE_SIZE`` (the generated data set and
:class:`AlexNetSmall`) and ``GPU_IMAGE_SIZE`` (:class:`AlexNet`).
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

#: Side of the images the CPU default trains on (the generated data set is made at this size).
CPU_IMAGE_SIZE = 64
#: Side of the images the 2012 AlexNet takes.
GPU_IMAGE_SIZE = 224

#: Exact parameter count of the 2012 network, ``AlexNet(num_classes=1000, batch_norm=False)``.
ALEXNET_PARAMETERS_1000 = 61_100_840
#: Parameters the batch normalisation adds to AlexNet (a scale and a shift per conv channel).
ALEXNET_BN_PARAMETERS = 2_304
#: Exact parameter count of ``AlexNetSmall(num_classes=10)`` (default widths, batch norm).
ALEXNET_SMALL_PARAMETERS_10 = 5_646_730


def _conv_relu(conv: nn.Conv2d, batch_norm: bool) -> list[nn.Module]:
    """``conv -> [BatchNorm] -> ReLU``."""
    return [conv, nn.BatchNorm2d(conv.out_channels), nn.ReLU(inplace=True)] if batch_norm else [conv, nn.ReLU(inplace=True)]


def _init(module: nn.Module) -> None:
    """He initialisation for the convolutions, zero biases; linear layers keep PyTorch's default.

    PyTorch's default for a linear layer is uniform in +-1/sqrt(fan_in). He initialisation
    there (sqrt(2/fan_in), about 2.4x larger) compounds over the three fully-connected layers
    into initial logits so large that SGD stalled at chance for hundreds of steps (measured).
    """
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            nn.init.zeros_(cast(torch.Tensor, m.bias))


class AlexNet(nn.Module):
    """The 2012 AlexNet (Krizhevsky et al.), single-tower form, for 224x224 inputs.

    Layers: conv 11x11/4 (64) -> pool -> conv 5x5 (192) -> pool -> conv 3x3 (384) ->
    conv 3x3 (256) -> conv 3x3 (256) -> pool -> [adaptive pool to 6x6] -> dropout ->
    FC 9216->4096 -> dropout -> FC 4096->4096 -> FC 4096->classes.

    ``batch_norm=True`` (the default) puts a BatchNorm after each convolution, as most modern
    re-trainings of AlexNet do (the 2012 network used local response normalisation); it lets
    the network leave chance within the first hundred steps at a usable learning rate.
    ``batch_norm=False`` is the 2012 network exactly.

    Parameters: exactly 61,100,840 with 1000 classes and ``batch_norm=False`` (2,469,696 in
    the convolutions, 58,631,144 = 96% in the fully-connected layers); batch norm adds 2,304;
    57,044,810 with 10 classes and no batch norm.
    Forward cost at 224x224: about 0.71 G multiply-adds per image (``flops_per_image``).
    """

    def __init__(self, num_classes: int = 1000, dropout: float = 0.5, batch_norm: bool = True) -> None:
        super().__init__()
        bn = batch_norm
        self.features = nn.Sequential(
            *_conv_relu(nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2), bn),
            nn.MaxPool2d(kernel_size=3, stride=2),
            *_conv_relu(nn.Conv2d(64, 192, kernel_size=5, padding=2), bn),
            nn.MaxPool2d(kernel_size=3, stride=2),
            *_conv_relu(nn.Conv2d(192, 384, kernel_size=3, padding=1), bn),
            *_conv_relu(nn.Conv2d(384, 256, kernel_size=3, padding=1), bn),
            *_conv_relu(nn.Conv2d(256, 256, kernel_size=3, padding=1), bn),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout),
            nn.Linear(256 * 6 * 6, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Linear(4096, num_classes),
        )
        _init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = self.avgpool(x)
        return self.classifier(torch.flatten(x, 1))


class AlexNetSmall(nn.Module):
    """AlexNet scaled down for 64x64 inputs on a CPU: same shape, fewer channels.

    Layers: conv 5x5/2 (32) -> pool -> conv 5x5 (64) -> pool -> conv 3x3 (96) -> conv 3x3 (96)
    -> conv 3x3 (64) -> pool (3x3 maps) -> dropout -> FC 576->2048 -> dropout -> FC 2048->2048
    -> FC 2048->classes. Pools are AlexNet's overlapping 3x3, stride 2. A BatchNorm follows each
    convolution unless ``batch_norm=False``: without it, this network trained from scratch sat
    at chance for ~1,000 SGD steps on the course's images; with it, the reference recipe
    reaches >= 90% in 3 epochs (see ``training.TrainConfig``).

    Parameters: exactly 5,646,730 with 10 classes: 247,488 (4%) in the convolutions, 704 in
    the batch norms and 5,398,538 (96%) in the fully-connected layers, the same split as
    AlexNet's. Forward cost
    at 64x64: about 28.9 M multiply-adds per image, 81% of it in the convolutions. Works for
    any input of at least 32x32 (an adaptive pool fixes the classifier's input at 3x3).
    """

    def __init__(
        self, num_classes: int = 10, width: int = 32, fc_width: int = 2048, dropout: float = 0.5, batch_norm: bool = True
    ) -> None:
        super().__init__()
        w, bn = width, batch_norm
        self.features = nn.Sequential(
            *_conv_relu(nn.Conv2d(3, w, kernel_size=5, stride=2, padding=2), bn),
            nn.MaxPool2d(kernel_size=3, stride=2),
            *_conv_relu(nn.Conv2d(w, 2 * w, kernel_size=5, padding=2), bn),
            nn.MaxPool2d(kernel_size=3, stride=2),
            *_conv_relu(nn.Conv2d(2 * w, 3 * w, kernel_size=3, padding=1), bn),
            *_conv_relu(nn.Conv2d(3 * w, 3 * w, kernel_size=3, padding=1), bn),
            *_conv_relu(nn.Conv2d(3 * w, 2 * w, kernel_size=3, padding=1), bn),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((3, 3))
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout),
            nn.Linear(2 * w * 3 * 3, fc_width),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(fc_width, fc_width),
            nn.ReLU(inplace=True),
            nn.Linear(fc_width, num_classes),
        )
        _init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = self.avgpool(x)
        return self.classifier(torch.flatten(x, 1))


MODELS = {"alexnet": AlexNet, "alexnet_small": AlexNetSmall}

#: Input side each model is meant for.
IMAGE_SIZES = {"alexnet": GPU_IMAGE_SIZE, "alexnet_small": CPU_IMAGE_SIZE}


def build_model(name: str = "alexnet_small", num_classes: int = 10, **kwargs) -> nn.Module:
    """A fresh model by name: ``"alexnet_small"`` (CPU default) or ``"alexnet"`` (GPU)."""
    try:
        cls = MODELS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}") from None
    return cls(num_classes=num_classes, **kwargs)


def default_image_size(name: str = "alexnet_small") -> int:
    """The input side a model is meant for (64 for ``alexnet_small``, 224 for ``alexnet``)."""
    return IMAGE_SIZES[name.lower()]


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Parameters of ``model``: ``total``, ``conv`` (convolutions), ``fc`` (linear layers), ``other``.

    Works on DDP- or otherwise wrapped models (it walks all submodules) and counts shared
    parameters once.
    """
    seen: set[int] = set()
    counts = {"total": 0, "conv": 0, "fc": 0, "other": 0}
    for module in model.modules():
        kind = "conv" if isinstance(module, nn.modules.conv._ConvNd) else "fc" if isinstance(module, nn.Linear) else "other"
        for p in module.parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            counts[kind] += p.numel()
            counts["total"] += p.numel()
    return counts


def gradient_bytes(model: nn.Module) -> int:
    """Bytes of one full gradient (what data parallelism all-reduces every step)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def flops_per_image(model: nn.Module, image_size: int | tuple[int, int] = CPU_IMAGE_SIZE) -> dict[str, int]:
    """Forward multiply-adds for one image, counted from the conv and linear layers.

    Runs one forward pass on a dummy image with hooks and returns ``{"total", "conv", "fc"}``
    (multiply-adds; FLOPs are about twice that, a training step about three times the forward).
    Pools, ReLUs and biases are ignored (they are a small fraction).
    """
    h, w = (image_size, image_size) if isinstance(image_size, int) else image_size
    counts = {"conv": 0, "fc": 0}

    def conv_hook(m: nn.Conv2d, inp, out) -> None:
        k = m.kernel_size[0] * m.kernel_size[1] * (m.in_channels // m.groups)
        counts["conv"] += out[0].numel() * k

    def fc_hook(m: nn.Linear, inp, out) -> None:
        counts["fc"] += m.in_features * m.out_features

    handles = []
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            handles.append(m.register_forward_hook(conv_hook))
        elif isinstance(m, nn.Linear):
            handles.append(m.register_forward_hook(fc_hook))
    was_training = model.training
    try:
        model.eval()
        p = next(model.parameters())
        with torch.no_grad():
            model(torch.zeros(1, 3, h, w, device=p.device, dtype=p.dtype))
    finally:
        for hd in handles:
            hd.remove()
        model.train(was_training)
    return {"total": counts["conv"] + counts["fc"], **counts}
