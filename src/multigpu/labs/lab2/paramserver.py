"""Naive data parallelism: a parameter server over ``torch.distributed``, and ``nn.DataParallel``.

Every worker computes the gradient of its own batch. Rank 0 is also the *parameter server*:
it receives every other worker's whole gradient, averages, and sends the average back. All
traffic goes through rank 0's link: per step it receives ``(N-1) * B`` bytes and sends
``(N-1) * B`` bytes, where ``B`` is the size of one gradient. That grows with N, while each
worker of a ring all-reduce moves ``2 (N-1) / N * B`` whatever N is (:mod:`multigpu.labs.lab2.ring`).

- :func:`ps_average_gradients` is one parameter-server exchange (the lesson's 20 lines).
- :func:`ps_worker` trains for a few steps on synthetic data and returns timings and bytes.
- :func:`measure_ps_scaling` runs 1, 2, 4, ... workers one after the other in the same call
  and reports aggregate images/s against the ideal ``min(N, cores or GPUs) x`` one worker.
- :func:`dataparallel_images_per_s` (GPU mode only) is the other naive scheme: one process
  scatters each batch over all visible GPUs with ``torch.nn.DataParallel``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

#: Per-worker settings of :func:`ps_worker` (override any with a dict).
DEFAULTS: dict[str, Any] = {
    "model": "alexnet_small",
    "batch_size": 32,  # per worker
    "image_size": 64,
    "steps": 6,  # timed steps
    "warmup": 2,  # untimed steps before them
    "lr": 0.01,
    "seed": 0,
    "num_classes": 10,
}


def flat_gradient(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """All gradients of ``params`` in one flat buffer (one message instead of one per layer)."""
    return torch.cat([cast(torch.Tensor, p.grad).reshape(-1) for p in params])


def set_flat_gradient(params: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy ``flat`` back into each parameter's ``.grad`` (inverse of :func:`flat_gradient`)."""
    offset = 0
    for p in params:
        n = p.numel()
        grad = cast(torch.Tensor, p.grad)
        grad.copy_(flat[offset : offset + n].view_as(grad))
        offset += n


