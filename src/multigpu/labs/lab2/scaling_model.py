"""A scaling model: step time = compute + communication, for N devices and two algorithms.

Data parallelism with a fixed per-device batch (weak scaling): every step each device computes
the gradient of its batch, then the gradients are averaged across devices.

- compute: ``batch * flops_per_sample / device_flops`` seconds;
- communication of a gradient of ``B`` bytes over links with latency ``a`` (seconds per
  message) and bandwidth ``b`` (bytes/s):

  * ring all-reduce: ``2 (N-1)`` steps, each moving a chunk of ``B/N`` bytes:
    ``2 (N-1) a + 2 (N-1)/N * B / b``. The bandwidth term stays below ``2 B / b`` whatever N;
    the latency term grows with N.
  * parameter server: the central node receives ``(N-1) B`` and sends ``(N-1) B`` over its
    one link: ``2 a + 2 (N-1) B / b``. It grows with N.
  * sharded parameter servers, one on every worker's node, each holding ``1/N`` of the
    parameters: the busiest node moves ``(N-1)/N B`` per phase, ``2 a + 2 (N-1)/N B / b``: the
    ring's bandwidth term with the single server's latency term. With ``S`` servers in
    between, :func:`ps_busiest_node_bytes`.

- efficiency: ``step time with 1 device / step time with N devices`` (throughput of N devices
  over N times one device's). ``overlap`` hides up to that fraction of the backward pass
  (2/3 of compute) behind communication, as Horovod and DDP do.

The presets (links, models) and the published measurements the model is drawn beside and checked
against are tables of :mod:`multigpu.labs.lab2.scaling_model_data`, importable from here too:
:func:`benchmark_table` puts each of :data:`BENCHMARKS` beside the model's bounds; :func:`fit_overlap`
finds how close one overlap per source gets.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from multigpu.labs.lab2.scaling_model_data import BENCHMARKS, GPU_FLOPS, INTERCONNECTS, LINKS, MODELS, Benchmark, Link, ModelSpec
from multigpu.labs.lab2.scaling_model_data import PUBLISHED as PUBLISHED
from multigpu.labs.lab2.scaling_model_data import PUBLISHED_BY as PUBLISHED_BY
from multigpu.labs.lab2.scaling_model_data import PUBLISHED_SOURCE as PUBLISHED_SOURCE

#: "ring": ring all-reduce; "ps": one parameter server (a worker that also serves); "sharded-ps":
#: a server on every worker's node, each holding 1/N of the parameters (MXNet's KVStore layout).
ALGORITHMS = ("ring", "ps", "sharded-ps")


def _link(link: Link | str) -> Link:
    if isinstance(link, Link):
        return link
    try:
        return LINKS[link] if link in LINKS else INTERCONNECTS[link]
    except KeyError:
        raise ValueError(f"unknown link {link!r}; presets: {sorted(LINKS)} and {sorted(INTERCONNECTS)}") from None


def _model(model: ModelSpec | str) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    try:
        return MODELS[model]
    except KeyError:
        raise ValueError(f"unknown model {model!r}; presets: {sorted(MODELS)}") from None


def ring_bytes_per_worker(nbytes: float, n: int) -> float:
    """Bytes each worker sends in a ring all-reduce: ``2 (n-1)/n * nbytes``."""
    return 2.0 * (n - 1) / n * nbytes


def ps_central_bytes(nbytes: float, n: int) -> float:
    """Bytes through the parameter server per step (received + sent): ``2 (n-1) * nbytes``."""
    return 2.0 * (n - 1) * nbytes


def ring_allreduce_time(nbytes: float, n: int, link: Link | str) -> float:
    """Seconds for a ring all-reduce of ``nbytes`` over ``n`` workers:
    ``2 (n-1) latency + 2 (n-1)/n * nbytes / bandwidth`` (0 for one worker)."""
    lk = _link(link)
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * lk.latency_s + ring_bytes_per_worker(nbytes, n) / lk.bandwidth


def ps_busiest_node_bytes(nbytes: float, n: int, servers: int = 1) -> float:
    """Bytes the busiest node receives (push) or sends (pull) per step when ``servers`` of the
    ``n`` worker nodes each hold ``1/servers`` of the parameters.

    A server node receives every other worker's slice: ``(n-1) nbytes / servers``. A worker
    sends what is not held on its own node: all of ``nbytes`` where some node serves nothing
    (``servers < n``), ``(n-1)/n`` of it when every node serves. One server: ``(n-1) nbytes``;
    a server per node: ``(n-1)/n nbytes``, the ring's traffic per worker per phase.
    """
    if not 1 <= servers <= max(n, 1):
        raise ValueError(f"servers must be between 1 and the {n} workers, got {servers}")
    if n <= 1:
        return 0.0
    received = (n - 1) * nbytes / servers
    sent = nbytes if servers < n else (n - 1) * nbytes / n
    return max(received, sent)


def ps_time(nbytes: float, n: int, link: Link | str, servers: int = 1) -> float:
    """Seconds for a parameter-server exchange: the workers push their gradients to the
    servers, then pull the averages back, each phase as long as its busiest node's bytes over its
    link (links are full duplex): ``2 latency + 2 busiest / bandwidth`` (:func:`ps_busiest_node_bytes`;
    0 for one worker). One server: ``2 latency + 2 (n-1) nbytes / bandwidth``."""
    lk = _link(link)
    if n <= 1:
        return 0.0
    return 2 * lk.latency_s + 2 * ps_busiest_node_bytes(nbytes, n, servers) / lk.bandwidth


def hierarchical_allreduce_time(nbytes: float, nodes: int, gpus_per_node: int, intra: Link | str,
                                inter: Link | str) -> float:
    """Seconds for a hierarchical all-reduce of ``nbytes`` on ``nodes`` servers of
    ``gpus_per_node`` GPUs each (Horovod's ``HOROVOD_HIERARCHICAL_ALLREDUCE``, NCCL's trees and
    rings do the same in spirit):

    1. reduce-scatter within each server over ``intra``: ``(g-1)`` steps of ``B/g`` bytes;
    2. each GPU all-reduces its ``B/g`` slice with its peers on the other servers, a ring over
       ``inter``, all ``g`` GPUs of a server at once through its one NIC: ``2 (n-1)`` steps of
       ``B/n`` bytes through that NIC;
    3. all-gather within each server: ``(g-1)`` steps of ``B/g`` again.

    ``2 (g-1) (a_intra + B / (g b_intra)) + 2 (n-1) (a_inter + B / (n b_inter))``. A flat ring
    over all ``n g`` GPUs moves about as many bytes through each NIC but waits ``2 (n g - 1)``
    times for the slow link's latency instead of ``2 (n-1)``.
    """
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError("nodes and gpus_per_node must be >= 1")
    # phases 1 + 3 are a ring all-reduce within the server; phase 2, one across the servers
    return ring_allreduce_time(nbytes, gpus_per_node, intra) + ring_allreduce_time(nbytes, nodes, inter)


def hidden_comm_s(comm_s: float, compute_s: float, overlap: float) -> float:
    """Communication hidden behind the backward pass (2/3 of compute): up to ``overlap`` of it."""
    return min(comm_s, overlap * compute_s * 2.0 / 3.0)


def predict_benchmark(bench: Benchmark, overlap: float = 0.0) -> float:
    """The model's efficiency for ``bench`` on its own hardware: one GPU's step (its batch over its
    images/s), the gradient's exchange through each node's card (:func:`ring_allreduce_time` over
    all GPUs, or :func:`ps_time` between the nodes), up to ``overlap`` of the backward pass hidden,
    times the node's own efficiency."""
    compute = bench.batch / bench.one_gpu_images_per_s
    nbytes = 4 * bench.params
    if bench.algorithm == "ring":
        comm = ring_allreduce_time(nbytes, bench.gpus, bench.nic)
    else:
        comm = ps_time(nbytes, bench.nodes, bench.nic, servers=bench.servers)
    return bench.node_efficiency * compute / (compute + comm - hidden_comm_s(comm, compute, overlap))


