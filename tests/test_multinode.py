"""multigpu.labs.lab4.multinode: the multi-node horovodrun command, read with Horovod's own parser, and the
2 x 2 rehearsal on one machine."""

from __future__ import annotations

import pytest

from multigpu.labs.lab4 import multinode
from multigpu.running import launch

GOOD = "horovodrun -np 8 -H node1:4,node2:4 --network-interface eth0 --hierarchical-allreduce python train.py --epochs 5"
HOSTFILE = "# two servers of 4 GPUs\nnode1 slots=4\n\nnode2 slots=4\n"


def problems(command: str, **kw) -> list[str]:
    return multinode.check_command(command, nodes=2, gpus_per_node=4, **kw)


@pytest.mark.parametrize("command", [
    GOOD,
    "horovodrun -np 8 --hostfile hosts.txt --network-interface ib0 --hierarchical-allreduce python train.py",
    "HOROVOD_HIERARCHICAL_ALLREDUCE=1 horovodrun --num-proc 8 --hosts 10.0.0.1:4,10.0.0.2:4 --network-interfaces eth0 -p 2222 python3 train.py",
    "/opt/venv/bin/horovodrun -np 8 -H node1:4,node2:4 --gloo --network-interface eth0 --hierarchical-allreduce /opt/venv/bin/python train.py",
])
def test_a_right_command_has_no_problem(command):
    assert problems(command, hostfile=HOSTFILE) == []


@pytest.mark.parametrize("command, expected", [
    ("horovodrun -np 8 --network-interface eth0 --hierarchical-allreduce python train.py", "name the 2 hosts"),
    ("horovodrun -np 8 -H node1:4 --network-interface eth0 --hierarchical-allreduce python train.py", "name 2 hosts, one per machine: 1 named (node1)"),
    ("horovodrun -np 4 -H node1:2,node2:2 --network-interface eth0 --hierarchical-allreduce python train.py",
     "as many slots as it has GPUs (4)"),
    ("horovodrun -np 4 -H node1:4,node2:4 --network-interface eth0 --hierarchical-allreduce python train.py",
     "set -np 8, not 4: 2 nodes x 4 GPUs is 8 workers"),
    ("horovodrun -H node1:4,node2:4 --network-interface eth0 --hierarchical-allreduce python train.py", "required: -np/--num-proc"),
    ("horovodrun -np 8 -H localhost:4,node2:4 --network-interface eth0 --hierarchical-allreduce python train.py",
     "use the nodes' names or addresses: localhost means a different machine on every node"),
    ("horovodrun -np 8 -H node1:4,node2:4 --hierarchical-allreduce python train.py", "name the network interface"),
    ("horovodrun -np 8 -H node1:4,node2:4 --network-interface lo --hierarchical-allreduce python train.py",
     "--network-interface lo never reaches another machine"),
    ("horovodrun -np 8 -H node1:4,node2:4 --network-interface eth0 python train.py", "--hierarchical-allreduce"),
    ("horovodrun -np 8 -H node1:4,node2:4 --network-interface eth0 --hierarchical-allreduce", "what every worker runs"),
    ("horovodrun -np 8 -H node1:4,node2:4 --network-interface eth0 --hierarchical-allreduce train.py",
     "run the training script with python"),
    ("horovodrun -np eight -H node1:4,node2:4 python train.py", "horovodrun would refuse it: "),
    ("horovodrun -np 8 -H node1:4,node2:4 --hostfile h python train.py", "not allowed with argument"),
    ("horovodrun -np 8 -H node1,node2 python train.py", "'<name>:<slots>'"),
    ("mpirun -np 8 python train.py", "start the command with horovodrun"),
    ("horovodrun -np 8 -H 'node1:4 python train.py", "cannot be split into words"),
])
def test_each_mistake_gets_its_own_message(command, expected):
    found = problems(command)
    assert any(expected in p for p in found), f"{command!r}: expected {expected!r} in {found}"


def test_a_host_file_is_read_as_horovodrun_reads_it(tmp_path):
    from horovod.runner.common.util import hosts as hvd_hosts

    clean = "node1 slots=4\nnode2 slots=4\n"
    path = tmp_path / "hosts"
    path.write_text(clean)
    theirs = dict(item.split(":") for item in hvd_hosts.parse_host_files(str(path)).split(","))
    assert multinode.parse_hostfile(clean) == {h: int(s) for h, s in theirs.items()} == {"node1": 4, "node2": 4}
    assert multinode.parse_hostfile(HOSTFILE) == {"node1": 4, "node2": 4}  # comments and blank lines too
    for wrong, message in [("node1 4\n", "write '<host> slots=<GPUs on it>'"), ("node1 slots=4\nnode1 slots=4\n", "named twice")]:
        with pytest.raises(multinode.CommandError, match=message):
            multinode.parse_hostfile(wrong)
    wrong_file = "horovodrun -np 8 --hostfile hosts.txt --network-interface eth0 --hierarchical-allreduce python train.py"
    assert problems(wrong_file, hostfile="node1 slots=8\n")[:2] == [
        "name 2 hosts, one per machine: 1 named (node1)",
        "give each host as many slots as it has GPUs (4), one worker per GPU: node1:8",
    ]
    assert "give its text too" in problems(wrong_file)[0]


def test_the_one_box_rehearsal_wants_the_machines_two_names():
    right = "horovodrun -np 4 -H localhost:2,127.0.0.1:2 --gloo --hierarchical-allreduce python train.py"
    assert multinode.check_command(right, nodes=2, gpus_per_node=2, one_box=True) == []
    assert any("name the one machine twice, as localhost and 127.0.0.1" in p for p in multinode.check_command(
        right.replace("127.0.0.1", "node2"), nodes=2, gpus_per_node=2, one_box=True))
    assert any("localhost and 127.0.0.1 mean a different machine" in p for p in problems(
        "horovodrun -np 8 -H localhost:4,127.0.0.1:4 --network-interface eth0 --hierarchical-allreduce python train.py"))


@pytest.mark.slow
def test_two_hosts_of_two_workers_on_one_machine():
    """``-H localhost:2,127.0.0.1:2``: Horovod sees 2 hosts of 2 workers (local and cross ranks as
    on a 2-node cluster) and an all-reduce spans all 4, with no SSH."""
    ranks = launch.run_horovod(multinode.where_am_i, 4, hosts=",".join(f"{h}:2" for h in multinode.ONE_BOX_HOSTS),
                               horovod_args=["--gloo"], echo=False, timeout=120)
    assert sorted(r[0] for r in ranks) == [0, 1, 2, 3]
    assert all(size == 4 and local_size == 2 and total == 6 for _, size, _, local_size, _, total in ranks)
    assert sorted((cross, local) for _, _, local, _, cross, _ in ranks) == [(0, 0), (0, 1), (1, 0), (1, 1)]
