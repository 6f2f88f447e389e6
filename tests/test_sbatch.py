"""multigpu.labs.lab4.sbatch: Lab 4's multi-node job as a Slurm batch script, read as sbatch reads
it, one message per mistake."""

from __future__ import annotations

import pytest

from multigpu.labs.lab4 import sbatch
from multigpu.running import slurm

GOOD = "#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=4\n#SBATCH --gres=gpu:4  # one per task\nsrun python train.py --epochs 5\n"


def problems(script: str) -> list[str]:
    return sbatch.check_script(script, nodes=2, gpus_per_node=4)


@pytest.mark.parametrize("script", [
    GOOD,
    "#!/bin/bash\n#SBATCH -N 2\n#SBATCH --ntasks-per-node 4\n#SBATCH --gpus-per-node=a100:4\n# a comment\n"
    "module load cuda\nexec srun --kill-on-bad-exit=1 -l python3 -m train\n",
    "#!/bin/bash\n#SBATCH --nodes=2-2 --ntasks-per-node=4 --gres=gpu:v100:4 -t 01:00:00 -J train\n"
    "srun -n 8 \\\n    /opt/venv/bin/python train.py\n",
    # what multigpu.running.slurm writes: srun behind the batch step that serves the rendezvous
    slurm.batch_script(["python", "train.py"], nodes=2, tasks_per_node=4, sbatch_options=["--gres=gpu:4"]),
    slurm.batch_script(["python", "train.py"], nodes=2, tasks_per_node=4, form="torch", sbatch_options=["--gpus-per-node=4"]),
])
def test_a_right_script_has_no_problem(script):
    assert problems(script) == []


@pytest.mark.parametrize("script, expected", [
    (GOOD.replace("--nodes=2", "--nodes=1"), "ask for 2 nodes: #SBATCH --nodes=2, not 1"),
    (GOOD.replace("--nodes=2 ", ""), "ask for 2 nodes: #SBATCH --nodes=2"),
    (GOOD.replace("--nodes=2", "--nodes=1-2"), "ask for 2 nodes: #SBATCH --nodes=2, not 1-2"),
    (GOOD.replace("--ntasks-per-node=4", "--ntasks-per-node=1"), "one task per GPU: --ntasks-per-node=4, not 1"),
    (GOOD.replace("--ntasks-per-node=4", "--ntasks=8"), "--ntasks-per-node=4 (--ntasks=8 lets Slurm put them unevenly)"),
    (GOOD.replace("#SBATCH --gres=gpu:4  # one per task\n", ""), "ask for the 4 GPUs of each node: #SBATCH --gres=gpu:4"),
    (GOOD.replace("gpu:4", "gpu:2"), "ask for the 4 GPUs of each node"),
    (GOOD.replace("srun python", "python"), "start the workers with srun"),
    (GOOD.replace("srun python train.py", "horovodrun -np 8 -H node1:4,node2:4 python train.py"),
     "let srun start the workers, not horovodrun: it starts them over SSH"),
    (GOOD.replace("srun python", "srun horovodrun -np 8 python"), "srun horovodrun would start horovodrun in every task"),
    (GOOD.replace("srun python", "srun -n 4 python"), "srun -n 4 starts 4 workers: leave -n out (the #SBATCH lines say 8)"),
    (GOOD.replace("srun python", "srun --ntasks-per-node=2 python"), "srun --ntasks-per-node=2: one task per GPU is 4"),
    (GOOD.replace("srun python train.py --epochs 5", "srun"), "end the srun line with what every worker runs"),
    (GOOD.replace("srun python", "srun"), "run the training script with python: every task would run 'train.py'"),
    (GOOD.replace("#SBATCH --gres=gpu:4  # one per task\nsrun python train.py --epochs 5\n",
                  "srun python train.py\n#SBATCH --gres=gpu:4\n"), "move --gres=gpu:4 above the first command"),
    (GOOD.replace("#!/bin/bash\n", ""), "start the script with #!/bin/bash"),
    (GOOD.replace("--ntasks-per-node=4", "--ntasks-per-node=four"), "sbatch would refuse the #SBATCH lines"),
])
def test_each_mistake_gets_its_own_message(script, expected):
    found = problems(script)
    assert any(expected in p for p in found), f"{script!r}: expected {expected!r} in {found}"


def test_a_script_with_several_mistakes_gets_each_once():
    script = "#!/bin/bash\n#SBATCH --nodes=1 --ntasks=8\nhorovodrun -np 8 -H node1:4,node2:4 python train.py\n"
    assert [p.split(":")[0] for p in problems(script)] == [
        "ask for 2 nodes", "ask for one task per GPU on each node", "ask for the 4 GPUs of each node",
        "let srun start the workers, not horovodrun", "start the workers with srun (srun python train.py)"]
