"""The course's reference Horovod training script: AlexNet(Small) on 1..N workers.

Launch (every line that exists only for distribution carries a ``# Horovod:`` comment)::

    horovodrun -np 4 -H localhost:4 python -m multigpu.running.scripts.train_horovod
    horovodrun -np 8 -H server1:4,server2:4 python -m multigpu.running.scripts.train_horovod   # two nodes
    python -m multigpu.running.scripts.train_horovod                                          # one worker

GPU mode: one process per GPU (``hvd.local_rank()`` picks it), NCCL. CPU mode: each worker is a
process with ``cores // workers_per_node`` torch threads (at least 1), Gloo.

Command line (stable: Lab 3, its tests and the assessment rely on it):

    --epochs N            epochs (default 3)
    --batch-size B        images per worker per step (default 64); the global batch is B x workers
    --base-lr LR          learning rate of ONE worker at batch B (default 0.02); scaled by the
                          number of workers after a linear warm-up
    --warmup-epochs W     warm-up length in epochs (default 1.0; 0 = none)
    --data DIR            an ImageFolder root with train/ and val/ (default: the generated set)
    --train-per-class K / --val-per-class V   size of the generated set (default: the course's);
                          with --data, the first K (V) images of each class of that folder
    --synthetic N         train on N in-memory random images (compute-only timing, no validation)
    --max-steps S         at most S steps per epoch
    --model NAME          alexnet_small (default) or alexnet
    --target-accuracy A   validation accuracy that stops the time-to-accuracy clock (default 0.9)
    --stop-at-target      end the run after the epoch that reached it
    --seed S              seed (each rank adds its rank for its own augmentation and dropout)
    --threads T           torch threads per worker (default: cores shared among local workers)
    --fp16-allreduce      compress gradients to float16 for the all-reduce
    --out DIR             where rank 0 writes checkpoint.pt (default: runs/horovod)
    --record              every rank also writes its own DIR/rank<R>.json: the facts the checks
                          verify (weight checksums, data shard, learning rates, local and averaged
                          metrics)
    --without PIECE ...   leave pieces out to see what breaks (Lab 3, part 2): optimizer,
                          broadcast, sampler, lr-scaling
    --quiet               no progress bar

Two habits of saving: the checkpoint (step 8) is for resuming, so one copy is enough and rank 0
writes it; the record (step 9) is for checking the run, so every rank writes its own (its shard
and its metrics are its own; a checker compares the ranks, as the assessment's grader does with
every rank's weights and indices).

The nine functions between the two rulers below are the conversion steps the learner writes in
Lab 3; :func:`multigpu.running.hvdtools.compose_script` builds a script from this file with the learner's
versions of them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import horovod.torch as hvd  # Horovod: the PyTorch binding
import torch
from torch.utils.data import DistributedSampler

from multigpu.core import data, devices, models, schedules, training
from multigpu.running import run_records
from multigpu.running.scripts import common

PIECES = ("optimizer", "broadcast", "sampler", "lr-scaling")

# ---------------------------------------------------------------- the conversion steps (Lab 3)


def init_horovod() -> tuple[int, int, int]:
    """Step 1: start Horovod; return ``(rank, size, local_rank)``."""
    hvd.init()  # Horovod: connect to the other workers
    return hvd.rank(), hvd.size(), hvd.local_rank()


def worker_device(local_rank: int, local_size: int, threads: int | None = None) -> torch.device:
    """Step 2: one device per process (GPU ``local_rank``, or the CPU with a fair share of threads)."""
    # Horovod: in CPU mode the workers of one node share its cores: a fair share of threads each
    torch.set_num_threads(threads or devices.threads_per_worker(local_size))
    return devices.worker_device(local_rank)  # Horovod: GPU number local_rank in GPU mode


def make_train_loader(dataset, batch_size: int, seed: int = 0):
    """Step 3: each worker reads its own shard of the data; return ``(loader, sampler)``."""
    # Horovod: a disjoint 1/size of the data per rank, reshuffled each epoch by set_epoch
    sampler: DistributedSampler[int] = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=seed)
    return data.make_loader(dataset, batch_size, sampler=sampler, seed=seed), sampler


def lr_schedule(base_lr: float, warmup_epochs: float):
    """Step 4: learning rate scaled by the number of workers, reached by a linear warm-up."""
    # Horovod: the global batch is size x larger (Lab 1's rule: schedules.lr_at)
    return schedules.linear_scaling_schedule(base_lr, hvd.size(), 1, warmup_epochs)


def distribute_optimizer(optimizer, model, fp16: bool = False):
    """Step 5: average the gradients of all workers with all-reduce before every step."""
    compression = hvd.Compression.fp16 if fp16 else hvd.Compression.none
    # Horovod: wrap the optimizer; names identify each gradient's all-reduce
    return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=compression)


def broadcast_state(model, optimizer) -> None:
    """Step 6: every worker starts from rank 0's weights and optimizer state."""
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # Horovod: same initial weights
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)  # Horovod: same optimizer state


