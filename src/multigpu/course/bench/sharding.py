"""Section ``sharding``: Lab 5's ZeRO stages against plain data parallelism on 4 workers."""

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


def measure_sharding(rounds: int) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """``(zero.compare's ways, fully_sharded.compare's ways)``: stages 1 and 2 on the model of many
    layers and stage 3 on the lab's small one, beside data parallelism, ``rounds`` rounds of
    :data:`SHARDING_STEPS` steps on :data:`SHARDING_WORKERS` workers (the tests take these once)."""
    from multigpu.labs.lab5 import fully_sharded, zero

    with steps("sharding", 2) as log:
        log.starting(f"data parallel, stage 1 (two forms), stage 2: {rounds} round(s) of {SHARDING_STEPS} steps")
        z = zero.compare(zero.MANY_LAYERS, SHARDING_WORKERS, SHARDING_STEPS, rounds, timeout=900)
        dp = z["data parallel"]
        log.finished(f"stage 2 held {max(z['stage 2']['peak_grad_bytes']) / max(dp['peak_grad_bytes']):.2f} x "
                     "the gradient bytes")
        log.starting(f"data parallel, stage 3: {rounds} round(s) of {SHARDING_STEPS} steps")
        s3 = fully_sharded.compare(zero.Model(), SHARDING_WORKERS, SHARDING_STEPS, rounds, timeout=600)
        log.finished(f"stage 3 sent {statistics.mean(s3['stage 3']['sent']) / statistics.mean(s3['data parallel']['sent']):.2f} x")
    return z, s3


def bench_sharding(plan: Plan, deadline: float, measured: Any = None) -> Section:
    """ZeRO stages 1 and 2 (:mod:`multigpu.labs.lab5.zero`, on its model of many layers) and stage 3
    by hand (:mod:`multigpu.labs.lab5.fully_sharded`) beside data parallelism, each in one Horovod
    job of 4 workers over Gloo, the ways interleaved round by round (:func:`measure_sharding`, or
    ``measured``, its result for this plan); ratios of steps measured side by side; and the three
    collectives alone, timed against each other."""
    from multigpu.labs.lab5 import collectives, zero

    section = Section("sharding", f"The sharded optimizer (Lab 5) against plain data parallelism, "
                                  f"{SHARDING_WORKERS} Horovod workers over Gloo")
    rounds, many = plan.scaling_repeats, zero.MANY_LAYERS
    z, s3 = measured or measure_sharding(rounds)
    dp = z["data parallel"]
    with steps("sharding", 1) as log:
        log.starting("the collectives alone: all-reduce, reduce-scatter and all-gather of the gradient")
        ops = collectives.collective_times(dp["parameters"], SHARDING_WORKERS, 3 * rounds, timeout=600)
        log.finished(f"reduce-scatter / all-reduce {statistics.median(paired(ops['reducescatter'], ops['allreduce'])):.2f} x")
    section.notes += notes(z, s3, many, rounds)
    section.figures = sharding_figures(z, s3["data parallel"], s3["stage 3"], ops)
    return section


def notes(z: dict[str, dict[str, Any]], s3: dict[str, dict[str, Any]], many: Any, rounds: int) -> list[str]:
    from multigpu.labs.lab5 import sharded_gradients, zero

    dp = z["data parallel"]
    ring = zero.ring_bytes(dp["gradient_bytes"], SHARDING_WORKERS)
    return [
        f"Stages 1 and 2: an MLP of {many.depth} layers of width {many.width}, {dp['parameters']:,} parameters "
        f"({fmt(dp['gradient_bytes'] / 1e6, 'ratio')} MB of gradient), Adam, global batch {many.batch}; stage 3: the "
        f"lab's small MLP of {s3['data parallel']['parameters']:,} parameters. {rounds} round(s) of every way in one job "
        f"per comparison, {SHARDING_STEPS} timed steps each after one untimed; a ratio's samples are steps paired by "
        "round and step.",
        "Stage 1 in two forms: all-reduce the gradient and keep a slice (`zero.stage1_step`), and reduce-scatter it "
        "after backward (DeepSpeed's, the notebook's exercise, `zero.sharded_step`). Stage 2 (`sharded_gradients."
        f"Stage2Adam`) reduce-scatters each layer's gradient during backward, at most {sharded_gradients.IN_FLIGHT} "
        "layers' whole gradients in flight, and frees them once reduced.",
        "Gradient bytes held: each rank's peak, from the storages of its gradient tensors sampled wherever one is "
        "created or freed; ZeRO's formula (g bytes per parameter at stages 0-1, g/N at stage 2) gives 1.00 x and "
        f"{1 / SHARDING_WORKERS:.2f} x data parallelism's.",
        "Bytes: what each rank wrote to its sockets during the whole step (`/proc/self/io`, the kernel's count), mean "
        f"over ranks; a ring all-reduce of the gradient sends {fmt(ring / 1e6, 'ratio')} MB per rank. Times: whole "
        "training steps, the slowest rank's.",
        "Targets (ZeRO, sections 5 and 7): optimizer state per rank 1/N = 0.25 x; gradient held by stage 2 at most "
        "0.3 x; bytes per step 1.0 x for stage 2, 1.5 x for stage 3 (each within 10%); step time at most 1.3 x on CPU "
        "workers.",
        "Weights after training, largest difference from data parallelism: "
        + ", ".join(f"{way} {row['max_weight_diff']:.2g}" for way, row in z.items() if way != "data parallel")
        + f", stage 3 {s3['stage 3']['max_weight_diff']:.2g}; averaged gradient, largest difference relative to its "
        f"largest entry: " + ", ".join(f"{way} {row['grad_error']:.2g}" for way, row in z.items() if way != "data parallel")
        + ".",
    ]


