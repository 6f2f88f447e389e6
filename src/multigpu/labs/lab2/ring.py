"""Ring all-reduce from scratch: reduce-scatter, then all-gather, with point-to-point messages.

The technique Baidu brought from HPC to deep learning and Horovod adopted. N workers sit on a
ring; each cuts its tensor into N chunks. In N-1 *reduce-scatter* steps every worker sends one
chunk to its right neighbour and adds the chunk it gets from its left one; afterwards worker r
holds the complete sum of chunk (r+1) mod N. In N-1 *all-gather* steps the finished chunks
travel once around the ring. Each worker sends 2(N-1) chunks of size B/N: ``2(N-1)/N * B``
bytes whatever N is, against ``2(N-1) * B`` through the central node of a parameter server.

- :func:`chunk_bounds` cuts ``numel`` elements into N chunks whose sizes differ by at most one.
- :func:`ring_allreduce` is the reference implementation (in place, returns bytes sent).
- :func:`check_allreduce` runs any implementation with the same signature in 2..N worker
  processes on awkward sizes and reports correctness against the exact sum, the bytes each rank
  really sent (counted by wrapping ``dist.send``/``dist.isend``) and whether a collective was
  used where only send/recv are allowed. The notebook's hidden tests use it.
- :func:`compare_with_gloo` times the ring against ``dist.all_reduce`` of the same sizes.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import torch
import torch.distributed as dist

#: Collectives that a from-scratch ring must not call (it may use send/recv/isend/irecv only).
COLLECTIVES: tuple[str, ...] = (
    "all_reduce",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
)


def chunk_bounds(numel: int, n: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of ``n`` contiguous chunks covering ``numel`` elements.

    Sizes differ by at most one: the first ``numel % n`` chunks get one extra element. Chunks
    may be empty when ``numel < n``.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    base, extra = divmod(int(numel), n)
    bounds, start = [], 0
    for i in range(n):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def expected_bytes_per_worker(nbytes: int, n: int) -> float:
    """Bytes each worker sends in a ring all-reduce of ``nbytes``: ``2 (n - 1) / n * nbytes``."""
    return 2.0 * (n - 1) / n * nbytes


def _exchange(send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> int:
    """Send ``send`` to ``dst`` while receiving ``recv`` from ``src``; return bytes sent.

    ``isend`` first, then a blocking ``recv``: every worker posts its send before it waits, so
    the ring cannot deadlock. Empty chunks are skipped on both sides (both know the sizes).
    """
    sent = 0
    req = None
    if send.numel():
        req = dist.isend(send.contiguous(), dst)
        sent = send.numel() * send.element_size()
    if recv.numel():
        dist.recv(recv, src)
    if req is not None:
        req.wait()
    return sent


def ring_allreduce(tensor: torch.Tensor, group: Any = None) -> int:
    """Sum ``tensor`` over all ranks in place with a ring; return the bytes this rank sent.

    Works for any size (not only multiples of the world size) and any dtype Gloo/NCCL can
    send. Uses only point-to-point ``isend``/``recv`` between ring neighbours.
    """
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    if n == 1 or tensor.numel() == 0:
        return 0
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1).clone()
    bounds = chunk_bounds(flat.numel(), n)
    right, left = (rank + 1) % n, (rank - 1) % n
    if group is not None:  # send/recv take global ranks
        right = dist.get_global_rank(group, right)
        left = dist.get_global_rank(group, left)
    sent = 0
    biggest = max(b - a for a, b in bounds)
    scratch = torch.empty(biggest, dtype=flat.dtype, device=flat.device)

    # Reduce-scatter: after step s, the chunk we just received holds s + 2 contributions.
    for s in range(n - 1):
        si, ri = (rank - s) % n, (rank - s - 1) % n
        (a, b), (c, d) = bounds[si], bounds[ri]
        buf = scratch[: d - c]
        sent += _exchange(flat[a:b], right, buf, left)
        flat[c:d] += buf
    # All-gather: the finished chunk (rank + 1) % n goes around the ring.
    for s in range(n - 1):
        si, ri = (rank + 1 - s) % n, (rank - s) % n
        (a, b), (c, d) = bounds[si], bounds[ri]
        buf = scratch[: d - c]
        sent += _exchange(flat[a:b], right, buf, left)
        flat[c:d] = buf
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return sent


# --------------------------------------------------------------------------- checking


def _tensor_for(rank: int, numel: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1000003 + rank * 7919 + numel)
    return torch.randn(numel, generator=g, dtype=torch.float64).to(dtype)


def _check_phase(
    rank: int, n: int, fn: Callable[[torch.Tensor], Any], sizes: Sequence[int], seed: int, counted: dict[str, Any]
) -> list[dict[str, Any]]:
    results = []
    for numel in sizes:
        mine = _tensor_for(rank, numel, seed, torch.float32)
        expected = cast(torch.Tensor, sum(_tensor_for(r, numel, seed, torch.float64) for r in range(n)))
        x = mine.clone()
        counted.update(bytes=0, messages=0, to=set())
        t0 = time.perf_counter()
        returned = fn(x)
        seconds = time.perf_counter() - t0
        err = float((x.double() - expected).abs().max()) if numel else 0.0
        scale = max(1.0, float(expected.abs().max())) if numel else 1.0
        results.append(
            {
                "rank": rank,
                "workers": n,
                "numel": int(numel),
                "nbytes": int(numel) * 4,
                "max_error": err,
                "correct": bool(x.shape == mine.shape and err <= 1e-4 * scale),
                "bytes_counted": int(counted["bytes"]),
                "messages": int(counted["messages"]),
                "sent_to": sorted(counted["to"]),
                "bytes_returned": None if returned is None else int(returned),
                "seconds": seconds,
            }
        )
    return results


def _check_worker(
    rank: int,
    world_size: int,
    fn: Callable[[torch.Tensor], Any],
    workers: Sequence[int],
    sizes: Sequence[int],
    seed: int,
    forbid: bool,
) -> dict[int, list[dict[str, Any]]]:
    """Per rank: for each N in ``workers``, ranks 0..N-1 run ``fn`` on each size while the
    others wait. During a phase ``dist.get_world_size()`` (and ``$WORLD_SIZE``) say N, sends
    are counted, and collectives raise. One start-up of the processes serves every N."""
    counted: dict[str, Any] = {"bytes": 0, "messages": 0, "to": set()}
    real_barrier = dist.barrier
    out: dict[int, list[dict[str, Any]]] = {}
    for n in workers:
        if n > world_size:
            raise ValueError(f"cannot check {n} workers in a job of {world_size}")
        real_barrier()
        if rank < n:
            with _phase_of(n, counted, forbid):
                out[n] = _check_phase(rank, n, fn, sizes, seed, counted)
        real_barrier()
    return out


@contextlib.contextmanager
def _phase_of(n: int, counted: dict[str, Any], forbid: bool) -> Iterator[None]:
    """While a phase of ``n`` workers runs: ``dist.get_world_size()`` and ``$WORLD_SIZE`` say
    ``n``, ``dist.send`` and ``dist.isend`` add to ``counted``, and (with ``forbid``) every
    collective raises; ``dist`` is as it was afterwards (``$WORLD_SIZE`` too, where it was set)."""
    import os

    real = {name: getattr(dist, name) for name in ("send", "isend", "get_world_size")}
    saved = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}
    env_world = os.environ.get("WORLD_SIZE")
    dist.send, dist.isend = _counting(real["send"], counted), _counting(real["isend"], counted)
    dist.get_world_size = lambda group=None, n=n: n  # type: ignore[misc]
    os.environ["WORLD_SIZE"] = str(n)
    if forbid:
        for name in saved:
            setattr(dist, name, _forbidden(name))
    try:
        yield
    finally:
        for name, f in real.items():
            setattr(dist, name, f)
        for name, f in saved.items():
            setattr(dist, name, f)
        if env_world is not None:
            os.environ["WORLD_SIZE"] = env_world


def _counting(send: Callable[..., Any], counted: dict[str, Any]) -> Callable[..., Any]:
    """``send`` (``dist.send`` or ``dist.isend``), each call's bytes, message and destination added to ``counted``."""

    def counting_send(tensor, dst=None, *args, **kwargs):
        counted["bytes"] += tensor.numel() * tensor.element_size()
        counted["messages"] += 1
        counted["to"].add(dst if dst is not None else kwargs.get("group_dst"))
        return send(tensor, dst, *args, **kwargs)

    return counting_send


