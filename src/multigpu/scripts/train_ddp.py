"""The Lab 3 conversion done with PyTorch DDP instead of Horovod: same model, data and CLI.

Launch (every line that exists only for distribution carries a ``# DDP:`` comment)::

    torchrun --standalone --nproc-per-node=4 -m multigpu.scripts.train_ddp
    torchrun --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint=server1:29400 \\
        -m multigpu.scripts.train_ddp                                   # two nodes
    python -m multigpu.scripts.train_ddp                                # one worker

The command line is that of :mod:`multigpu.scripts.train_horovod` (see its docstring), with
``--fp16-allreduce`` done by DDP's ``fp16_compress_hook`` and no ``--without``. What differs
from Horovod: ``torchrun`` instead of ``horovodrun``; ``init_process_group`` instead of
``hvd.init``; wrapping the MODEL (``DistributedDataParallel``) instead of the optimizer; no
explicit broadcast (DDP copies rank 0's weights when it wraps the model, and the optimizer
state starts empty on every rank); metrics averaged with ``dist.all_reduce``. Gradients are
all-reduced in buckets (``bucket_cap_mb``, Horovod's fusion buffer) while backward runs.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from multigpu import data, devices, models
from multigpu import train as training
from multigpu.scripts.train_horovod import checksum, parse_args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.without:
        raise SystemExit("--without is a Horovod-script option (Lab 3, part 2)")
    rank = int(os.environ.get("RANK", "0"))  # DDP: torchrun sets RANK, WORLD_SIZE, LOCAL_RANK
    size = int(os.environ.get("WORLD_SIZE", "1"))  # DDP:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))  # DDP:
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # DDP:
    torch.set_num_threads(args.threads or devices.threads_per_worker(local_size))  # DDP: share the cores
    device = devices.worker_device(local_rank)  # DDP: GPU number local_rank in GPU mode
    dist.init_process_group(devices.detect().backend)  # DDP: NCCL on GPUs, Gloo on CPUs
    devices.pin_worker(local_rank, local_size)  # DDP: CPU mode: each worker on its own core
    torch.manual_seed(args.seed + rank)  # DDP: each rank its own augmentation and dropout

    if args.synthetic:
        train_set = data.SyntheticImages(args.synthetic, models.default_image_size(args.model), seed=args.seed)
        val_set = None
    else:
        root = args.data or data.ensure_dataset(
            train_per_class=args.train_per_class, val_per_class=args.val_per_class, progress=rank == 0
        )
        train_set, val_set = data.load_datasets(root, image_size=models.default_image_size(args.model))
    sampler = DistributedSampler(train_set, num_replicas=size, rank=rank, shuffle=True, seed=args.seed)  # DDP:
    train_loader = data.make_loader(train_set, args.batch_size, sampler=sampler, seed=args.seed)
    val_loader = data.make_loader(val_set, 256) if val_set is not None else None

    model = models.build_model(args.model, num_classes=len(train_set.classes)).to(device)
    ddp_model = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)  # DDP:
    if args.fp16_allreduce:  # DDP: Horovod's fp16 compression
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp_model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    optimizer = training.make_optimizer(model, args.base_lr)
    schedule = training.scaled_lr_schedule(  # DDP: learning rate x size, with warm-up
        args.base_lr, args.batch_size * size, args.batch_size, args.warmup_epochs
    )
    start_checksum = checksum(model)
    local: dict[str, list[float]] = {}

    def average(value: float, name: str) -> float:  # DDP: mean over ranks
        local.setdefault(name, []).append(float(value))
        t = torch.tensor(float(value), dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return float(t) / size

    cpu0, wall0 = time.process_time(), time.perf_counter()
    history = training.train(
        ddp_model, train_loader, val_loader,
        epochs=args.epochs, optimizer=optimizer, device=device, lr_schedule=schedule,
        sampler=sampler, rank=rank, world_size=size,  # DDP: rank 0 logs, throughput x size
        average=average, progress=not args.quiet, target_accuracy=args.target_accuracy,
        max_steps_per_epoch=args.max_steps,
    )
    out = Path(args.out if args.out != "runs/horovod" else "runs/ddp")
    out.mkdir(parents=True, exist_ok=True)
    if rank == 0:  # DDP: one writer
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": args.epochs},
                   out / "checkpoint.pt")
    if args.record:
        record = {
            "rank": rank, "size": size, "local_rank": local_rank, "local_size": local_size,
            "threads": torch.get_num_threads(), "device": str(device), "args": vars(args),
            "start_checksum": start_checksum, "final_checksum": checksum(model), "train_size": len(train_set),
            "local_metrics": local, "history": history, "cpu_s": time.process_time() - cpu0,
            "wall_s": time.perf_counter() - wall0, "time": time.time(), "pid": os.getpid(),
        }
        (out / f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()  # DDP:
    return history


if __name__ == "__main__":
    main()
