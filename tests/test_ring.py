"""multigpu.labs.lab2.ring: the reference ring all-reduce and the checker the hidden tests use."""

from __future__ import annotations

import time

import pytest

from multigpu.labs.lab2 import ring
from multigpu.running import launch


def test_chunk_bounds_cover_everything_with_sizes_within_one():
    for numel in (0, 1, 3, 7, 10, 1001):
        for n in (1, 2, 3, 4, 5):
            b = ring.chunk_bounds(numel, n)
            assert len(b) == n and b[0][0] == 0 and b[-1][1] == numel
            assert all(b[i][1] == b[i + 1][0] for i in range(n - 1))
            sizes = [hi - lo for lo, hi in b]
            assert max(sizes) - min(sizes) <= 1


def test_expected_bytes():
    assert ring.expected_bytes_per_worker(400, 4) == pytest.approx(600)
    assert ring.expected_bytes_per_worker(400, 1) == 0


@pytest.mark.slow
def test_reference_ring_matches_the_sum_for_2_3_4_workers_and_sends_2_n_minus_1_over_n():
    report = ring.check_allreduce(ring.ring_allreduce, (2, 3, 4), sizes=(1, 2, 5, 7, 1001, 4099))
    assert set(report) == {2, 3, 4}
    for n, r in report.items():
        assert r["correct"], (n, r["max_error"])
        assert r["bytes_ok"] and r["returned_ok"] and r["total_bytes_ok"], (n, r["worst_bytes_error"])
        assert len(r["rows"]) == n * 6


def collective_cheat(tensor):
    import torch.distributed as dist

    dist.all_reduce(tensor)
    return int(2 * (dist.get_world_size() - 1) / dist.get_world_size() * tensor.numel() * 4)


@pytest.mark.slow
def test_a_collective_is_refused():
    with pytest.raises(launch.WorkerError) as err:
        ring.check_allreduce(collective_cheat, 2, sizes=(8,))
    assert "only use" in str(err.value)


def naive_allgather_sum(tensor):
    """Correct, but sends the whole tensor to everyone: (N-1) x B per worker."""
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    total = tensor.clone()
    sent = 0
    for peer in range(n):
        if peer == rank:
            continue
        buf = torch.empty_like(tensor)
        if rank < peer:
            dist.send(tensor, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            dist.send(tensor, peer)
        sent += tensor.numel() * 4
        total += buf
    tensor.copy_(total)
    return sent


@pytest.mark.slow
def test_a_correct_but_wasteful_exchange_fails_the_byte_check():
    report = ring.check_allreduce(naive_allgather_sum, (3,), sizes=(1000,))
    assert report[3]["correct"] and report[3]["returned_ok"]
    assert not report[3]["bytes_ok"], "sending (N-1) B per worker is more than 2(N-1)/N B"


def not_implemented(tensor):
    raise NotImplementedError()


@pytest.mark.slow
def test_the_blank_exercise_fails_fast():
    start = time.monotonic()
    with pytest.raises(launch.WorkerError) as err:
        ring.check_allreduce(not_implemented, (2, 3, 4), sizes=(5,), timeout=60)
    assert "NotImplementedError" in str(err.value)
    assert time.monotonic() - start < 45


def wrong_answer(tensor):
    tensor.mul_(2)
    return 0


@pytest.mark.slow
def test_a_wrong_sum_is_reported():
    report = ring.check_allreduce(wrong_answer, (2,), sizes=(5,))
    assert not report[2]["correct"]


def direct_allreduce(tensor):
    """Not a ring: each rank sends chunk j straight to rank j and then its own sum to everyone.
    The right sum and the same 2(N-1)/N bytes per worker as a ring."""
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    if n == 1:
        return 0
    flat, sent = tensor.view(-1), 0
    bounds = ring.chunk_bounds(flat.numel(), n)
    lo, hi = bounds[rank]
    for phase in ("reduce", "gather"):
        reqs = []
        for j in range(n):
            a, b = bounds[j] if phase == "reduce" else (lo, hi)
            if j != rank and b > a:
                reqs.append(dist.isend(flat[a:b].clone(), j))
                sent += (b - a) * flat.element_size()
        for j in range(n):
            a, b = (lo, hi) if phase == "reduce" else bounds[j]
            if j != rank and b > a:
                incoming = torch.empty(b - a)
                dist.recv(incoming, j)
                if phase == "reduce":
                    flat[a:b] += incoming
                else:
                    flat[a:b] = incoming
        for req in reqs:
            req.wait()
    return sent


@pytest.mark.slow
def test_a_scheme_that_is_not_a_ring_is_caught_by_its_messages_destinations():
    report = ring.check_allreduce(direct_allreduce, (3, 4), sizes=(7, 1001))
    for n, r in report.items():
        assert r["correct"] and r["bytes_ok"] and r["returned_ok"]  # what the old test looked at
        assert not r["ring_ok"] and r["sent_to"][0] == list(range(1, n))
    assert all(r["ring_ok"] for r in ring.check_allreduce(ring.ring_allreduce, (3, 4), sizes=(7, 1001)).values())


@pytest.mark.slow
def test_compare_with_gloo_agrees_and_counts_bytes():
    rows = ring.compare_with_gloo((2, 3), sizes=(1000, 2**16), repeats=1)
    assert [(r["workers"], r["numel"]) for r in rows] == [(2, 1000), (2, 2**16), (3, 1000), (3, 2**16)]
    for r in rows:
        assert r["max_diff"] < 1e-4
        assert r["ring_s"] > 0 and r["gloo_s"] > 0
        assert all(abs(b - r["ideal_bytes_per_worker"]) <= 2 * (r["workers"] - 1) * 4 for b in r["bytes_sent_per_worker"])
