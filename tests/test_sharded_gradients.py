"""multigpu.labs.lab5.sharded_gradients: ZeRO stage 2's layout (its training on real workers: test_zero.py)."""

from __future__ import annotations

import torch

from multigpu.labs.lab5 import sharded_gradients, zero


def test_rows_of_gives_the_rows_horovods_reduce_scatter_gives():
    # measured with hvd.grouped_reducescatter on 4 Gloo workers: 10 rows split 3, 3, 2, 2; 2 rows 1, 1, 0, 0
    for rows, workers in ((10, 4), (2, 4), (256, 4), (7, 3), (5, 1)):
        want = [(int(c[0]), int(c[-1]) + 1) if len(c) else None for c in torch.tensor_split(torch.arange(rows), workers)]
        for rank in range(workers):
            a, b = sharded_gradients.rows_of(rows, rank, workers)
            assert (a, b) == want[rank] or (want[rank] is None and a == b), (rows, workers, rank)
    assert [sharded_gradients.rows_of(10, r, 4) for r in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]


def flat_index(model, rank, workers):
    """Where each rank's rows of every parameter sit in the flattened model (Stage2Adam's layout)."""
    out, offset = [], 0
    for p in model.parameters():
        a, b = sharded_gradients.rows_of(p.shape[0], rank, workers)
        cols = p.numel() // p.shape[0]
        out.append(torch.arange(offset + a * cols, offset + b * cols))
        offset += p.numel()
    return torch.cat(out)


def test_the_stage_2_rows_of_the_ranks_cover_every_parameter_once():
    model = zero.build(zero.Model(inputs=32, width=48, depth=2, classes=10, batch=16))
    numel = sum(p.numel() for p in model.parameters())
    for workers in (1, 3, 4):
        every = torch.cat([flat_index(model, r, workers) for r in range(workers)])
        assert torch.equal(every.sort().values, torch.arange(numel))


