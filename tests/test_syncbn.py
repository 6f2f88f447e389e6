"""multigpu.labs.lab3.syncbn: the conversion keeps every layer's state, the CPU path is a BatchNorm over the global batch."""

from __future__ import annotations

import copy

import horovod.torch as hvd
import pytest
import torch
from torch import nn

from multigpu.core import data
from multigpu.labs.lab3 import syncbn
from multigpu.running import launch


def trained_net() -> nn.Module:
    """bn_net with weights and running statistics that are not the defaults, in training mode."""
    torch.manual_seed(3)
    net = syncbn.bn_net()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
                m.num_batches_tracked.fill_(7)
    return net


def test_convert_replaces_every_batch_norm_at_any_depth_and_keeps_its_state():
    net = trained_net()
    before = copy.deepcopy(net.state_dict())
    converted = syncbn.convert(net)
    kinds = [type(m) for m in converted.modules()]
    assert not any(isinstance(m, syncbn.PLAIN_BATCH_NORMS) for m in converted.modules())
    assert kinds.count(syncbn.SyncBatchNorm) == 2  # one at the top level, one nested
    after = converted.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert all(m.training for m in converted.modules())


def test_convert_keeps_eps_momentum_mode_and_frozen_parameters():
    net = nn.Sequential(nn.BatchNorm2d(4, eps=1e-3, momentum=0.01), nn.Sequential(nn.BatchNorm1d(4)), nn.BatchNorm3d(4))
    net[1][0].eval()
    for p in net[2].parameters():
        p.requires_grad_(False)
    old = [m for m in net.modules() if isinstance(m, syncbn.PLAIN_BATCH_NORMS)]
    new = [m for m in syncbn.convert(copy.deepcopy(net)).modules() if isinstance(m, syncbn.SyncBatchNorm)]
    assert [(m.eps, m.momentum, m.training) for m in new] == [(m.eps, m.momentum, m.training) for m in old]
    assert [[p.requires_grad for p in m.parameters()] for m in new] == [[True, True], [True, True], [False, False]]


def test_sync_batch_norm_is_a_plain_batch_norm_on_one_worker():
    """Outside a Horovod job (or with one worker) it normalises like nn.BatchNorm2d, running statistics included."""
    torch.manual_seed(0)
    x = torch.randn(4, 3, 5, 5) * 2 + 1
    plain, sync = nn.BatchNorm2d(3), syncbn.SyncBatchNorm(3)
    for _ in range(2):
        assert torch.allclose(plain(x), sync(x), atol=1e-6)
    assert torch.allclose(plain.running_mean, sync.running_mean) and torch.allclose(plain.running_var, sync.running_var)
    plain.eval()
    sync.eval()
    assert torch.allclose(plain(x), sync(x), atol=1e-6)


def global_batch() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(6, 3, 4, 4) * torch.tensor([1.0, 3.0, 0.5]).view(1, 3, 1, 1) + torch.arange(6.0).view(6, 1, 1, 1)


def slice_through_sync_batch_norm() -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """On each of 2 workers: its half of the global batch through SyncBatchNorm; output, input gradient, running stats."""
    hvd.init()
    torch.set_num_threads(1)
    x = global_batch()[hvd.rank() * 3:(hvd.rank() + 1) * 3].clone().requires_grad_(True)
    bn = syncbn.SyncBatchNorm(3)
    out = bn(x)
    (out * torch.arange(out.numel()).view_as(out)).sum().backward()  # a loss that weighs every element differently
    return out.detach(), x.grad, [bn.running_mean, bn.running_var]


@pytest.mark.slow
def test_on_two_workers_it_is_one_batch_norm_over_the_global_batch():
    ranks = launch.run_horovod(slice_through_sync_batch_norm, 2, timeout=120, echo=False)
    x = global_batch().requires_grad_(True)
    bn = nn.BatchNorm2d(3)
    out = bn(x)
    weights = torch.cat([torch.arange(out.numel() // 2).view(3, 3, 4, 4)] * 2)  # the same per-rank weighting
    (out * weights).sum().backward()
    assert torch.allclose(torch.cat([r[0] for r in ranks]), out.detach(), atol=1e-5)
    assert torch.allclose(torch.cat([r[1] for r in ranks]), x.grad, atol=1e-4)
    for r in ranks:
        assert torch.allclose(r[2][0], bn.running_mean, atol=1e-6) and torch.allclose(r[2][1], bn.running_var, atol=1e-5)


@pytest.mark.slow
def test_experiment_plain_ranks_disagree_synchronised_ranks_agree():
    root = data.ensure_dataset(train_per_class=40, val_per_class=10)
    ranks = launch.run_horovod(syncbn.experiment, 2, args=(str(root), 2, 4, (0,)), timeout=200, echo=False)
    figures = syncbn.summarise(ranks)
    assert figures["sync"]["stats_gap"] < 1e-5, "synchronised BatchNorm: every rank keeps the same running statistics"
    assert figures["plain"]["stats_gap"] > 1e-3, "plain BatchNorm: each rank's running statistics are its own"
    assert figures["sync"]["acc_gap"] == 0.0
    assert 0 < figures["sync"]["deviation"] and 0 < figures["plain"]["deviation"]