def ps_average_gradients(params: Sequence[torch.Tensor], world_size: int | None = None) -> dict[str, int]:
    """Average the gradients of ``params`` over all ranks through rank 0; return bytes moved.

    Workers send their flat gradient to rank 0 and receive the average back. Rank 0 receives
    from every worker (all at once, with ``irecv``), sums, divides by N and sends the result to
    every worker. Returns ``{"sent": ..., "received": ...}``: the sizes of the messages this rank
    sent and received, added up message by message. ``world_size`` (default: all ranks) lets
    ranks ``0..world_size-1`` work alone while the others wait.
    """
    rank, n = dist.get_rank(), world_size or dist.get_world_size()
    params = [p for p in params if p.grad is not None]
    flat = flat_gradient(params)
    if n == 1:
        return {"sent": 0, "received": 0}
    moved = {"sent": 0, "received": 0}
    if rank == 0:
        inbox = [torch.empty_like(flat) for _ in range(n - 1)]
        reqs = [cast(dist.Work, dist.irecv(buf, src)) for src, buf in enumerate(inbox, start=1)]
        for r in reqs:
            r.wait()
        for buf in inbox:
            flat += buf
            moved["received"] += _nbytes(buf)
        flat /= n
        reqs = [cast(dist.Work, dist.isend(flat, dst)) for dst in range(1, n)]
        for r in reqs:
            r.wait()
            moved["sent"] += _nbytes(flat)
    else:
        dist.send(flat, 0)
        moved["sent"] += _nbytes(flat)
        dist.recv(flat, 0)
        moved["received"] += _nbytes(flat)
    set_flat_gradient(params, flat)
    return moved


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _device() -> torch.device:
    if dist.is_initialized() and dist.get_backend() == "nccl":
        from multigpu.core.devices import worker_device

        return worker_device(int(__import__("os").environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def ps_worker(
    rank: int, world_size: int, config: dict[str, Any] | None = None, active: int | None = None
) -> dict[str, Any]:
    """One rank of a parameter-server training run on synthetic in-memory data.

    Every rank builds the same model (same seed), trains on its own random batch, and averages
    gradients with :func:`ps_average_gradients` each step. Returns this rank's images/s, the
    mean compute and communication seconds per step, bytes per step through this rank, the
    final loss and a checksum of the parameters (equal on all ranks if averaging works).
    ``active`` (default ``world_size``): only ranks below it train (the others must not call).
    """
    world_size = active or world_size
    cfg = {**DEFAULTS, **(config or {})}
    device = _device()
    model, optimizer, x, y = _model_and_batch(cfg, rank, device)
    bs = cfg["batch_size"]
    params = list(model.parameters())
    compute, comm, moved = [], [], {"sent": 0, "received": 0}
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    t_start = time.perf_counter()
    loss = torch.zeros(())
    for step in range(cfg["warmup"] + cfg["steps"]):
        if step == cfg["warmup"]:
            sync()
            t_start = time.perf_counter()
        loss, moved, compute_s, comm_s = _timed_step(model, optimizer, x, y, params, world_size, sync)
        if step >= cfg["warmup"]:
            compute.append(compute_s)
            comm.append(comm_s)
    sync()
    elapsed = time.perf_counter() - t_start
    with torch.no_grad():
        checksum = float(sum(p.double().sum() for p in model.parameters()))
    return {
        "rank": rank,
        "workers": world_size,
        "images_per_s": cfg["steps"] * bs / elapsed,
        "step_s": elapsed / cfg["steps"],
        "compute_s": statistics.mean(compute),
        "comm_s": statistics.mean(comm),
        "bytes_sent": moved["sent"],
        "bytes_received": moved["received"],
        "gradient_bytes": sum(p.numel() * p.element_size() for p in params),
        "loss": float(loss.detach()),
        "checksum": checksum,
    }


def _model_and_batch(cfg: dict[str, Any], rank: int,
                     device: torch.device) -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    """The model (seed ``cfg["seed"]``: the same on every rank), its SGD optimizer, and this
    rank's own random batch, on ``device``."""
    from multigpu.core.models import build_model

    torch.manual_seed(cfg["seed"])
    model = build_model(cfg["model"], num_classes=cfg["num_classes"]).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9)
    g = torch.Generator().manual_seed(cfg["seed"] + 1 + rank)
    bs, size = cfg["batch_size"], cfg["image_size"]
    x = torch.randn(bs, 3, size, size, generator=g).to(device)
    y = torch.randint(0, cfg["num_classes"], (bs,), generator=g).to(device)
    return model, optimizer, x, y


def _timed_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                params: list[nn.Parameter], world_size: int, sync: Callable[[], Any]) -> tuple[torch.Tensor, dict[str, int], float, float]:
    """One step, gradients averaged through the parameter server: the loss, the bytes moved, and
    the seconds of compute and of communication."""
    t0 = time.perf_counter()
    optimizer.zero_grad(set_to_none=False)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    sync()
    t1 = time.perf_counter()
    moved = ps_average_gradients(params, world_size)
    sync()
    t2 = time.perf_counter()
    optimizer.step()
    return loss, moved, t1 - t0, t2 - t1


