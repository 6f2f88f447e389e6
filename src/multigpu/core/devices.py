"""Which hardware mode the course runs in, and how one worker process should use it.

GPU mode (CUDA available): one worker process per GPU, NCCL for collectives.
CPU mode (no CUDA): each "GPU" is a worker process that runs with a single thread; Horovod's
collectives go over MPI (shared memory between one machine's workers; Gloo where Horovod or the
environment lacks MPI), torch.distributed's over Gloo. The same training code runs in both; only
the helpers here differ.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class MachineInfo:
    """What the course can use on this machine."""

    mode: str  #: ``"gpu"`` or ``"cpu"``
    cores: int  #: CPU cores this process may use
    gpus: int  #: visible CUDA devices
    gpu_names: tuple[str, ...]
    torch_version: str
    #: GPUs present but not used: CPU mode forced (``MULTIGPU_FORCE_CPU=1``, or :func:`use` on a
    #: machine with fewer GPUs than the job's workers)
    idle_gpus: int = 0

    @property
    def devices(self) -> int:
        """How many workers can run truly in parallel: GPUs in GPU mode, cores in CPU mode."""
        return self.gpus if self.mode == "gpu" else self.cores

    @property
    def backend(self) -> str:
        """The torch.distributed backend that fits the mode."""
        return "nccl" if self.mode == "gpu" else "gloo"


def cpu_cores() -> int:
    """Cores this process may run on (respects taskset/cgroup affinity, not just the host)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


FORCE_CPU = "MULTIGPU_FORCE_CPU"


