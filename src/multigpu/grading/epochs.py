"""Checks of the order in which each rank trained on its samples, epoch after epoch.

A ``DistributedSampler`` shuffles with ``seed + epoch``; its epoch is 0 until the script calls
``sampler.set_epoch(epoch)``. Without that call every epoch repeats the first one: the same
permutation, so every rank trains on the same shard, in the same order, every epoch. The checks
here read the indices each rank recorded per epoch (the ``indices`` of its checkpoints, in the
order it trained on them). Those lists are the submission's own claim, so a check may only fail a
run that would otherwise pass, never pass one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

#: Fewest indices a rank must list in an epoch for its order to count as evidence. A shard of k
#: samples repeats a random order by chance with probability 1/k! per rank: 1/40320 for 8, and a
#: repeat must hold on every rank at once.
MIN_INDICES = 8


def same_order_every_epoch(indices_by_rank_epoch: Mapping[tuple[int, int], Sequence[int]]) -> str | None:
    """A message when every rank listed the same indices in the same order in two consecutive
    epochs (a sampler never told its epoch), else None.

    ``indices_by_rank_epoch`` maps ``(rank, epoch)`` to the indices that rank trained on in that
    epoch, in the order it trained on them. Only the epochs every rank recorded are compared, and
    only ranks that listed at least :data:`MIN_INDICES` indices; None when fewer than two such
    epochs exist (nothing to compare)."""
    ranks = sorted({r for r, _ in indices_by_rank_epoch})
    epochs = sorted({e for _, e in indices_by_rank_epoch})
    epochs = [e for e in epochs if all((r, e) in indices_by_rank_epoch for r in ranks)]
    for before, after in zip(epochs, epochs[1:]):
        compared = [r for r in ranks
                    if min(len(indices_by_rank_epoch[(r, before)]), len(indices_by_rank_epoch[(r, after)])) >= MIN_INDICES]
        if compared and all(list(indices_by_rank_epoch[(r, before)]) == list(indices_by_rank_epoch[(r, after)])
                            for r in compared):
            n = len(indices_by_rank_epoch[(compared[0], before)])
            return (f"epochs {before} and {after}: every rank trained on the same samples in the same order (rank "
                    f"{compared[0]}: the same {n} indices, one by one): a DistributedSampler reshuffles only when it "
                    "is told the epoch, so call sampler.set_epoch(epoch) at the start of every epoch, before the "
                    "loop over the loader (Lab 3, Exercise 3)")
    return None
