"""Lab 4: the multi-node job as a Slurm batch script, checked before it is submitted.

On a cluster run by Slurm nobody types ``horovodrun -H node1:4,node2:4``: the nodes are not known
before the job starts, and the nodes do not let one SSH into another. The job asks for its shape
in ``#SBATCH`` lines (``--nodes=2``, ``--ntasks-per-node=4``, one task per GPU, ``--gres=gpu:4``)
and ``srun python train.py`` starts one worker per task on the nodes Slurm chose; Horovod's ranks
come from Slurm's variables (:mod:`multigpu.running.slurm` writes such a script and
:mod:`multigpu.running.slurm_job` maps the variables).

:func:`check_script` reads a learner's script the way ``sbatch`` reads it (``#SBATCH`` lines up to
the first command, each read with an argument parser of sbatch's options) and its ``srun`` line,
and returns what is wrong for a given shape, one message per mistake (an empty list: nothing).
"""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import dataclass, field

from multigpu.labs.lab4.multinode import CommandError


def options_parser(prog: str) -> argparse.ArgumentParser:
    """The options of sbatch (and srun) that decide where the tasks run and what they get."""
    parser = argparse.ArgumentParser(prog=prog, add_help=False, allow_abbrev=False)
    parser.add_argument("-N", "--nodes")
    parser.add_argument("-n", "--ntasks", type=int)
    parser.add_argument("--ntasks-per-node", type=int)
    parser.add_argument("--gres", action="append", default=[])
    parser.add_argument("-G", "--gpus")
    parser.add_argument("--gpus-per-node")
    parser.add_argument("-w", "--nodelist")
    return parser


@dataclass
class Script:
    """What a batch script asks for."""

    options: argparse.Namespace
    late_directives: list[str] = field(default_factory=list)  #: ``#SBATCH`` lines after the first command
    srun: list[list[str]] = field(default_factory=list)  #: each srun line's words after ``srun``
    horovodrun: list[str] = field(default_factory=list)  #: lines that call horovodrun or mpirun


def node_count(value: str | None) -> int | None:
    """``--nodes``: ``2`` or ``2-2`` (min-max); None where unset or a range of several counts."""
    if value is None:
        return None
    m = re.fullmatch(r"(\d+)(?:-(\d+))?", value)
    if not m or (m.group(2) and m.group(2) != m.group(1)):
        return None
    return int(m.group(1))


def gpus_asked(options: argparse.Namespace) -> int | None:
    """GPUs per node the options ask for (``--gres=gpu:4``, ``--gres=gpu:a100:4``, ``--gpus-per-node=4``)."""
    for gres in options.gres:
        for item in gres.split(","):
            m = re.fullmatch(r"gpu(?::[\w.-]*[A-Za-z][\w.-]*)?(?::(\d+))?", item)  # gpu[:type][:count]
            if m:
                return int(m.group(1) or 1)
    if options.gpus_per_node:
        return int(options.gpus_per_node.rsplit(":", 1)[-1])
    return None


def parse_script(text: str) -> Script:
    """Read a batch script as sbatch does. Raises :class:`CommandError` where sbatch would refuse it."""
    lines = re.sub(r"\\\n", " ", text).splitlines()  # a line ending in \ goes on in the next one
    if not lines or not lines[0].startswith("#!"):
        raise CommandError("start the script with #!/bin/bash: sbatch refuses a script without an interpreter line")
    directives: list[str] = []
    script = Script(argparse.Namespace())
    commands_began = False
    for raw in lines[1:]:
        line = raw.strip()
        if line.startswith("#SBATCH"):
            words = shlex.split(line[len("#SBATCH"):].split(" #", 1)[0])
            (script.late_directives if commands_began else directives).extend(words)
        elif line and not line.startswith("#"):
            commands_began = True
            names = [w.rsplit("/", 1)[-1] for w in shlex.split(line, comments=True)]
            # srun anywhere in the command: after exec or time, or as the command a wrapper runs
            # (multigpu.running.slurm's batch step: python -m multigpu.running.slurm_job launch -- srun ...)
            if "srun" in names:
                script.srun.append(shlex.split(line, comments=True)[names.index("srun") + 1:])
            if {"horovodrun", "mpirun", "mpiexec"} & set(names[:names.index("srun")] if "srun" in names else names):
                script.horovodrun.append(line)
    try:
        script.options, _ = options_parser("sbatch").parse_known_args(directives)
    except SystemExit:
        raise CommandError(f"sbatch would refuse the #SBATCH lines: {' '.join(directives)}") from None
    return script


