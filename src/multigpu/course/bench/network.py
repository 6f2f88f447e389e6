"""Section ``links``: an all-reduce behind emulated network links, against the link-only model."""

from __future__ import annotations

import statistics

from multigpu.course.bench.report import ALLREDUCE_WARMUP, Figure, Plan, Section, fmt, interleave, steps

#: The tensor all-reduced: 4 MiB of float32 (the size of one of Horovod's CPU fusion groups).
LINK_BYTES = 4 * 2**20
LINK_WORKERS = 2


def bench_links(plan: Plan, deadline: float) -> Section:
    """All-reduce time of 2 Horovod workers (Gloo) on each of :data:`multigpu.labs.lab4.links.PRESETS`,
    interleaved, and measured / predicted for the limited ones."""
    from multigpu.labs.lab4 import links
    from multigpu.running import hvdtools, launch

    section = Section("links", f"All-reduce of {LINK_BYTES / 2**20:g} MiB on {LINK_WORKERS} Horovod workers "
                               "behind emulated links (multigpu.labs.lab4.links)")
    why = links.unavailable()
    if why:
        section.status, section.error = "skipped", why
        return section
    presets = list(links.PRESETS.items())
    section.notes += [
        "Each job runs in a user + network namespace of its own whose loopback `tc tbf` limits to the "
        f"link's rate (burst {links.BURST_BYTES} bytes); Horovod over Gloo; mean of {plan.allreduce_reps} "
        f"all-reduces after {ALLREDUCE_WARMUP} untimed ones, the slower worker's.",
        "Model: `links.predicted_allreduce_s`, every worker's ring bytes over the one shared link, "
        "nothing else (no latency, no computation): measured / model near 1 means the link sets the time.",
    ]
    times: dict[str, list[float]] = {name: [] for name, _ in presets}
    order = interleave(presets, plan.allreduce_rounds)
    with steps("links", len(order)) as log:
        for r, (name, rate) in order:
            per_rank = launch.run_horovod(hvdtools.allreduce_times, LINK_WORKERS,
                                          args=(LINK_BYTES // 4, ALLREDUCE_WARMUP, plan.allreduce_reps),
                                          link=links.EmulatedLink(rate), echo=False, timeout=300)
            times[name].append(max(statistics.mean(t) for t in per_rank) * 1000)
            log.finished(f"{name}, round {r + 1}/{plan.allreduce_rounds}: {fmt(times[name][-1], 'ms')}")
    section.figures += [Figure(f"all-reduce, {name}", "ms", times[name]) for name, _ in presets]
    for name, rate in presets:
        if rate is not None:
            model_ms = links.predicted_allreduce_s(LINK_BYTES, LINK_WORKERS, rate) * 1000
            section.figures.append(Figure(f"measured / model, {name}", "ratio", [t / model_ms for t in times[name]],
                                          note=f"model {fmt(model_ms, 'ms')}"))
    return section