def benchmark_table(benchmarks: Sequence[Benchmark] | None = None, tolerance: float = 0.05) -> list[dict[str, Any]]:
    """Each benchmark beside the model's two bounds, no overlap and the whole backward pass
    overlapped: ``inside`` when the published efficiency lies between them, ``tolerance`` either side."""
    rows = []
    for b in BENCHMARKS if benchmarks is None else benchmarks:
        low, high = predict_benchmark(b, 0.0), predict_benchmark(b, 1.0)
        rows.append({"benchmark": b, "no_overlap": low, "full_overlap": high,
                     "inside": low - tolerance <= b.efficiency <= high + tolerance})
    return rows


def fit_overlap(benchmarks: Sequence[Benchmark]) -> tuple[float, float]:
    """The one overlap (0 to 1, in steps of 0.01) that brings the model closest to all of
    ``benchmarks`` (least worst-case error), and that worst error."""
    fits = [(max(abs(predict_benchmark(b, k / 100) - b.efficiency) for b in benchmarks), k / 100) for k in range(101)]
    worst, overlap = min(fits)
    return overlap, worst


def plot_benchmarks(rows: Sequence[dict[str, Any]], ax: Any = None, tolerance: float = 0.05) -> Any:
    """Published efficiency (x) against the model's range (a bar from no overlap to full overlap)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 5))
    sources = sorted({r["benchmark"].source for r in rows})
    for i, (source, marker) in enumerate(zip(sources, "os^")):
        mine = [r for r in rows if r["benchmark"].source == source]
        x = [r["benchmark"].efficiency for r in mine]
        color = f"C{i}"
        ax.vlines(x, [r["no_overlap"] for r in mine], [r["full_overlap"] for r in mine], color=color, alpha=0.6)
        ax.plot(x, [r["no_overlap"] for r in mine], marker, color=color, label=f"{source.split(',')[0]}: nothing hidden")
        ax.plot(x, [r["full_overlap"] for r in mine], marker, color=color, mfc="none",
                label="... the whole backward pass overlapped")
    ax.plot([0.4, 1.05], [0.4, 1.05], "k-", lw=1)
    ax.fill_between([0.4, 1.05], [0.4 - tolerance, 1.05 - tolerance], [0.4 + tolerance, 1.05 + tolerance],
                    color="0.85", label=f"model = published \u00b1 {tolerance:.0%}")
    ax.set_xlim(0.4, 1.05)
    ax.set_ylim(0.4, 1.05)
    ax.set_xlabel("published efficiency")
    ax.set_ylabel("model's efficiency on that hardware")
    ax.set_title("Published points against the model's range on their hardware", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return ax


def comm_time(nbytes: float, n: int, link: Link | str, algorithm: str = "ring") -> float:
    """Communication seconds per step for ``algorithm`` (:data:`ALGORITHMS`)."""
    if algorithm == "ring":
        return ring_allreduce_time(nbytes, n, link)
    if algorithm == "ps":
        return ps_time(nbytes, n, link)
    if algorithm == "sharded-ps":
        return ps_time(nbytes, n, link, servers=max(n, 1))
    raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")


@dataclass(frozen=True)
class Prediction:
    """One point of the scaling model."""

    workers: int
    compute_s: float
    comm_s: float
    hidden_s: float
    step_s: float
    samples_per_s: float
    efficiency: float


def predict(
    model: ModelSpec | str,
    n: int,
    *,
    link: Link | str = "100GbE",
    algorithm: str = "ring",
    batch: int | None = None,
    device_flops: float = GPU_FLOPS,
    overlap: float = 0.0,
    compute_s: float | None = None,
    gradient_bytes: float | None = None,
    devices: int | None = None,
) -> Prediction:
    """Step time, throughput and efficiency of ``n`` data-parallel workers.

    ``compute_s`` / ``gradient_bytes`` override the model preset (e.g. with figures measured on
    this machine). ``devices``: how many workers can really compute at once (CPU cores here);
    more workers than that share them, so each one's compute takes ``n / devices`` longer.
    Efficiency is against ``min(n, devices) x`` one worker's throughput.
    """
    if n < 1:
        raise ValueError("n must be >= 1")
    if not 0.0 <= overlap <= 1.0:
        raise ValueError("overlap must be between 0 and 1")
    spec = _model(model)
    batch = batch or spec.batch
    nbytes = spec.gradient_bytes if gradient_bytes is None else gradient_bytes
    base = batch * spec.flops_per_sample / device_flops if compute_s is None else compute_s

    def step(k: int) -> tuple[float, float, float, float]:
        c = base * (max(1.0, k / devices) if devices else 1.0)
        m = comm_time(nbytes, k, link, algorithm)
        hidden = hidden_comm_s(m, c, overlap)
        return c, m, hidden, c + m - hidden

    c, m, hidden, t = step(n)
    _, _, _, t1 = step(1)
    ideal = min(n, devices) if devices else n
    rate = n * batch / t
    return Prediction(n, c, m, hidden, t, rate, rate / (ideal * batch / t1))


def efficiency_curve(model: ModelSpec | str, ns: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256), **kwargs: Any) -> list[float]:
    """Predicted efficiency for each worker count in ``ns`` (keywords as :func:`predict`)."""
    return [predict(model, n, **kwargs).efficiency for n in ns]


def fit_link(rows: Sequence[dict[str, Any]], name: str = "this machine") -> Link:
    """Fit a :class:`Link` to measured ring all-reduce times (rows with ``workers``, ``nbytes``,
    ``ring_s``, as from :func:`multigpu.labs.lab2.ring.compare_with_gloo`): least squares of
    ``t = 2 (N-1) a + 2 (N-1)/N B / b`` over ``a`` and ``1/b``, both kept positive."""
    xs = [(2.0 * (r["workers"] - 1), ring_bytes_per_worker(r["nbytes"], r["workers"])) for r in rows]
    ts = [float(r["ring_s"]) for r in rows]
    s11 = sum(a * a for a, _ in xs)
    s12 = sum(a * b for a, b in xs)
    s22 = sum(b * b for _, b in xs)
    y1 = sum(a * t for (a, _), t in zip(xs, ts))
    y2 = sum(b * t for (_, b), t in zip(xs, ts))
    det = s11 * s22 - s12 * s12
    if det > 0:
        lat = (y1 * s22 - y2 * s12) / det
        inv_bw = (s11 * y2 - s12 * y1) / det
    else:
        lat, inv_bw = 0.0, y2 / s22 if s22 else 1e-9
    if lat <= 0 or inv_bw <= 0:  # fall back to bandwidth only, then latency only
        lat = 1e-7
        inv_bw = max(sum((t - a * lat) * b for (a, b), t in zip(xs, ts)) / s22, 1e-15) if s22 else 1e-9
    return Link(name, lat, 1.0 / inv_bw)


def plot_efficiency(
    models: Sequence[ModelSpec | str] = ("AlexNet", "ResNet-152"),
    ns: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256),
    *,
    ax: Any = None,
    published: bool = True,
    label: str = "model",
    **kwargs: Any,
) -> Any:
    """Efficiency vs number of workers (log x) for each model; published points as markers.
    ``label`` names the curves in the legend ("AlexNet (model)")."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    for i, m in enumerate(models):
        spec = _model(m)
        line = ax.plot(ns, efficiency_curve(spec, ns, **kwargs), marker=".", label=f"{spec.name} ({label})")[0]
        key = next((k for k, v in MODELS.items() if v is spec or v.name == spec.name), spec.name)
        if published and key in PUBLISHED:
            pts = PUBLISHED[key]
            ax.plot(list(pts), list(pts.values()), "x", ms=10, mew=2, color=line.get_color(),
                    label=f"{spec.name} (published: {PUBLISHED_BY[key]})")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("workers (GPUs)")
    ax.set_ylabel("scaling efficiency")
    lk = _link(kwargs.get("link", "100GbE"))
    ax.set_title(f"{kwargs.get('algorithm', 'ring')} over {lk.name}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")  # below the curves, clear of the published crosses at 256
    return ax