def summarize(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from the ranks of one run: aggregate images/s (the slowest rank sets the pace)."""
    n = len(per_rank)
    step = max(r["step_s"] for r in per_rank)
    bs = per_rank[0]["images_per_s"] * per_rank[0]["step_s"]
    return {
        "workers": n,
        "images_per_s": n * bs / step,
        "step_s": step,
        "compute_s": statistics.mean(r["compute_s"] for r in per_rank),
        "comm_s": statistics.mean(r["comm_s"] for r in per_rank),
        "central_bytes": per_rank[0]["bytes_sent"] + per_rank[0]["bytes_received"],
        "worker_bytes": (per_rank[1]["bytes_sent"] + per_rank[1]["bytes_received"]) if n > 1 else 0,
        "gradient_bytes": per_rank[0]["gradient_bytes"],
        "checksums_equal": len({round(r["checksum"], 3) for r in per_rank}) == 1,
    }


def _scaling_worker(
    rank: int, world_size: int, workers: Sequence[int], config: dict[str, Any] | None, repeats: int
) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {n: [] for n in workers}
    for _ in range(repeats):
        for n in workers:
            dist.barrier()
            if rank < n:
                out[n].append(ps_worker(rank, world_size, config, active=n))
            dist.barrier()
    return out


def measure_ps_scaling(
    workers: Sequence[int] = (1, 2, 4),
    config: dict[str, Any] | None = None,
    *,
    repeats: int = 1,
    timeout: float = 180.0,
    echo: bool = False,
) -> list[dict[str, Any]]:
    """Parameter-server throughput for each worker count, side by side in one job.

    One job of ``max(workers)`` processes, one thread each (CPU mode: each worker is one
    "GPU"); for each N, ranks 0..N-1 train while the others wait in a barrier. With
    ``repeats`` > 1 the worker counts are cycled that many times and the median run kept, so
    slow spells of a shared machine hit every N alike. Each row adds ``ideal_images_per_s`` =
    ``min(N, cores or GPUs) x`` the one-worker figure and ``efficiency`` = measured / ideal.
    """
    from multigpu.core import devices
    from multigpu.running import launch

    info = devices.detect()
    workers = list(workers)
    per_rank = launch.run(
        _scaling_worker, max(workers), args=(workers, config, repeats), timeout=timeout, threads=1, echo=echo
    )
    rows = []
    for n in workers:
        runs = [summarize([per_rank[r][n][i] for r in range(n)]) for i in range(repeats)]
        best = sorted(runs, key=lambda r: r["images_per_s"])[len(runs) // 2]
        rows.append({**best, "runs": [r["images_per_s"] for r in runs]})
    base = next((r for r in rows if r["workers"] == 1), None)
    for r in rows:
        if base is not None:
            r["ideal_images_per_s"] = devices.ideal_factor(r["workers"], info) * base["images_per_s"]
            r["efficiency"] = r["images_per_s"] / r["ideal_images_per_s"]
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    """A text table of :func:`measure_ps_scaling` rows."""
    lines = [f"{'workers':>7} {'images/s':>9} {'ideal':>9} {'effic.':>7} {'compute':>9} {'comm':>9} {'central MB/step':>16}"]
    for r in rows:
        lines.append(
            f"{r['workers']:>7} {r['images_per_s']:>9.0f} {r.get('ideal_images_per_s', float('nan')):>9.0f} "
            f"{r.get('efficiency', float('nan')):>7.0%} {1000 * r['compute_s']:>7.0f}ms {1000 * r['comm_s']:>7.0f}ms "
            f"{r['central_bytes'] / 1e6:>16.1f}"
        )
    return "\n".join(lines)


def dataparallel_images_per_s(
    model: nn.Module,
    batch_size: int = 256,
    image_size: int = 224,
    *,
    device_ids: Sequence[int] | None = None,
    steps: int = 10,
    warmup: int = 3,
    num_classes: int = 1000,
) -> float:
    """GPU mode: training images/s of ``model`` wrapped in ``torch.nn.DataParallel``.

    One process, one batch of ``batch_size`` on GPU 0; every step DataParallel scatters the
    batch over ``device_ids`` (default: all visible GPUs), copies the model to each GPU,
    runs the replicas and gathers the outputs and gradients back on GPU 0, the central node.
    Pass ``device_ids=[0]`` for the one-GPU baseline with the same code path.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("nn.DataParallel needs CUDA GPUs; in CPU mode use measure_ps_scaling")
    ids = list(device_ids) if device_ids is not None else list(range(torch.cuda.device_count()))
    main = torch.device("cuda", ids[0])
    net = nn.DataParallel(model.to(main), device_ids=ids, output_device=ids[0])
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    x = torch.randn(batch_size, 3, image_size, image_size, device=main)
    y = torch.randint(0, num_classes, (batch_size,), device=main)
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(net(x), y).backward()
        optimizer.step()
    torch.cuda.synchronize()
    return steps * batch_size / (time.perf_counter() - t0)


def results_path() -> Path:
    """Where Lab 2 keeps the last parameter-server measurement, so the scaling-model notebook
    can compare its prediction with it: ``<data home>/../results/lab2-paramserver.json``."""
    from multigpu.core.data import data_home

    return Path(data_home()).parent / "results" / "lab2-paramserver.json"


def save_rows(rows: list[dict[str, Any]], path: str | None = None) -> Path:
    """Write :func:`measure_ps_scaling` rows as JSON (with the machine's mode and cores)."""
    import json

    from multigpu.core import devices

    p = Path(path) if path else results_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    info = devices.detect()
    p.write_text(json.dumps({"mode": info.mode, "cores": info.cores, "rows": rows}, indent=1))
    return p


def load_rows(path: "str | None" = None) -> list[dict[str, Any]] | None:
    """Rows saved by :func:`save_rows`, or None when there are none (or they are unreadable)."""
    import json

    p = Path(path) if path else results_path()
    try:
        return json.loads(p.read_text())["rows"]
    except (OSError, ValueError, KeyError):
        return None
