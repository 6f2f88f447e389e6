"""The workshop hub on the real two-node Slurm test cluster (tests/slurm_cluster.py): JupyterHub with
``MULTIGPU_SPAWNER=slurm`` (multigpu.workshop.slurmhub, batchspawner's SlurmSpawner), each learner's
JupyterLab a Slurm job on a node. Real sbatch, squeue, scontrol and scancel, real JupyterHub,
JupyterLab and kernels; no mock.

The hub and its proxy run in the controller's network namespace (``mgt-ctl``), where the nodes'
addresses exist; the learners' HTTP calls start there too (``multigpu.workshop.netns``). As root
after `make cluster-deps` and `make hub-deps`: `make test-cluster`; elsewhere skipped with the reason.
"""

from __future__ import annotations

import contextlib
import html
import os
import pwd
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import slurm_cluster
from conftest import REPO
from multigpu.workshop import roomload, scratch
from multigpu.workshop.learnerclient import Learner, LearnerError

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PREFIX = Path(os.environ.get("MULTIGPU_HUB_PREFIX", "/opt/multigpu-hub"))
HUB_PY = PREFIX / "bin" / "python"


def why_not() -> str | None:
    why = slurm_cluster.why_unavailable()
    if why:
        return why
    if not HUB_PY.exists():
        return f"no hub environment at {PREFIX}: run `make hub-deps`"
    if not (PREFIX / "bin" / "batchspawner-singleuser").exists():
        return f"batchspawner is not installed in {PREFIX}: run `make hub-deps`"
    if not shutil.which("configurable-http-proxy"):
        return "configurable-http-proxy is not installed: run `make hub-deps`"
    return None


#: This module's cluster has namespaces of its own names (mgh-*), so that it never removes the
#: cluster of another test run on the same box (tests/test_cluster.py's mgt-*, which a start
#: removes as a leftover): the subnet and ports exist only inside each set of namespaces.
OWN_NAMES = {"CONTROLLER_NS": "mgh-ctl", "BRIDGE_NS": "mgh-br",
             "NODES": {name: (ns.replace("mgt-", "mgh-"), addr) for name, (ns, addr) in slurm_cluster.NODES.items()}}


@pytest.fixture(scope="module")
def own_names():
    """tests/slurm_cluster.py with this module's names and node memory, restored afterwards."""
    why = why_not()
    if why:
        pytest.skip(why)
    with pytest.MonkeyPatch.context() as names:
        for attr, value in OWN_NAMES.items():
            names.setattr(slurm_cluster, attr, value)
        # nodes that say how much memory they have (RealMemory, MB), so that a job's --mem can be met
        names.setattr(slurm_cluster, "slurm_conf", with_memory(slurm_cluster.slurm_conf))
        names.setattr(slurm_cluster, "NAMESPACES", (OWN_NAMES["CONTROLLER_NS"], *(ns for ns, _ in OWN_NAMES["NODES"].values()),
                                                    OWN_NAMES["BRIDGE_NS"]))
        yield
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    assert not [ns for ns in left if ns.startswith("mgh-")], left


#: Each test node's memory as slurm.conf declares it (without it Slurm takes 1 MB and refuses any --mem).
NODE_MEMORY_MB = 4096


def with_memory(conf):
    def written(root: Path) -> str:
        return conf(root).replace(" State=UNKNOWN", f" RealMemory={NODE_MEMORY_MB} State=UNKNOWN")
    return written


@contextlib.contextmanager
def cluster_up() -> Iterator[slurm_cluster.SlurmCluster]:
    """The test cluster, its folder open to the learners: their own sbatch reads slurm.conf and
    reaches munged's socket there, and each job's script, in the node's spool folder, runs as them
    (a real node's /var/spool/slurmd is 755 too)."""
    with slurm_cluster.SlurmCluster() as up:
        for folder in (up.root, up.root / "spool", *(up.root / "spool" / name for name in slurm_cluster.NODES)):
            os.chmod(folder, 0o755)
        yield up


def jobs(cluster) -> dict[str, dict[str, str]]:
    """The cluster's jobs by user: ``scontrol show job``'s fields of each."""
    shown = cluster.client("scontrol", "show", "job", "-o").stdout
    found = {}
    for line in shown.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "JobId" in fields:
            found[fields["UserId"].split("(")[0]] = fields
    return found


def visit(hub: scratch.ScratchHub, name: str, cells: list[str]) -> tuple[Learner, float]:
    """A learner logs in, waits for their server and runs Lab 0's first check in a kernel."""
    learner = Learner(hub.base, name, hub.learners[name])
    learner.login()
    learner.wait_ready(timeout=600)
    return learner, roomload.run_check(learner, cells)


