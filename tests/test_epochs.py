"""grading/epochs.py: the order each rank trained in, epoch after epoch, read from its indices."""

from __future__ import annotations

import random

from torch.utils.data import DistributedSampler

from multigpu.grading import epochs


def _sampled(size: int, ranks: int, n_epochs: int, set_epoch: bool) -> dict[tuple[int, int], list[int]]:
    """The indices a DistributedSampler gives each rank in each epoch (1-based), as a script records them."""
    out = {}
    for rank in range(ranks):
        sampler = DistributedSampler(range(size), num_replicas=ranks, rank=rank, shuffle=True)
        for epoch in range(1, n_epochs + 1):
            if set_epoch:
                sampler.set_epoch(epoch)
            out[(rank, epoch)] = list(sampler)
    return out


def test_a_sampler_never_told_its_epoch_is_named_with_what_to_call():
    message = epochs.same_order_every_epoch(_sampled(300, 4, 3, set_epoch=False))
    assert message is not None
    assert "epochs 1 and 2" in message and "sampler.set_epoch(epoch)" in message and "same order" in message, message


def test_a_sampler_reshuffled_every_epoch_passes():
    assert epochs.same_order_every_epoch(_sampled(300, 4, 5, set_epoch=True)) is None
    assert epochs.same_order_every_epoch(_sampled(301, 3, 2, set_epoch=True)) is None  # padded shards


def test_a_repeat_between_any_two_consecutive_epochs_is_named():
    record = _sampled(200, 2, 3, set_epoch=True)
    for rank in range(2):  # epoch 3 repeats epoch 2 (set_epoch called with a stale number)
        record[(rank, 3)] = list(record[(rank, 2)])
    message = epochs.same_order_every_epoch(record)
    assert message is not None and "epochs 2 and 3" in message, message


def test_the_same_shard_in_a_new_order_or_one_rank_repeating_is_not_this_mistake():
    record = _sampled(200, 2, 2, set_epoch=False)
    shuffled = list(record[(0, 2)])
    random.Random(1).shuffle(shuffled)
    assert epochs.same_order_every_epoch({**record, (0, 2): shuffled}) is None
    changed = _sampled(200, 2, 2, set_epoch=True)
    assert epochs.same_order_every_epoch({**changed, (0, 2): list(changed[(0, 1)])}) is None


def test_too_little_to_compare_gives_no_verdict():
    assert epochs.same_order_every_epoch({}) is None
    assert epochs.same_order_every_epoch(_sampled(300, 4, 1, set_epoch=False)) is None  # one epoch
    tiny = {(r, e): [r, r + 2] for r in range(2) for e in (1, 2)}  # 2 indices: repeats by chance
    assert epochs.same_order_every_epoch(tiny) is None
    assert len(tiny[(0, 1)]) < epochs.MIN_INDICES
    # an epoch some rank did not record is not compared: here only epoch 1 is complete
    partial = _sampled(100, 2, 2, set_epoch=False)
    del partial[(1, 2)]
    assert epochs.same_order_every_epoch(partial) is None
