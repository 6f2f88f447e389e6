"""Which hardware mode the course runs in, and how one worker process should use it.

GPU mode (CUDA available): one worker process per GPU, NCCL for collectives.
CPU mode (no CUDA): each "GPU" is a worker process that runs with a single thread; Horovod's
collectives go over MPI (shared memory between one machine's workers), torch.distributed's over
Gloo. The same training code runs in both; only the helpers here differ.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MachineInfo:
    """What the course can use on this machine."""

    mode: str  #: ``"gpu"`` or ``"cpu"``
    cores: int  #: CPU cores this process may use
    gpus: int  #: visible CUDA devices
    gpu_names: tuple[str, ...]
    torch_version: str

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


def detect() -> MachineInfo:
    """Detect GPU or CPU mode. ``MULTIGPU_FORCE_CPU=1`` forces CPU mode on a GPU machine."""
    force_cpu = os.environ.get("MULTIGPU_FORCE_CPU", "") not in ("", "0")
    gpus = 0 if force_cpu or not torch.cuda.is_available() else torch.cuda.device_count()
    names = tuple(torch.cuda.get_device_name(i) for i in range(gpus))
    return MachineInfo(
        mode="gpu" if gpus else "cpu",
        cores=cpu_cores(),
        gpus=gpus,
        gpu_names=names,
        torch_version=torch.__version__,
    )


def ideal_factor(workers: int, info: MachineInfo | None = None) -> int:
    """Ideal speed-up of ``workers`` workers over one: ``min(workers, cores or GPUs)``.

    Throughput can only grow with the number of devices that really run in parallel; four
    worker processes on two cores can at best be twice as fast as one.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    info = info or detect()
    return max(1, min(workers, info.devices))


def worker_device(local_rank: int = 0, info: MachineInfo | None = None) -> torch.device:
    """The device of the worker with this local rank: its own GPU in GPU mode, else the CPU."""
    info = info or detect()
    if info.mode == "gpu":
        if not 0 <= local_rank < info.gpus:
            raise ValueError(
                f"local rank {local_rank} has no GPU: this machine has {info.gpus}. "
                "Start at most one worker per GPU."
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
    """One paragraph that tells a learner which mode is active and what it means for numbers."""
    info = info or detect()
    if info.mode == "gpu":
        text = (
            f"GPU mode: {info.gpus} CUDA device(s) ({', '.join(info.gpu_names)}), {info.cores} CPU cores. "
            "Each worker process drives one GPU; collectives use NCCL."
        )
    else:
        text = (
            f"CPU mode: no CUDA device, {info.cores} CPU cores. Each 'GPU' is a worker process "
            "with its own thread(s); Horovod's collectives use MPI (shared memory), torch.distributed's "
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