def _forbidden(name: str) -> Callable[..., Any]:
    """A stand-in for the collective ``dist.<name>`` that raises."""

    def call(*args, **kwargs):
        raise RuntimeError(
            f"dist.{name} was called: a ring all-reduce from scratch may only use "
            "dist.send / dist.recv / dist.isend / dist.irecv between neighbours"
        )

    return call


def _summary(n: int, rows: list[dict[str, Any]], sizes: Sequence[int]) -> dict[str, Any]:
    slack = 2 * (n - 1) * 4  # uneven chunks differ by one element: at most one per step
    worst = max(abs(r["bytes_counted"] - expected_bytes_per_worker(r["nbytes"], n)) for r in rows)
    return {
        "workers": n,
        "correct": all(r["correct"] for r in rows),
        "max_error": max(r["max_error"] for r in rows),
        "bytes_ok": worst <= slack,
        "worst_bytes_error": worst,
        "returned_ok": all(r["bytes_returned"] == r["bytes_counted"] for r in rows),
        # a ring: every message to the right neighbour, at most one per step (empty chunks skipped)
        "ring_ok": all(set(r["sent_to"]) <= {(r["rank"] + 1) % n} and r["messages"] <= 2 * (n - 1) for r in rows),
        "sent_to": {r["rank"]: sorted({d for q in rows if q["rank"] == r["rank"] for d in q["sent_to"]}) for r in rows},
        "total_bytes_ok": all(
            sum(r["bytes_counted"] for r in rows if r["numel"] == k) == 2 * (n - 1) * k * 4 for k in sizes
        ),
        "rows": rows,
    }


