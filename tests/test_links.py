"""multigpu.labs.lab4.links: Horovod jobs behind an emulated link (a rate-limited loopback in a namespace)."""

from __future__ import annotations

import pytest

from multigpu.labs.lab4 import links
from multigpu.running import launch

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
def test_a_slower_link_slows_the_training_step_as_the_model_says(tmp_path):
    """Lab 4's runs: the course's Horovod script on 2 workers, on the namespace's own loopback and at
    200 Mb/s. The link is slow enough that its time sets the step on a busy machine too: both
    workers' ring bytes of one step need 1.8 s at 200 Mb/s, about ten times the quiet 2-core
    machine's compute step (docs/performance.md). At 1 Gb/s (0.36 s) a busy machine's slower
    backward hides the link behind it, and a ratio there measures the load, not the link. A link
    that is not slowed fails both checks: its step is the unlimited one, far below the model's."""
    rate = 200e6
    unlimited = links.measure_step(2, None, out=tmp_path, timeout=120)
    slow = links.measure_step(2, rate, out=tmp_path, timeout=120)
    assert unlimited["emulated"] and slow["link"] == "200 Mb/s" and slow["workers"] == 2
    link_s = links.predicted_allreduce_s(links.gradient_bytes(), 2, rate)
    model_s = unlimited["step_s"] + link_s
    assert slow["step_s"] > 1.5 * unlimited["step_s"], (unlimited, slow)  # the link, not the CPU, sets the time
    assert slow["images_per_s"] < unlimited["images_per_s"] / 1.5, (unlimited, slow)
    # within the factor the lab states, either way (the overlap of backward and all-reduce, TCP, the bucket)
    assert model_s / links.MODEL_FACTOR < slow["step_s"] < model_s * links.MODEL_FACTOR, (slow["step_s"], model_s)


@pytest.mark.slow
def test_without_namespaces_the_lab_measures_the_machines_loopback_and_refuses_a_link(tmp_path, monkeypatch):
    """Where user namespaces are not allowed, Lab 4 still measures its unlimited runs (the machine's own
    loopback, Gloo) and a limited link raises with the reason, which the notebook prints: never silent."""
    monkeypatch.setattr(links, "unavailable", lambda: "user namespaces are not allowed here (test)")
    with pytest.raises(RuntimeError, match="not allowed here"):
        links.measure_step(2, 1e9, out=tmp_path)
    row = links.measure_step(2, None, out=tmp_path, timeout=120)
    assert row["emulated"] is False and row["link"] == "unlimited loopback" and row["step_s"] > 0