def scaling_widget(max_workers: int = 256) -> Any:
    """Sliders and menus to explore the model: model, link, algorithm, per-device batch,
    overlap, N up to ``max_workers``. Returns the widget (display it as a cell's last line)."""
    import ipywidgets as W
    import matplotlib.pyplot as plt

    exps = list(range(0, int(math.log2(max_workers)) + 1))
    model_w = W.Dropdown(options=list(MODELS), value="AlexNet", description="model")
    link_w = W.Dropdown(options=list(LINKS), value="100GbE", description="link")
    algo_w = W.ToggleButtons(options=[("ring all-reduce", "ring"), ("parameter server", "ps"),
                                      ("sharded servers", "sharded-ps")], value="ring")
    batch_w = W.IntSlider(value=MODELS["AlexNet"].batch, min=1, max=512, description="batch/dev")
    overlap_w = W.FloatSlider(value=0.0, min=0.0, max=1.0, step=0.1, description="overlap")
    nmax_w = W.SelectionSlider(options=[2**e for e in exps], value=max_workers, description="max N")
    out = W.Output()

    def on_model(change: dict) -> None:
        batch_w.value = MODELS[change["new"]].batch

    def redraw(*_: Any) -> None:
        ns = [2**e for e in exps if 2**e <= nmax_w.value]
        kw = dict(link=link_w.value, algorithm=algo_w.value, batch=batch_w.value, overlap=overlap_w.value)
        p = predict(model_w.value, ns[-1], **kw)
        with out:
            out.clear_output(wait=True)
            fig, ax = plt.subplots(figsize=(7, 3.5))
            ax.plot(ns, efficiency_curve(model_w.value, ns, **kw), marker="o")
            ax.set_xscale("log", base=2)
            ax.set_ylim(0, 1.05)
            ax.set_xlabel("workers")
            ax.set_ylabel("efficiency")
            ax.grid(True, alpha=0.3)
            ax.set_title(
                f"{model_w.value}, {algo_w.value}, {LINKS[link_w.value].name}: at N={ns[-1]} compute "
                f"{p.compute_s * 1e3:.0f} ms, comm {p.comm_s * 1e3:.0f} ms",
                fontsize=9,
            )
            plt.show()

    model_w.observe(on_model, names="value")
    for w in (model_w, link_w, algo_w, batch_w, overlap_w, nmax_w):
        w.observe(redraw, names="value")
    redraw()
    return W.VBox([W.HBox([model_w, link_w]), algo_w, W.HBox([batch_w, overlap_w]), nmax_w, out])
