"""multigpu.labs.lab5.checkpointing: the bytes held follow k + n/k, and the gradients do not change."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from multigpu.labs.lab5 import checkpointing as ck


def test_segments_cover_the_chain_in_order():
    layers = ck.chain(10, 4)
    segs = ck.segments_of(layers, 3)
    assert [len(s) for s in segs] == [3, 3, 4]
    assert [m for s in segs for m in s] == layers


def test_checkpointing_gives_the_same_gradients():
    layers = ck.chain(6, 8)
    x = torch.randn(5, 8)
    grads = []
    for k in (0, 2, 3):
        for m in layers:
            m.zero_grad()
        ck.run_checkpointed(layers, x, k).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for m in layers for p in m.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6) and torch.allclose(grads[0], grads[2], atol=1e-6)


def test_held_and_peak_bytes_follow_the_sqrt_rule():
    n, width, batch = 16, 32, 8
    got = ck.measure(ck.chain(n, width), lambda: torch.randn(batch, width), (0, 1, 2, 4, 8, 16), repeats=1)
    unit = batch * width * 4  # one layer's activation
    assert got[0]["held_after_forward"] == (n + 1) * unit  # every layer's input, and the last output
    for k in (1, 2, 4, 8, 16):
        assert got[k]["held_after_forward"] == k * unit  # the segments' inputs only
    assert min((1, 2, 4, 8, 16), key=lambda k: got[k]["peak"]) == ck.sqrt_rule(n) == 4
    assert got[4]["peak"] < 0.6 * got[0]["peak"]


def test_the_course_model_holds_less_with_checkpointing():
    got = ck.course_model(batch=4, segments=(0, 4), repeats=1)
    assert got[4]["held_after_forward"] < 0.3 * got[0]["held_after_forward"]
    assert got[4]["peak"] < got[0]["peak"]
    assert isinstance(ck.course_model_modules(__import__("multigpu.core.models", fromlist=["m"]).build_model())[-1],
                      nn.Sequential)


@pytest.mark.parametrize("n, k", [(16, 4), (10, 3), (100, 10), (2, 1)])
def test_sqrt_rule(n, k):
    assert ck.sqrt_rule(n) == k