def average_metric(value: float, name: str) -> float:
    """Step 7: the mean of ``value`` over all workers (a named all-reduce)."""
    return float(hvd.allreduce(torch.tensor(float(value), dtype=torch.float64), name=name))  # Horovod: mean over ranks


def save_checkpoint(model, optimizer, epoch: int, path) -> bool:
    """Step 8: only rank 0 writes the checkpoint; return True where it was written."""
    if hvd.rank() != 0:  # Horovod: one writer, not size copies fighting over one file
        return False
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, path)
    return True


def save_record(record: dict, directory) -> Path:
    """Step 9: EVERY rank writes its own record ``directory/rank<R>.json``; return its path."""
    path = Path(directory) / f"rank{hvd.rank()}.json"  # Horovod: one file per rank, named by its rank
    path.write_text(json.dumps(record))
    return path


# ---------------------------------------------------------------- the script


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/horovod")
    p.add_argument("--without", nargs="*", default=[], choices=PIECES)
    return p.parse_args(argv)


def _accept_set_to_none(optimizer) -> None:
    """Horovod 0.28's DistributedOptimizer.zero_grad() takes no ``set_to_none`` (torch's default is
    already True): let :func:`multigpu.core.training.train` call it either way."""
    import inspect

    if "set_to_none" not in inspect.signature(optimizer.zero_grad).parameters:
        zero_grad = optimizer.zero_grad
        optimizer.zero_grad = lambda set_to_none=True: zero_grad()


def loaders(args: argparse.Namespace, train_set, val_set, rank: int) -> tuple[Any, Any, Any]:
    """The training loader with its sampler (step 3; without one, ``--without sampler``: every rank
    shuffles the whole set), and the validation loader (None without a validation set)."""
    if "sampler" in args.without:
        train_loader = data.make_loader(train_set, args.batch_size, shuffle=True, seed=args.seed + rank)
        sampler = None
    else:
        train_loader, sampler = make_train_loader(train_set, args.batch_size, args.seed)  # Horovod: step 3
    val_loader = None
    if val_set is not None:  # every rank evaluates the whole (small) validation set
        val_loader = data.make_loader(val_set, 256)
    return train_loader, sampler, val_loader


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    rank, size, local_rank = init_horovod()  # Horovod: step 1
    device = worker_device(local_rank, hvd.local_size(), args.threads)  # Horovod: step 2
    devices.pin_worker(local_rank, hvd.local_size())  # Horovod: CPU mode: each worker on its own core
    torch.manual_seed(args.seed + rank)  # Horovod: each rank its own augmentation and dropout

    train_set, val_set = common.datasets(args, rank)
    train_loader, sampler, val_loader = loaders(args, train_set, val_set, rank)  # Horovod: step 3

    model = models.build_model(args.model, num_classes=len(train_set.classes)).to(device)
    optimizer = training.make_optimizer(model, args.base_lr)
    if "lr-scaling" in args.without:
        schedule = schedules.constant(args.base_lr)
    else:
        schedule = lr_schedule(args.base_lr, args.warmup_epochs)  # Horovod: step 4
    if "optimizer" not in args.without:
        optimizer = distribute_optimizer(optimizer, model, args.fp16_allreduce)  # Horovod: step 5
    if "broadcast" not in args.without:
        broadcast_state(model, optimizer)  # Horovod: step 6
    start_checksum = common.checksum(model)
    _accept_set_to_none(optimizer)

    local: dict[str, list[float]] = {}
    shards: list[list[int]] = []

    def average(value: float, name: str) -> float:
        local.setdefault(name, []).append(float(value))
        return average_metric(value, name)  # Horovod: step 7

    def on_epoch_end(record: dict) -> None:
        if sampler is not None and args.record:
            shards.append([int(i) for i in sampler])  # the indices this rank trained on

    clock = run_records.RunClock()
    history = training.train(
        model, train_loader, val_loader,
        epochs=args.epochs, optimizer=optimizer, device=device, lr_schedule=schedule,
        sampler=sampler, rank=rank, world_size=size,  # Horovod: rank 0 logs, throughput x size
        average=average, progress=not args.quiet, target_accuracy=args.target_accuracy,
        max_steps_per_epoch=args.max_steps, stop_at_target=args.stop_at_target, on_epoch_end=on_epoch_end,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    saved = save_checkpoint(model, optimizer, args.epochs, out / "checkpoint.pt")  # Horovod: step 8
    if args.record:  # facts for the checks: every rank writes its own record
        save_record(run_records.make_record(rank, {
            "size": size, "local_rank": local_rank, "local_size": hvd.local_size(),
            "threads": torch.get_num_threads(), "device": str(device), "args": vars(args),
            "start_checksum": start_checksum, "final_checksum": common.checksum(model),
            "train_size": len(train_set), "shards": shards, "local_metrics": local, "saved_checkpoint": saved,
            "lr_after_warmup": schedule(max(args.warmup_epochs, 0.0) + 1e-9), "history": history,
        }, clock), out)  # Horovod: step 9
    return history


if __name__ == "__main__":
    main()
