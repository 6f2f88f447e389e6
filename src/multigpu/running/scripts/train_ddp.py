"""The Lab 3 conversion done with PyTorch DDP instead of Horovod: same model, data and CLI.

Launch (every line that exists only for distribution carries a ``# DDP:`` comment)::

    torchrun --standalone --nproc-per-node=4 -m multigpu.running.scripts.train_ddp
    torchrun --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint=server1:29400 \\
        -m multigpu.running.scripts.train_ddp                                   # two nodes
    python -m multigpu.running.scripts.train_ddp                                # one worker

The command line is that of :mod:`multigpu.running.scripts.train_horovod` (see its docstring; the
shared part lives in :mod:`multigpu.running.scripts.common`, so this script runs without Horovod
installed), with ``--fp16-allreduce`` done by DDP's ``fp16_compress_hook``, no ``--without`` and
``--out`` defaulting to ``runs/ddp``. What differs
from Horovod: ``torchrun`` instead of ``horovodrun``; ``init_process_group`` instead of
``hvd.init``; wrapping the MODEL (``DistributedDataParallel``) instead of the optimizer; no
explicit broadcast (DDP copies rank 0's weights when it wraps the model, and the optimizer
state starts empty on every rank); metrics averaged with ``dist.all_reduce``. Gradients are
all-reduced in buckets (``bucket_cap_mb``, Horovod's fusion buffer) while backward runs.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from multigpu.core import data, devices, models, schedules, training
from multigpu.running import run_records
from multigpu.running.scripts import common


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/ddp")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))  # DDP: torchrun sets RANK, WORLD_SIZE, LOCAL_RANK
    size = int(os.environ.get("WORLD_SIZE", "1"))  # DDP:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))  # DDP:
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # DDP:
    torch.set_num_threads(args.threads or devices.threads_per_worker(local_size))  # DDP: share the cores
    device = devices.worker_device(local_rank)  # DDP: GPU number local_rank in GPU mode
    dist.init_process_group(devices.detect().backend)  # DDP: NCCL on GPUs, Gloo on CPUs
    devices.pin_worker(local_rank, local_size)  # DDP: CPU mode: each worker on its own core
    torch.manual_seed(args.seed + rank)  # DDP: each rank its own augmentation and dropout

    train_set, val_set = common.datasets(args, rank)
    sampler: DistributedSampler[int] = DistributedSampler(train_set, num_replicas=size, rank=rank, shuffle=True, seed=args.seed)  # DDP:
    train_loader = data.make_loader(train_set, args.batch_size, sampler=sampler, seed=args.seed)
    val_loader = data.make_loader(val_set, 256) if val_set is not None else None

    model = models.build_model(args.model, num_classes=len(train_set.classes)).to(device)
    ddp_model = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)  # DDP:
    if args.fp16_allreduce:  # DDP: Horovod's fp16 compression
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp_model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    optimizer = training.make_optimizer(model, args.base_lr)
    schedule = schedules.linear_scaling_schedule(  # DDP: learning rate x size, with warm-up
        args.base_lr, args.batch_size * size, args.batch_size, args.warmup_epochs
    )
    start_checksum = common.checksum(model)
    local: dict[str, list[float]] = {}

    def average(value: float, name: str) -> float:  # DDP: mean over ranks
        local.setdefault(name, []).append(float(value))
        t = torch.tensor(float(value), dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return float(t) / size

    clock = run_records.RunClock()
    history = training.train(
        ddp_model, train_loader, val_loader,
        epochs=args.epochs, optimizer=optimizer, device=device, lr_schedule=schedule,
        sampler=sampler, rank=rank, world_size=size,  # DDP: rank 0 logs, throughput x size
        average=average, progress=not args.quiet, target_accuracy=args.target_accuracy,
        max_steps_per_epoch=args.max_steps, stop_at_target=args.stop_at_target,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if rank == 0:  # DDP: one writer
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": args.epochs},
                   out / "checkpoint.pt")
    if args.record:
        run_records.write_record(out, rank, {
            "size": size, "local_rank": local_rank, "local_size": local_size,
            "threads": torch.get_num_threads(), "device": str(device), "args": vars(args),
            "start_checksum": start_checksum, "final_checksum": common.checksum(model), "train_size": len(train_set),
            "local_metrics": local, "history": history,
        }, clock)
    dist.destroy_process_group()  # DDP:
    return history


if __name__ == "__main__":
    main()
