"""Cheating and broken conversions, made from the reference by a small table of edits.

Each variant is the reference solution (``solutions/assessments/train.py``) with a few lines
changed, so it stays in step with the reference; :func:`write` fails loudly when an edit no longer
applies. The tests and ``multigpu calibrate`` grade the same variants.

========================  =====================================================  ==================
variant                   what it does                                            must fail
========================  =====================================================  ==================
``never_averaged``        each rank trains alone on its shard (no                 identical, sharded
                          DistributedOptimizer) and broadcasts rank 0's weights
                          just before every save: identical checkpoints
``all_data_each_rank``    every rank trains on ALL the data (gradients averaged)   throughput
                          but reports a disjoint quarter of the indices
``straggler``             rank 1 sleeps 1 s every step                            throughput
``rank0_saves_only``      Lab 3's habit: only rank 0 saves a checkpoint           workers
``rank0_trains_alone``    rank 0 trains on ALL the data alone, the other ranks    identical, sharded
                          idle; each rank reports a disjoint quarter of the
                          indices and rank 0's weights are broadcast before
                          every save: one worker's work, dressed up as four
``ddp_under_horovodrun``  torch DDP instead of Horovod, set up from what          identical, sharded
                          horovodrun gives each worker: it trains correctly
                          (identical weights, sharded data, gradients averaged
                          by DDP), but Horovod averaged nothing
========================  =====================================================  ==================

``ddp_under_horovodrun`` reads ``HOROVOD_RANK``, ``HOROVOD_SIZE``, ``HOROVOD_LOCAL_RANK`` and
``HOROVOD_LOCAL_SIZE`` (horovodrun sets them for every worker, with ``HOROVOD_HOSTNAME``,
``HOROVOD_CROSS_RANK``/``_SIZE``, ``HOROVOD_CONTROLLER=gloo`` and its rendezvous address
``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``_PORT``) and opens torch's TCP store on 127.0.0.1 at the port
after horovodrun's rendezvous port: one every worker derives alike, free in the sandbox's own
network namespace (and almost surely outside it). It never calls ``hvd.init()``.
"""

from __future__ import annotations

from pathlib import Path

SAVE = "        save_checkpoint(args.checkpoint_dir, model, epoch, rank, trained_on)"
DISTRIBUTE = "    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())\n"
LOADER = "    train_loader = data.make_loader(train_set, args.batch_size, sampler=sampler)"
RECORD = "            trained_on.extend(index.tolist())"
STEP = "            optimizer.step()\n"
IMPORT = "import horovod.torch as hvd  # Horovod: the PyTorch binding\n"
INIT = ("    hvd.init()  # Horovod: connect to the other workers\n"
        "    rank, workers = hvd.rank(), hvd.size()  # Horovod\n"
        "    device = devices.worker_device(hvd.local_rank())  # Horovod: one GPU per worker (CPU mode: the CPU)\n")
THREADS = "devices.threads_per_worker(hvd.local_size())"
PIN = "devices.pin_worker(hvd.local_rank(), hvd.local_size())"
BROADCAST = ("    hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n"
             "    hvd.broadcast_optimizer_state(optimizer, root_rank=0)\n")
FORWARD = "loss_fn(model(images), labels)"
VAL_COUNTS = ('    counts = hvd.allreduce(torch.tensor([correct, total], dtype=torch.float64), op=hvd.Sum, '
              'name="val_counts")\n')

#: variant -> {old text of the reference: new text}
EDITS: dict[str, dict[str, str]] = {
    "never_averaged": {
        DISTRIBUTE: "",
        SAVE: "        hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n" + SAVE,
    },
    "all_data_each_rank": {
        LOADER: "    train_loader = data.make_loader(train_set, args.batch_size, shuffle=True)",
        RECORD: "            trained_on.extend(i for i in index.tolist() if i % workers == rank)",
    },
    "straggler": {
        STEP: STEP + "            if rank == 1:\n                __import__('time').sleep(1.0)\n",
    },
    "rank0_saves_only": {
        SAVE: "        if rank == 0:\n    " + SAVE,
    },
    "rank0_trains_alone": {
        DISTRIBUTE: "",
        LOADER: "    train_loader = data.make_loader(train_set, args.batch_size, shuffle=True) if rank == 0 else []",
        RECORD: "            trained_on.extend(i for i in index.tolist() if i % workers == rank)",
        SAVE: ("        if rank != 0:  # the idle ranks report the rest of the data, disjoint\n"
               "            trained_on = [i for i in range(len(train_set)) if i % workers == rank]\n"
               "        hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n" + SAVE),
    },
    "ddp_under_horovodrun": {
        IMPORT: "import torch.distributed as dist  # torch DDP, launched by horovodrun\n",
        INIT: ("    env = os.environ  # what horovodrun gives every worker\n"
               "    rank, workers = int(env['HOROVOD_RANK']), int(env['HOROVOD_SIZE'])\n"
               "    device = devices.worker_device(int(env['HOROVOD_LOCAL_RANK']))\n"
               "    port = int(env['HOROVOD_GLOO_RENDEZVOUS_PORT']) + 1  # the same on every worker\n"
               "    backend = 'nccl' if device.type == 'cuda' else 'gloo'\n"
               "    store = f'tcp://127.0.0.1:{port}'\n"
               "    dist.init_process_group(backend, init_method=store, rank=rank, world_size=workers)\n"),
        THREADS: "devices.threads_per_worker(int(os.environ['HOROVOD_LOCAL_SIZE']))",
        PIN: "devices.pin_worker(int(os.environ['HOROVOD_LOCAL_RANK']), int(os.environ['HOROVOD_LOCAL_SIZE']))",
        DISTRIBUTE: ("    # averages the gradients in backward; broadcasts rank 0's weights now\n"
                     "    ddp = torch.nn.parallel.DistributedDataParallel(\n"
                     "        model, device_ids=[device.index] if device.type == 'cuda' else None)\n"),
        BROADCAST: "",
        FORWARD: "loss_fn(ddp(images), labels)",
        VAL_COUNTS: ("    counts = torch.tensor([correct, total], dtype=torch.float64, device=device)\n"
                     "    dist.all_reduce(counts)  # a sum over the workers\n"),
    },
}

#: variant -> the criterion it must fail
MUST_FAIL: dict[str, str] = {
    "never_averaged": "identical",
    "all_data_each_rank": "throughput",
    "straggler": "throughput",
    "rank0_saves_only": "workers",
    "rank0_trains_alone": "identical",
    "ddp_under_horovodrun": "identical",
}


def write(name: str, reference: Path, dest: Path) -> Path:
    """Write variant ``name`` of ``reference`` to ``dest`` (a file path); returns ``dest``."""
    source = Path(reference).read_text()
    for old, new in EDITS[name].items():
        if old not in source:
            raise ValueError(f"variant {name}: the reference no longer contains {old.strip()!r}: update the edit")
        source = source.replace(old, new)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if source.startswith('"""'):  # say so in the docstring (a second one would break `from __future__`)
        source = f'"""BROKEN VARIANT {name} (multigpu.grading.variants) of the ' + source[3:]
    dest.write_text(source)
    return dest