def check_allreduce(
    fn: Callable[[torch.Tensor], Any],
    workers: int | Sequence[int] = (2, 3, 4),
    sizes: Sequence[int] = (1, 7, 1001, 4099),
    *,
    seed: int = 0,
    forbid_collectives: bool = True,
    timeout: float = 120.0,
    echo: bool = False,
) -> dict[int, dict[str, Any]]:
    """Check ``fn(tensor) -> bytes sent`` (an in-place sum over ranks) for each N in ``workers``.

    One job of ``max(workers)`` processes; for each N, ranks 0..N-1 each get their own random
    float32 tensor of every size and run ``fn`` (which must use ``dist.get_rank()`` and
    ``dist.get_world_size()``); the result is compared with the exact sum (float64). Returns
    ``{N: {"correct", "max_error", "bytes_ok", "worst_bytes_error", "returned_ok",
    "total_bytes_ok", "ring_ok", "sent_to", "rows"}}``: ``bytes_ok`` says every rank sent
    ``2(N-1)/N`` of the tensor, counted on the wire (to within two elements per step of rounding
    for uneven chunks), ``returned_ok`` that the returned counts match what was sent, ``ring_ok``
    that every rank sent only to its right neighbour, at most ``2(N-1)`` messages (``sent_to``:
    whom each rank sent to). A worker that
    raises or hangs gives :class:`multigpu.running.launch.WorkerError` (or ``WorkerTimeout``) within
    ``timeout`` seconds.
    """
    from multigpu.running import launch

    ns = [workers] if isinstance(workers, int) else list(workers)
    sizes = list(sizes)
    with launch.pickled_by_value(fn):
        per_rank = launch.run(
            _check_worker, max(ns), args=(fn, ns, sizes, seed, forbid_collectives), timeout=timeout,
            backend="gloo", threads=1, echo=echo,
        )
    return {n: _summary(n, [row for ranks in per_rank for row in ranks.get(n, [])], sizes) for n in ns}


