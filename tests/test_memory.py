"""multigpu.labs.lab5.memory: ZeRO's table, and bytes counted from the tensors of a real step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from multigpu.labs.lab5 import memory


def test_zero_table_is_the_papers_for_mixed_precision_adam():
    n = 64
    assert memory.zero_bytes_per_parameter(0, n) == 16
    assert memory.zero_bytes_per_parameter(1, n) == 4 + 12 / n
    assert memory.zero_bytes_per_parameter(2, n) == 2 + 14 / n
    assert memory.zero_bytes_per_parameter(3, n) == 16 / n
    # ZeRO, Figure 1: 7.5B parameters on 64 devices: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB
    got = [memory.zero_bytes(7.5e9, s, 64) / 1e9 for s in range(4)]
    assert [round(g, 1) for g in got] == [120.0, 31.4, 16.6, 1.9]
    with pytest.raises(ValueError):
        memory.zero_bytes_per_parameter(4, 8)


def test_every_optimizer_has_its_own_bytes():
    assert memory.zero_bytes_per_parameter(0, 4, "sgd momentum") == 12
    assert memory.zero_bytes_per_parameter(1, 4, "adam") == 4 + 4 + 8 / 4
    assert memory.zero_bytes_per_parameter(3, 2, "sgd momentum") == 6


def test_storage_bytes_counts_views_once():
    t = torch.zeros(100)
    assert memory.storage_bytes([t, t[:10], t.view(10, 10)]) == 400
    assert memory.storage_bytes([t, torch.zeros(5, dtype=torch.float64)]) == 440


def test_saved_tensors_sees_a_linear_chain_keep_each_input():
    torch.manual_seed(0)
    net = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(8, 8), nn.ReLU())])
    x = torch.randn(5, 8, requires_grad=True)
    saved = memory.SavedTensors(exclude=list(net.parameters()))
    with saved.hooks():
        y = net(x)
        saved.after_forward()
        y.sum().backward()
    # 4 Linear inputs (x and 3 ReLU outputs) and the last ReLU's output, 5 x 8 floats each
    assert saved.held_after_forward == 5 * 5 * 8 * 4
    assert saved.peak == saved.held_after_forward
    assert saved.now == 0  # autograd let everything go after the backward pass
    assert x.grad is not None and all(p.grad is not None for p in net.parameters())


@pytest.mark.parametrize("optimizer", sorted(memory.OPTIMIZER_BYTES))
def test_measured_bytes_per_parameter_are_the_tables(optimizer):
    build = lambda: nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))  # noqa: E731
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    got = memory.measure_state(build, optimizer, x, y)
    w, g, k = memory.OPTIMIZER_BYTES[optimizer]
    p = got["parameters"]
    assert p == 32 * 64 + 64 + 64 * 10 + 10
    assert got["weights"] == w * p and got["gradients"] == g * p
    # the optimizer's state: its tensors per parameter plus Adam's step counters (a few bytes)
    assert k * p <= got["optimizer state"] <= k * p + 64
    assert got["activations"] > 0


def test_mixed_precision_adam_keeps_the_model_in_bfloat16_and_updates_it():
    model = nn.Linear(4, 2)
    opt = memory.make_optimizer("mixed adam", model)
    before = model.weight.detach().clone()
    assert model.weight.dtype == torch.bfloat16
    model(torch.ones(3, 4, dtype=torch.bfloat16)).sum().backward()
    opt.step()
    assert not torch.equal(model.weight.detach(), before)
    assert all(m.dtype == torch.float32 for m in opt.masters)


@pytest.mark.gpu
def test_on_a_gpu_the_allocator_holds_what_the_tensors_count():
    """CUDA's allocator, which knows every byte it handed out, against the count from the tensors:
    after an Adam step of the course model, with the batch and the graph gone, the bytes allocated
    are the weights, gradients and optimizer state counted (plus at most 1 MB of small buffers)."""
    from multigpu.core import models

    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    model = models.build_model("alexnet_small").cuda()
    opt = memory.make_optimizer("adam", model)
    x, y = torch.randn(8, 3, 64, 64, device="cuda"), torch.randint(0, 10, (8,), device="cuda")
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    del x, y
    torch.cuda.synchronize()
    params = list(model.parameters())
    counted = (memory.storage_bytes(params) + memory.storage_bytes(p.grad for p in params)
               + memory.storage_bytes(memory.state_tensors(opt)))
    held = torch.cuda.memory_allocated() - before
    assert counted <= held <= counted + 2**20, (counted, held)
    assert counted == pytest.approx(16 * sum(p.numel() for p in params), rel=1e-4)