def server_gone(learner: Learner, timeout: float) -> bool:
    """Whether the hub reports the learner's server stopped within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        me = learner.session.get(f"{learner.base}/hub/api/user", headers={"X-XSRFToken": learner._xsrf("/hub/")},
                                 timeout=30).json()
        if not me.get("servers"):
            return True
        time.sleep(1)
    return False


def start_again(learner: Learner) -> str:
    """The learner presses Start again; what the spawn page says when the start fails."""
    r = learner.session.post(f"{learner.base}/hub/api/users/{learner.name}/server",
                             headers={"X-XSRFToken": learner._xsrf("/hub/")}, timeout=120)
    # 500 when the start failed before the hub answered (a job that fails at once); the page's
    # progress events, which wait_ready follows, carry the learner's message
    assert r.status_code in (201, 202, 500), f"HTTP {r.status_code} {r.text[:300]}"
    with pytest.raises(LearnerError) as failed:
        learner.wait_ready(timeout=300)
    return str(failed.value)


def servers_left(cluster, names: list[str]) -> list[str]:
    """The learners' jobs Slurm still runs, and their servers' processes still on this box."""
    live = [f"job {j['JobId']} {j['JobState']}" for j in jobs(cluster).values() if j["JobState"] in ("RUNNING", "PENDING", "COMPLETING")]
    found = subprocess.run(["pgrep", "-a", "-u", ",".join(names), "-f", "jupyterhub-singleuser"], capture_output=True, text=True)
    return live + found.stdout.splitlines()


def test_three_learners_servers_run_as_slurm_jobs_and_a_cancelled_one_is_explained(own_names):
    """The hub's accounts and their homes (loop mounts) are made before the cluster: each node's
    daemon has a private mount namespace, which sees the mounts that existed when it started (on a
    real cluster the homes are on a file system every node mounts)."""
    began = time.monotonic()
    tag = f"mgs{os.getpid() % 100000}"
    names = [f"{tag}a", f"{tag}b", f"{tag}c"]
    settings = {"MULTIGPU_SPAWNER": "slurm", "MULTIGPU_SLURM_PREFIX": " ".join(slurm_cluster.SlurmCluster().prefix),
                "MULTIGPU_SLURM_PARTITION": "test",
                "MULTIGPU_HUB_CONNECT_IP": slurm_cluster.CONTROLLER_ADDR, "MULTIGPU_SLURM_POLL_S": "5",
                # 3 learners of one core on 2 nodes of 2 cores: every job runs at once
                "MULTIGPU_LEARNER_CPUS": "1", "MULTIGPU_LEARNER_MEM_GB": "1"}
    cells = roomload.check_cells(REPO)
    with scratch.scratch_hub(tag, names, python=str(HUB_PY), namespace=slurm_cluster.CONTROLLER_NS, start=False,
                             **settings) as hub, cluster_up() as cluster:
        hub.env["SLURM_CONF"] = str(cluster.conf)
        hub.start()
        try:
            print(f"hub up in {time.monotonic() - began:.0f} s")
            with ThreadPoolExecutor(len(names)) as pool:
                visits = dict(zip(names, pool.map(lambda n: hub.call(visit, hub, n, cells), names)))
            print("Lab 0's check, s:", {n: s for n, (_, s) in visits.items()})
            running = jobs(cluster)
            assert sorted(running) == names, running
            for name, job in running.items():
                assert job["JobState"] == "RUNNING" and job["NodeList"] in slurm_cluster.NODES, job
                assert job["NumCPUs"] == "1" and job["Partition"] == "test" and job["JobName"] == f"jupyter-{name}", job
            assert {job["NodeList"] for job in running.values()} == set(slurm_cluster.NODES), "both nodes serve learners"

            cancelled, job_id = names[0], running[names[0]]["JobId"]
            assert cluster.client("scancel", job_id).returncode == 0
            learner = visits[cancelled][0]
            assert hub.call(server_gone, learner, 120), f"the hub still reports {cancelled}'s server after scancel"
            page = hub.call(learner.session.get, f"{learner.user_url}/lab", timeout=60)
            said = re.search(r'<p id="slurm-ended">([^<]*)</p>', page.text)
            assert page.status_code == 424 and said, page.text[-2000:]
            message = html.unescape(said.group(1))
            assert f"Slurm job {job_id}" in message and "cancelled" in message, message
            print(f"{cancelled} reads: {message}")

            # a job that fails before its server answers (its home closed to it: it cannot chdir there)
            home = Path(pwd.getpwnam(cancelled).pw_dir)
            home.chmod(0o000)
            try:
                failed = hub.call(start_again, learner)
            finally:
                home.chmod(0o700)
            assert re.search(r"Slurm job \d+\) ended before JupyterLab started: it failed on its node", failed), failed
            print(f"{cancelled} reads: {failed}")

            for name in names[1:]:
                hub.call(visits[name][0].stop_server)
            deadline = time.monotonic() + 60
            while servers_left(cluster, names):
                assert time.monotonic() < deadline, f"servers still running after stop: {servers_left(cluster, names)}"
                time.sleep(1)
        except BaseException:
            print(hub.tail(8000))  # the hub's own account of what went wrong, the daemons' and the jobs' output
            print(cluster.logs(15))
            for name in names:
                for log in sorted(Path(pwd.getpwnam(name).pw_dir).glob(".jupyter-slurm-*.log")):
                    print(f"--- {log} ---\n{log.read_text(errors='replace')[-3000:]}")
            raise
    print(f"the hub on the cluster: {time.monotonic() - began:.0f} s")