def cpu_forced(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``env`` (default: this process's) sets ``MULTIGPU_FORCE_CPU`` (to anything but 0)."""
    return (os.environ if env is None else env).get(FORCE_CPU, "") not in ("", "0")


def detect() -> MachineInfo:
    """Detect GPU or CPU mode. ``MULTIGPU_FORCE_CPU=1`` forces CPU mode on a GPU machine."""
    present = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpus = 0 if cpu_forced() else present
    return MachineInfo(
        mode="gpu" if gpus else "cpu",
        cores=cpu_cores(),
        gpus=gpus,
        gpu_names=tuple(torch.cuda.get_device_name(i) for i in range(gpus)),
        torch_version=torch.__version__,
        idle_gpus=present - gpus,
    )


def for_workers(workers: int, info: MachineInfo | None = None) -> MachineInfo:
    """The mode a job of ``workers`` workers on this machine runs in.

    GPU mode gives each worker its own GPU, so it needs at least as many GPUs as workers. With
    fewer (a 1-3 GPU machine and a 4-worker lab) the job runs as on a machine without a GPU: CPU
    workers, Gloo/MPI, each "GPU" a process. Mixing (some workers on GPUs, some on CPUs) would
    make every worker wait for the slowest and every ratio meaningless."""
    info = info or detect()
    return as_cpu(info) if info.mode == "gpu" and workers > info.gpus else info


def as_cpu(info: MachineInfo) -> MachineInfo:
    """``info`` in CPU mode: what workers see with ``MULTIGPU_FORCE_CPU=1`` (its GPUs idle)."""
    return replace(info, mode="cpu", gpus=0, gpu_names=(), idle_gpus=info.idle_gpus + info.gpus)


def job_env(workers: int, info: MachineInfo | None = None) -> dict[str, str]:
    """The environment a job of ``workers`` workers needs for :func:`for_workers`'s mode:
    ``{"MULTIGPU_FORCE_CPU": "1"}`` where that mode is CPU on a GPU machine, else nothing."""
    info = info or detect()
    return {FORCE_CPU: "1"} if for_workers(workers, info).mode != info.mode else {}


def use(workers: int) -> MachineInfo:
    """Choose the mode for a notebook whose jobs run up to ``workers`` workers, once, at its top.

    Where :func:`for_workers` says CPU on this GPU machine, sets ``MULTIGPU_FORCE_CPU=1`` in this
    process (its workers inherit it), so every run of the notebook (one worker or ``workers``)
    uses the same kind of device and its ratios compare like with like; :func:`describe` then
    says why the GPUs sit idle. Returns the chosen mode's :class:`MachineInfo`."""
    os.environ.update(job_env(workers))
    return detect()


def ideal_factor(workers: int, info: MachineInfo | None = None) -> int:
    """Ideal speed-up of ``workers`` workers over one: ``min(workers, cores or GPUs)``.

    Throughput can only grow with the number of devices that really run in parallel; four
    worker processes on two cores can at best be twice as fast as one.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    info = for_workers(workers, info)
    return max(1, min(workers, info.devices))


def worker_device(local_rank: int = 0, info: MachineInfo | None = None) -> torch.device:
    """The device of the worker with this local rank: its own GPU in GPU mode, else the CPU."""
    info = info or detect()
    if info.mode == "gpu":
        if not 0 <= local_rank < info.gpus:
            raise ValueError(
                f"local rank {local_rank} has no GPU: this machine has {info.gpus}. "
                f"Start at most one worker per GPU, or set {FORCE_CPU}=1 to run every worker on the CPU."
            )
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def threads_per_worker(workers_per_node: int, info: MachineInfo | None = None) -> int:
    """Intra-op threads each worker should use so that workers do not fight over cores.

    One worker alone may use every core. Several workers in CPU mode each get
    ``cores // workers`` threads (at least one): oversubscribed threads spin and wreck
    throughput. In GPU mode the CPU only feeds the GPU, so the cores are shared the same way.
    """
    info = info or detect()
    return max(1, info.cores // max(1, workers_per_node))


def pin_worker(local_rank: int, local_size: int, info: MachineInfo | None = None) -> int | None:
    """CPU mode: pin every thread of this worker to one core, ``local_rank % cores``.

    Without pinning the kernel moves workers (and their communication threads) between cores,
    so two workers can share one core while the other idles for a moment, and each move costs
    cache. Pinned, worker R always runs on core R (with more workers than cores, workers
    R and R + cores share one). Threads started later inherit the pin. Returns the core, or
    None where nothing was pinned: GPU mode, a single worker (it may use every core), or
    ``MULTIGPU_PIN=0`` (to measure the difference).
    """
    info = info or detect()
    if info.mode != "cpu" or local_size < 2 or os.environ.get("MULTIGPU_PIN", "1") == "0":
        return None
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return None
    core = cores[local_rank % len(cores)]
    for tid in os.listdir("/proc/self/task"):  # every thread that exists already (Horovod's, Gloo's)
        try:
            os.sched_setaffinity(int(tid), {core})
        except OSError:  # a thread that ended meanwhile
            pass
    return core


def describe(workers: int | None = None, info: MachineInfo | None = None) -> str:
    """One paragraph that tells a learner which mode is active (for a job of ``workers`` workers:
    :func:`for_workers`) and what it means for numbers."""
    info = info or detect()
    if workers is not None:
        info = for_workers(workers, info)
    if info.mode == "gpu":
        text = (
            f"GPU mode: {info.gpus} CUDA device(s) ({', '.join(info.gpu_names)}), {info.cores} CPU cores. "
            "Each worker process drives one GPU; collectives use NCCL."
        )
    elif info.idle_gpus:
        text = (
            f"CPU mode on a machine with {info.idle_gpus} GPU(s): {info.cores} CPU cores. "
            + (f"{workers} workers need {workers} GPUs (one each), so " if workers and workers > info.idle_gpus
               else f"{FORCE_CPU}=1 is set, so ")
            + "every worker runs on the CPU, as on a machine without a GPU, and the GPUs stay idle "
            "(mixing GPU and CPU workers would make every ratio meaningless). Each 'GPU' is a worker process "
            "with its own thread(s); Horovod's collectives use MPI (Gloo where MPI is missing), torch.distributed's Gloo."
        )
    else:
        text = (
            f"CPU mode: no CUDA device, {info.cores} CPU cores. Each 'GPU' is a worker process "
            "with its own thread(s); Horovod's collectives use MPI (shared memory; Gloo where MPI is missing), "
            "torch.distributed's "
            "Gloo. Absolute speeds are far below a GPU's; "
            "the lessons are in the ratios."
        )
    if workers is not None:
        text += (
            f" Ideal speed-up of {workers} workers here: x{ideal_factor(workers, info)} "
            f"(min({workers}, {info.devices}))."
        )
    return text


def horovod_build() -> dict[str, bool | str]:
    """What the installed Horovod was built with (no processes started, nothing initialised).

    Keys: ``installed``, ``version``, ``pytorch``, ``gloo``, ``mpi``, ``nccl``. A course machine
    needs ``pytorch`` and ``gloo``; ``nccl`` only matters in GPU mode.
    """
    try:
        import horovod
        import horovod.torch as hvd
    except ImportError as exc:
        return {"installed": False, "version": "", "pytorch": False, "gloo": False, "mpi": False,
                "nccl": False, "error": str(exc)}
    return {
        "installed": True,
        "version": horovod.__version__,
        "pytorch": True,
        "gloo": bool(hvd.gloo_built()),
        "mpi": bool(hvd.mpi_built()),
        "nccl": bool(hvd.nccl_built()),
    }