# --------------------------------------------------------------------------- timing


def _bench_worker(
    rank: int,
    world_size: int,
    fn: Callable[[torch.Tensor], Any] | None,
    workers: Sequence[int],
    sizes: Sequence[int],
    repeats: int,
) -> dict[int, list[dict[str, Any]]]:
    groups = {n: (None if n == world_size else dist.new_group(list(range(n)))) for n in workers}
    out: dict[int, list[dict[str, Any]]] = {}
    for n in workers:
        dist.barrier()
        if rank < n:
            group = groups[n]
            if fn is not None and group is None:
                ring = fn
            else:
                ring = functools.partial(ring_allreduce, group=group)
            rows = []
            for numel in sizes:
                x = torch.randn(numel)
                ring_t, gloo_t = [], []
                sent = 0
                for i in range(repeats + 1):  # the first of each is a warm-up
                    y = x.clone()
                    dist.barrier(group=group)
                    t0 = time.perf_counter()
                    sent = ring(y)
                    t_ring = time.perf_counter() - t0
                    z = x.clone()
                    dist.barrier(group=group)
                    t0 = time.perf_counter()
                    dist.all_reduce(z, group=group)
                    t_gloo = time.perf_counter() - t0
                    if i:
                        ring_t.append(t_ring)
                        gloo_t.append(t_gloo)
                rows.append(
                    {
                        "rank": rank,
                        "numel": numel,
                        "ring_s": statistics.median(ring_t),
                        "gloo_s": statistics.median(gloo_t),
                        "bytes_sent": int(sent or 0),
                        "max_diff": float((y - z).abs().max()),
                    }
                )
            out[n] = rows
        dist.barrier()
    return out


def compare_with_gloo(
    workers: int | Sequence[int] = (2, 4),
    sizes: Sequence[int] = (2**16, 2**20, 2**22),
    *,
    repeats: int = 3,
    fn: Callable[[torch.Tensor], Any] | None = None,
    timeout: float = 120.0,
) -> list[dict[str, Any]]:
    """Time a ring all-reduce (default :func:`ring_allreduce`) against ``dist.all_reduce``.

    One job of ``max(workers)`` processes; for each N, ranks 0..N-1 run both alternately on
    the same float32 tensors after a barrier; medians over ``repeats``. Returns one row per
    (N, size) with the slowest rank's times (a collective ends when its last rank ends), the
    bytes each rank sent and the ideal ``2(N-1)/N * B``. A custom ``fn`` is only used for the
    largest N (it sees the default process group).
    """
    from multigpu.running import launch

    ns = [workers] if isinstance(workers, int) else list(workers)
    with launch.pickled_by_value(fn):
        per_rank = launch.run(
            _bench_worker, max(ns), args=(fn, ns, list(sizes), repeats), timeout=timeout, backend="gloo",
            threads=1, echo=False,
        )
    rows = []
    for n in ns:
        for i, numel in enumerate(sizes):
            cells = [ranks[n][i] for ranks in per_rank if n in ranks]
            rows.append(
                {
                    "workers": n,
                    "numel": numel,
                    "nbytes": numel * 4,
                    "ring_s": max(c["ring_s"] for c in cells),
                    "gloo_s": max(c["gloo_s"] for c in cells),
                    "bytes_sent_per_worker": [c["bytes_sent"] for c in cells],
                    "ideal_bytes_per_worker": expected_bytes_per_worker(numel * 4, n),
                    "max_diff": max(c["max_diff"] for c in cells),
                }
            )
    return rows
