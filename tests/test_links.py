"""multigpu.links: Horovod jobs behind an emulated link (a rate-limited loopback in a namespace)."""

from __future__ import annotations

import statistics

import pytest

from multigpu import hvdtools, launch, links

WHY_NOT = links.unavailable()
needs_namespaces = pytest.mark.skipif(WHY_NOT is not None, reason=f"no emulated links here: {WHY_NOT}")
MB4 = 4 * 2**20


def test_the_command_limits_the_namespaces_own_loopback():
    cmd = links.EmulatedLink(100e6).wrap(["horovodrun", "-np", "2", "python", "x.py"])
    assert cmd[:4] == ["unshare", "--user", "--map-root-user", "--net"]
    script = cmd[cmd.index("-c") + 1]
    assert script.startswith("ip link set lo up && tc qdisc add dev lo root tbf rate 100000000bit")
    assert f"burst {links.BURST_BYTES} " in script and links.BURST_BYTES >= 65536  # lo's MTU fits the bucket
    assert script.endswith('exec "$@"') and cmd[-5:] == ["horovodrun", "-np", "2", "python", "x.py"]
    assert "tc" not in links.EmulatedLink(None).setup_script()  # unlimited: the namespace's loopback as it is
    assert links.EmulatedLink(1e9).label == "1 Gb/s" and links.EmulatedLink(None).label == "unlimited loopback"
    with pytest.raises(ValueError, match="> 0"):
        links.EmulatedLink(0)


def test_the_model_counts_every_workers_bytes_on_the_shared_link():
    # 2 workers: each sends 2(N-1)/N = 1 x the tensor; both cross the one loopback
    assert links.total_ring_bytes(MB4, 2) == 2 * MB4
    assert links.predicted_allreduce_s(MB4, 2, 100e6) == pytest.approx(2 * MB4 * 8 / 100e6)
    assert links.predicted_allreduce_s(MB4, 4, 1e9) == pytest.approx(4 * 1.5 * MB4 * 8 / 1e9)


def test_a_link_job_refuses_mpi_and_other_hosts():
    link = links.EmulatedLink(1e9)
    if WHY_NOT is None:
        with pytest.raises(ValueError, match="no --mpi"):
            launch.horovodrun(["true"], 2, horovod_args=["--mpi"], link=link, echo=False)
        with pytest.raises(ValueError, match="no hosts"):
            launch.horovodrun(["true"], 2, hosts="a:1,b:1", link=link, echo=False)
    else:
        with pytest.raises(RuntimeError, match="no emulated link"):
            launch.horovodrun(["true"], 2, link=link, echo=False)


@pytest.mark.slow
@needs_namespaces
def test_a_slower_link_slows_the_allreduce_as_the_model_says():
    """A 4 MB all-reduce on 2 Horovod workers: on the namespace's own loopback, then at 100 Mb/s.
    On this 2-core machine (2026-11-24, make bench's links section): about 5 ms unlimited, 673 ms at
    100 Mb/s, model 671 ms."""
    unlimited = links.EmulatedLink(None)
    slow = links.EmulatedLink(100e6)
    def seconds(link):  # the slower worker's mean of 5 timed all-reduces, after 2 untimed
        per_rank = launch.run_horovod(hvdtools.allreduce_times, 2, args=(MB4 // 4, 2, 5), link=link, echo=False, timeout=120)
        return max(statistics.mean(t) for t in per_rank)

    fast_s, slow_s = seconds(unlimited), seconds(slow)
    model_s = links.predicted_allreduce_s(MB4, 2, slow.rate_bps)
    assert slow_s > 4 * fast_s, (fast_s, slow_s)  # the link, not the CPU, sets the time
    # within a factor of 1.5 of the model, either way (TCP's and Gloo's overheads, the bucket's burst)
    assert model_s / 1.5 < slow_s < model_s * 1.5, (slow_s, model_s)
