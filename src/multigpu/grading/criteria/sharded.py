"""``sharded``: in every epoch the ranks trained on disjoint shards that together cover the
training set, each index listed once, and the grader saw the file of every sample they claimed
opened (:mod:`multigpu.grading.reads`, watched from outside the sandbox); counted only when
Horovod averaged the gradients: shards make one model only then."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from multigpu.core import data
from multigpu.grading import epochs
from multigpu.grading.evidence import CHECKPOINTS, Checkpoint, Evidence
from multigpu.grading.result import Criterion
from multigpu.grading.rules import Settings

NAME = "sharded"
POINTS = 2
REQUIRES: tuple[str, ...] = (CHECKPOINTS,)
AFTER: tuple[str, ...] = ()

NOT_COUNTED = ("not counted: shards make one model only when the ranks average their gradients, "
               "and the grader did not see that (see 'identical')")
SAME_SHARD = (" Note: every rank trained on the same shard in every epoch: call sampler.set_epoch(epoch) at the "
              "start of each epoch so that the shards are reshuffled")


def judge(evidence: Evidence, settings: Settings) -> Criterion:
    """Each epoch's shards (:func:`epoch_problem`), then how they change between epochs: the same
    order two epochs running fails (:func:`multigpu.grading.epochs.same_order_every_epoch`), the
    same shard in a new order is a note (:func:`between_epochs`)."""
    if evidence.unaveraged:
        return Criterion(NAME, POINTS, False, NOT_COUNTED)
    n, complete, loaded = settings.workers, evidence.complete, evidence.loaded
    train_size = len(data.JPEGFolder(evidence.train_root, None, split="train"))
    problem = ""
    for e in complete:
        problem = epoch_problem(e, [loaded[(r, e)]["indices"] for r in range(n)], train_size)
        if problem:
            break
    problem = problem or never_read(evidence)
    order = "" if problem else epochs.same_order_every_epoch(
        {(r, e): loaded[(r, e)]["indices"] for r in range(n) for e in complete}) or ""
    hint = "" if order else between_epochs(loaded, complete, n)
    problem = problem or order
    return Criterion(NAME, POINTS, not problem, (problem or f"disjoint shards covering all {train_size} training "
                                                 f"samples in each of {len(complete)} epochs") + hint)


def never_read(evidence: Evidence) -> str:
    """The first epoch whose claimed samples include files no process had opened by its end ("" when
    none does, or the reads were not watched)."""
    found = evidence.observed.never_read() if evidence.observed else []
    if not found:
        return ""
    r = found[0]
    return (f"epoch {r.epoch}: the ranks claimed {r.claimed} samples, and {r.never} of them were never read: the "
            f"grader watched the training set from outside the sandbox and saw {r.read} distinct training files "
            f"opened during the epoch (and none of those {r.never} before its end). List exactly the samples each "
            "rank trained on (trained_on.extend(index.tolist()) per batch) and train on its whole shard"
            + (f"; {len(found) - 1} later epoch(s) too" if len(found) > 1 else ""))


def epoch_problem(epoch: int, indices: Sequence[Sequence[int]], train_size: int) -> str:
    """What is wrong with the shards of one epoch, ``indices[r]`` the indices rank ``r`` listed
    ("" when nothing is). DistributedSampler repeats up to ``workers - 1`` samples to even out
    the shards: that many shared samples are allowed."""
    n = len(indices)
    padding = (-train_size) % n
    sets = [set(i) for i in indices]
    union = set().union(*sets)
    shared = sum(len(s) for s in sets) - len(union)
    repeated = [(r, len(indices[r]) - len(sets[r])) for r in range(n)]
    repeated = [(r, k) for r, k in repeated if k]
    if repeated:
        r, k = repeated[0]
        return (f"epoch {epoch}: rank {r} listed {k} index(es) more than once: an index is one sample trained "
                "on once in the epoch, so list the indices of the batches this rank trained on, each "
                "once (trained_on.extend(index.tolist()) per batch)"
                + (f"; {len(repeated) - 1} other rank(s) did the same" if len(repeated) > 1 else ""))
    if any(i < 0 or i >= train_size for i in union):
        return f"epoch {epoch}: indices outside the training set (0..{train_size - 1})"
    if shared > padding:
        return (f"epoch {epoch}: {shared} samples were trained on by more than one rank: give each rank its "
                "own shard with DistributedSampler(num_replicas=hvd.size(), rank=hvd.rank()) and call "
                "sampler.set_epoch(epoch)")
    if len(union) < train_size:
        return (f"epoch {epoch}: the ranks together trained on {len(union)} of {train_size} samples: "
                "every epoch must cover the training set")
    return ""


def between_epochs(loaded: Mapping[tuple[int, int], Checkpoint], complete: Sequence[int], n: int) -> str:
    """A note when every rank trained on the same shard in every epoch ("" otherwise)."""
    same_every_epoch = len(complete) >= 2 and all(
        set(loaded[(r, complete[0])]["indices"]) == set(loaded[(r, e)]["indices"]) for r in range(n) for e in complete)
    return SAME_SHARD if same_every_epoch else ""
