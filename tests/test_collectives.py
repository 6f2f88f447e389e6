"""multigpu.labs.lab5.collectives: Horovod's collectives on CPU workers."""

from __future__ import annotations

import pytest

from multigpu.labs.lab5 import collectives


@pytest.mark.slow
@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_every_collective_zero_could_use_works_on_cpu_workers(controller):
    from multigpu.running import launch

    if controller == "mpi" and launch.horovod_controller() != "mpi":
        pytest.skip("Horovod was built without MPI here")
    got = collectives.collectives(controller)
    assert set(got) >= {"allreduce", "reducescatter", "allgather", "grouped_allreduce", "grouped_reducescatter",
                        "grouped_allgather", "allreduce in a process set"}
    assert all(v == "ok" for v in got.values()), got
