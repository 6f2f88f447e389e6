"""Tests of AlexNet, AlexNetSmall and the parameter/FLOP counters."""

from __future__ import annotations

import pytest
import torch

from multigpu.core import models


def test_alexnet_parameter_count():
    m = models.AlexNet(num_classes=1000, batch_norm=False)  # the 2012 network
    c = models.count_parameters(m)
    assert c["total"] == models.ALEXNET_PARAMETERS_1000 == 61_100_840
    assert c["conv"] == 2_469_696 and c["fc"] == 58_631_144 and c["other"] == 0
    assert c["fc"] / c["total"] > 0.95, "AlexNet's parameters are mostly fully connected"
    assert models.count_parameters(models.build_model("alexnet", 10, batch_norm=False))["total"] == 57_044_810
    bn = models.count_parameters(models.AlexNet(num_classes=1000))  # the default: batch norm after each conv
    assert bn["other"] == models.ALEXNET_BN_PARAMETERS == 2 * (64 + 192 + 384 + 256 + 256)
    assert bn["total"] == c["total"] + models.ALEXNET_BN_PARAMETERS


def test_batch_norm_follows_every_conv_and_linear_layers_keep_default_init():
    for m in (models.AlexNetSmall(), models.AlexNet(num_classes=10)):
        layers = list(m.features)
        convs = [i for i, layer in enumerate(layers) if isinstance(layer, torch.nn.Conv2d)]
        assert all(isinstance(layers[i + 1], torch.nn.BatchNorm2d) for i in convs)
        assert not any(isinstance(layer, torch.nn.BatchNorm2d) for layer in type(m)(batch_norm=False).modules())
    torch.manual_seed(0)
    fc = models.AlexNetSmall().classifier[1]
    bound = 1 / fc.in_features ** 0.5  # PyTorch's default: uniform in +-1/sqrt(fan_in)
    assert fc.weight.abs().max() <= bound and fc.weight.abs().max() > 0.9 * bound


def test_alexnet_forward_224():
    m = models.build_model("alexnet", num_classes=7).eval()
    with torch.no_grad():
        assert m(torch.zeros(2, 3, 224, 224)).shape == (2, 7)


def test_alexnet_small_shape_and_counts():
    m = models.build_model()  # alexnet_small, 10 classes
    assert isinstance(m, models.AlexNetSmall)
    convs = [layer for layer in m.modules() if isinstance(layer, torch.nn.Conv2d)]
    fcs = [layer for layer in m.modules() if isinstance(layer, torch.nn.Linear)]
    pools = [layer for layer in m.modules() if isinstance(layer, torch.nn.MaxPool2d)]
    drops = [layer for layer in m.modules() if isinstance(layer, torch.nn.Dropout)]
    assert (len(convs), len(fcs), len(pools), len(drops)) == (5, 3, 3, 2), "same shape as AlexNet"
    c = models.count_parameters(m)
    assert c["total"] == models.ALEXNET_SMALL_PARAMETERS_10 == sum(p.numel() for p in m.parameters())
    assert c["fc"] / c["total"] > 0.9, "like AlexNet, mostly fully-connected parameters"


@pytest.mark.parametrize("size", [32, models.CPU_IMAGE_SIZE, 96])
def test_alexnet_small_forward_shapes(size):
    m = models.AlexNetSmall(num_classes=4).eval()
    with torch.no_grad():
        out = m(torch.randn(3, 3, size, size))
    assert out.shape == (3, 4) and torch.isfinite(out).all()


def test_build_model_rejects_unknown_name():
    with pytest.raises(ValueError):
        models.build_model("resnet50")
    assert models.default_image_size("alexnet") == models.GPU_IMAGE_SIZE == 224


def test_flops_counted_from_layers():
    m = models.AlexNet(num_classes=1000)
    f = models.flops_per_image(m, 224)
    # conv1 alone: 55x55 outputs x 64 channels x (11*11*3) multiply-adds.
    assert f["conv"] > 55 * 55 * 64 * 363
    assert f["fc"] == 9216 * 4096 + 4096 * 4096 + 4096 * 1000
    assert 0.6e9 < f["total"] < 0.8e9 and f["total"] == f["conv"] + f["fc"]
    assert m.training, "flops_per_image must restore the training mode"
    small = models.flops_per_image(models.AlexNetSmall(), models.CPU_IMAGE_SIZE)
    assert small["conv"] > small["fc"], "compute is in the convolutions"
    assert small["total"] < f["total"] / 10


def test_count_parameters_on_wrapped_model_and_gradient_bytes():
    m = models.AlexNetSmall()
    wrapped = torch.nn.Sequential(m)
    assert models.count_parameters(wrapped) == models.count_parameters(m)
    assert models.gradient_bytes(m) == 4 * models.count_parameters(m)["total"]
