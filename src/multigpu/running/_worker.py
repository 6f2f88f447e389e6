"""Entry point of one worker process started by :mod:`multigpu.running.launch` (not for direct use).

    python -m multigpu.running._worker run     JOB OUTDIR   # torch.distributed worker, rank from RANK
    python -m multigpu.running._worker horovod JOB OUTDIR   # worker under horovodrun, rank from HOROVOD_RANK or PMI_RANK

JOB is a cloudpickled ``(fn, args, backend)``. The worker writes ``OUTDIR/rank<R>.pkl`` holding
``("ok", value)`` or ``("error", traceback)``, then exits 0 or 1.
"""

from __future__ import annotations

import datetime
import os
import sys
import traceback
from typing import Any

import cloudpickle


def _write(outdir: str, rank: int, record: tuple) -> None:
    path = os.path.join(outdir, f"rank{rank}.pkl")
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            cloudpickle.dump(record, f)
    except Exception:  # an unpicklable return value becomes an error record
        with open(tmp, "wb") as f:
            cloudpickle.dump(("error", "the worker's return value could not be pickled:\n" + traceback.format_exc()), f)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    kind, job, outdir = argv
    if kind == "run":
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    else:
        # horovodrun --gloo sets HOROVOD_RANK/_SIZE; mpirun (horovodrun over MPI) sets PMI_RANK/_SIZE
        rank = int(os.environ.get("HOROVOD_RANK", os.environ.get("PMI_RANK", "0")))
        world = int(os.environ.get("HOROVOD_SIZE", os.environ.get("PMI_SIZE", "1")))
    import torch

    from multigpu.core import devices

    threads = os.environ.get("MULTIGPU_THREADS")
    if threads is None:
        local = int(os.environ.get("HOROVOD_LOCAL_SIZE", os.environ.get("MPI_LOCALNRANKS",
                                                                        os.environ.get("LOCAL_WORLD_SIZE", "1"))))
        threads = str(devices.threads_per_worker(local))
    torch.set_num_threads(int(threads))

    dist: Any = None
    try:
        with open(job, "rb") as f:
            fn, args, backend = cloudpickle.load(f)
        if kind == "run" and backend:
            import torch.distributed as dist

            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            timeout = datetime.timedelta(seconds=float(os.environ.get("MULTIGPU_TIMEOUT", "120")))
            dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
            value = fn(rank, world, *args)
        elif kind == "run":
            value = fn(rank, world, *args)
        else:
            value = fn(*args)
        _write(outdir, rank, ("ok", value))
        return 0
    except BaseException:  # report everything, including SystemExit from learner code
        _write(outdir, rank, ("error", traceback.format_exc()))
        traceback.print_exc()
        return 1
    finally:
        if dist is not None and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