def split_srun(words: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """An srun line's options (the ones :func:`options_parser` knows) and the program it runs."""
    at = 0
    while at < len(words) and words[at].startswith("-"):
        at += 1 if "=" in words[at] or words[at] in {"--kill-on-bad-exit", "-K", "-l", "--label"} else 2
    options, _ = options_parser("srun").parse_known_args(words[:at])
    return options, words[at:]


def check_script(text: str, *, nodes: int, gpus_per_node: int) -> list[str]:
    """What is wrong with the batch script ``text`` for a job on ``nodes`` machines with
    ``gpus_per_node`` GPUs each, one worker per GPU (an empty list: nothing)."""
    try:
        script = parse_script(text)
    except (CommandError, ValueError) as e:
        return [str(e)]
    o, problems = script.options, []
    if script.late_directives:
        problems.append(f"move {' '.join(script.late_directives)} above the first command: sbatch ignores #SBATCH "
                        "lines after it")
    if node_count(o.nodes) != nodes:
        problems.append(f"ask for {nodes} nodes: #SBATCH --nodes={nodes}" + (f", not {o.nodes}" if o.nodes else ""))
    if o.ntasks_per_node is None:
        uneven = f" (--ntasks={o.ntasks} lets Slurm put them unevenly)" if o.ntasks else ""
        problems.append(f"ask for one task per GPU on each node: #SBATCH --ntasks-per-node={gpus_per_node}{uneven}")
    elif o.ntasks_per_node != gpus_per_node:
        problems.append(f"one task per GPU: --ntasks-per-node={gpus_per_node}, not {o.ntasks_per_node}")
    if gpus_asked(o) != gpus_per_node:
        problems.append(f"ask for the {gpus_per_node} GPUs of each node: #SBATCH --gres=gpu:{gpus_per_node} "
                        "(or --gpus-per-node): without it the tasks see no GPU")
    if script.horovodrun:
        problems.append(f"let srun start the workers, not {shlex.split(script.horovodrun[0])[0]}: "
                        "it starts them over SSH, which the cluster's nodes do not allow, on hosts you do not know "
                        "before the job starts")
    if not script.srun:
        problems.append("start the workers with srun (srun python train.py): without it the script runs once, "
                        "on the first node only")
    for words in script.srun:
        problems += srun_problems(words, nodes, gpus_per_node)
    return problems


def srun_problems(words: list[str], nodes: int, gpus_per_node: int) -> list[str]:
    """What is wrong with one srun line (its words after ``srun``)."""
    options, program = split_srun(words)
    problems = []
    total = nodes * gpus_per_node
    if options.ntasks is not None and options.ntasks != total:
        problems.append(f"srun -n {options.ntasks} starts {options.ntasks} workers: leave -n out (the #SBATCH lines "
                        f"say {total}) or make it {total}")
    if options.ntasks_per_node is not None and options.ntasks_per_node != gpus_per_node:
        problems.append(f"srun --ntasks-per-node={options.ntasks_per_node}: one task per GPU is {gpus_per_node}")
    if not program:
        problems.append("end the srun line with what every worker runs, e.g. srun python train.py")
    elif program[0].rsplit("/", 1)[-1] in {"horovodrun", "mpirun"}:
        problems.append(f"srun {program[0]} would start {program[0]} in every task: srun python train.py")
    elif not re.search(r"python", program[0]) and program[0] != "-m":
        problems.append(f"run the training script with python: every task would run {program[0]!r}")
    return problems