def held(row: dict[str, Any], dp: dict[str, Any]) -> list[float]:
    return [max(row["peak_grad_bytes"]) / max(dp["peak_grad_bytes"])]


def sharding_figures(z: dict[str, dict[str, Any]], dp3: dict[str, Any], three: dict[str, Any],
                     ops: dict[str, list[float]]) -> list[Figure]:
    """The section's figures: each way's memory, bytes and times over data parallelism's, step by step."""
    dp, naive, one, two = z["data parallel"], z["stage 1, all-reduce"], z["stage 1, reduce-scatter"], z["stage 2"]

    def sent(row: dict[str, Any], base: dict[str, Any]) -> list[float]:
        return paired(per_step(row, "sent", statistics.mean), per_step(base, "sent", statistics.mean))

    def times(row: dict[str, Any], base: dict[str, Any]) -> list[float]:
        return paired(per_step(row, "step_s", max), per_step(base, "step_s", max))

    return [
        Figure("optimizer state per rank, stage 2 / data parallel", "ratio",
               [max(two["state_bytes"]) / max(dp["state_bytes"])], Target("<=", 0.2501)),
        Figure("gradient held per rank at its peak, stage 2 / data parallel", "ratio", held(two, dp), Target("<=", 0.3),
               note=f"ZeRO's formula {1 / SHARDING_WORKERS:.2f}: its 1/N plus the layers in flight"),
        Figure("gradient held per rank at its peak, stage 1 (all-reduce) / data parallel", "ratio", held(naive, dp),
               note="ZeRO's formula 1.00"),
        Figure("gradient held per rank at its peak, stage 1 (reduce-scatter) / data parallel", "ratio", held(one, dp),
               note="ZeRO's formula 1.00; the reduce-scatter's 1/N beside the whole gradient"),
        Figure("bytes per step, stage 2 / data parallel", "ratio", sent(two, dp), Target("<=", 1.10),
               note="target 1.0 within 10%"),
        Figure("bytes per step, stage 1 (reduce-scatter + all-gather) / data parallel", "ratio", sent(one, dp)),
        Figure("bytes per step, stage 1 (all-reduce + all-gather) / data parallel", "ratio", sent(naive, dp)),
        Figure("bytes per step, stage 3 / data parallel", "ratio", sent(three, dp3), Target("<=", 1.65),
               note="target 1.5 within 10%"),
        Figure("step time, stage 2 / data parallel", "ratio", times(two, dp), Target("<=", 1.3)),
        Figure("step time, stage 1 (reduce-scatter) / data parallel", "ratio", times(one, dp)),
        Figure("forward and backward / the whole step, data parallel", "ratio",
               paired(per_step(dp, "compute_s", max), per_step(dp, "step_s", max)),
               note="what an overlap of communication with compute could hide at most"),
        Figure("step time, stage 3 / data parallel", "ratio", times(three, dp3)),
        Figure("peak weights held per rank, stage 3 / data parallel", "ratio",
               [max(three["peak_weight_bytes"]) / max(dp3["peak_weight_bytes"])],
               note="the shards plus the largest layer in use"),
        Figure("reduce-scatter / all-reduce of the same gradient, time", "ratio", paired(ops["reducescatter"], ops["allreduce"]),
               note="Horovod's collectives alone, the slowest rank's"),
        Figure("all-gather of the shards / all-reduce, time", "ratio", paired(ops["allgather"], ops["allreduce"])),
        Figure("training step, data parallel (slowest rank)", "ms", [1e3 * t for t in per_step(dp, "step_s", max)]),
        Figure("training step, stage 2 (slowest rank)", "ms", [1e3 * t for t in per_step(two, "step_s", max)]),
    ]
