"""Section ``sharding``: Lab 5's sharded optimizer against plain data parallelism on 4 workers."""

from __future__ import annotations

import statistics
from typing import Any

from multigpu.course.bench.report import Figure, Plan, Section, Target, fmt, paired, steps

SHARDING_WORKERS = 4
SHARDING_STEPS = 3


def per_step(row: dict[str, Any], key: str, combine: Any) -> list[float]:
    """One value per timed step of a way, over its ranks (``combine``: mean of the bytes, max of the times)."""
    per_rank = row["samples"][key]
    return [combine(values) for values in zip(*per_rank)]


def uncovered(row: dict[str, Any]) -> list[float]:
    """Per timed step, the slowest rank's step time less its own forward and backward passes."""
    steps_, compute = row["samples"]["step_s"], row["samples"]["compute_s"]
    return [max(t - c for t, c in zip(ts, cs)) for ts, cs in zip(zip(*steps_), zip(*compute))]


def bench_sharding(plan: Plan, deadline: float) -> Section:
    """ZeRO stages 1 and 2 (:mod:`multigpu.labs.lab5.zero`) and stage 3 by hand
    (:mod:`multigpu.labs.lab5.fully_sharded`) beside data parallelism, each in one Horovod job of
    4 workers over Gloo, the ways interleaved round by round; ratios of steps measured side by side;
    and the three collectives alone, timed against each other (where stage 2's step time goes)."""
    from multigpu.labs.lab5 import fully_sharded, zero

    section = Section("sharding", f"The sharded optimizer (Lab 5) against plain data parallelism, "
                                  f"{SHARDING_WORKERS} Horovod workers over Gloo")
    rounds, shape = plan.scaling_repeats, zero.Model()
    with steps("sharding", 3) as log:
        log.starting(f"data parallel, stage 1, stage 2: {rounds} round(s) of {SHARDING_STEPS} steps")
        z = zero.compare(shape, SHARDING_WORKERS, SHARDING_STEPS, rounds, timeout=600)
        log.finished(f"stage 2 sent {statistics.mean(z['stage 2']['sent']) / statistics.mean(z['data parallel']['sent']):.2f} x")
        log.starting(f"data parallel, stage 3: {rounds} round(s) of {SHARDING_STEPS} steps")
        s3 = fully_sharded.compare(shape, SHARDING_WORKERS, SHARDING_STEPS, rounds, timeout=600)
        log.finished(f"stage 3 sent {statistics.mean(s3['stage 3']['sent']) / statistics.mean(s3['data parallel']['sent']):.2f} x")
        log.starting("the collectives alone: all-reduce, reduce-scatter and all-gather of the gradient")
        ops = zero.collective_times(z["data parallel"]["parameters"], SHARDING_WORKERS, 3 * rounds, timeout=300)
        log.finished(f"reduce-scatter / all-reduce {statistics.median(paired(ops['reducescatter'], ops['allreduce'])):.2f} x")
    dp, one, two, dp3, three = z["data parallel"], z["stage 1"], z["stage 2"], s3["data parallel"], s3["stage 3"]
    ring = zero.ring_bytes(dp["gradient_bytes"], SHARDING_WORKERS)
    section.notes += [
        f"An MLP of {dp['parameters']:,} parameters ({fmt(dp['gradient_bytes'] / 1e6, 'ratio')} MB of gradient), Adam, "
        f"global batch {shape.batch}; {rounds} round(s) of every way in one job per comparison, {SHARDING_STEPS} timed "
        "steps each after one untimed; a ratio's samples are steps paired by round and step.",
        "Bytes: what each rank wrote to its sockets during the step (`/proc/self/io`, the kernel's count), mean over "
        f"ranks; a ring all-reduce of the gradient sends {fmt(ring / 1e6, 'ratio')} MB per rank. Stages 1-2 count "
        "the optimizer's step (after backward), stage 3 the whole step (it communicates in forward and backward). "
        "Times: whole training steps, the slowest rank's.",
        "Targets (ZeRO, sections 5 and 7): optimizer state per rank 1/N = 0.25 x; bytes per step 1.0 x for stage 2, "
        "1.5 x for stage 3 (each within 10%); step time at most 1.3 x on CPU workers.",
        f"Weights after training, largest difference from data parallelism: stage 1 {one['max_weight_diff']:.2g}, "
        f"stage 2 {two['max_weight_diff']:.2g}, stage 3 {three['max_weight_diff']:.2g}.",
    ]
    section.figures = sharding_figures(dp, one, two, dp3, three, ops)
    return section


def sharding_figures(dp: dict[str, Any], one: dict[str, Any], two: dict[str, Any], dp3: dict[str, Any],
                     three: dict[str, Any], ops: dict[str, list[float]]) -> list[Figure]:
    """The section's figures: each way's bytes, times and memory over data parallelism's, step by step."""
    return [
        Figure("optimizer state per rank, stage 2 / data parallel", "ratio",
               [max(two["state_bytes"]) / max(dp["state_bytes"])], Target("<=", 0.2501)),
        Figure("bytes per step, stage 2 / data parallel", "ratio",
               paired(per_step(two, "sent", statistics.mean), per_step(dp, "sent", statistics.mean)), Target("<=", 1.10),
               note="target 1.0 within 10%"),
        Figure("bytes per step, stage 1 (all-reduce + all-gather) / data parallel", "ratio",
               paired(per_step(one, "sent", statistics.mean), per_step(dp, "sent", statistics.mean))),
        Figure("bytes per step, stage 3 / data parallel", "ratio",
               paired(per_step(three, "sent", statistics.mean), per_step(dp3, "sent", statistics.mean)),
               Target("<=", 1.65), note="target 1.5 within 10%"),
        Figure("step time, stage 2 / data parallel", "ratio",
               paired(per_step(two, "step_s", max), per_step(dp, "step_s", max)), Target("<=", 1.3)),
        Figure("forward and backward / the whole step, data parallel", "ratio",
               paired(per_step(dp, "compute_s", max), per_step(dp, "step_s", max)),
               note="what an overlap of communication with compute could hide at most"),
        Figure("step time, stage 2 with its forward and backward wholly hidden / data parallel", "ratio",
               paired(uncovered(two), per_step(dp, "step_s", max)),
               note="a bound: no overlap of stage 2's collectives with its passes gets below it"),
        Figure("step time, stage 3 / data parallel", "ratio",
               paired(per_step(three, "step_s", max), per_step(dp3, "step_s", max))),
        Figure("peak weights held per rank, stage 3 / data parallel", "ratio",
               [max(three["peak_weight_bytes"]) / max(dp3["peak_weight_bytes"])],
               note="the shards plus the largest layer in use"),
        Figure("reduce-scatter / all-reduce of the same gradient, time", "ratio", paired(ops["reducescatter"], ops["allreduce"]),
               note="Horovod's collectives alone, the slowest rank's"),
        Figure("all-gather of the shards / all-reduce, time", "ratio", paired(ops["allgather"], ops["allreduce"])),
        Figure("training step, data parallel (slowest rank)", "ms", [1e3 * t for t in per_step(dp, "step_s", max)]),
        Figure("training step, stage 2 (slowest rank)", "ms", [1e3 * t for t in per_step(two, "step_s", max)]),
    ]
