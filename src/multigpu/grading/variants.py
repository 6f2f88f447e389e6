"""Cheating and broken conversions, made from the reference by a small table of edits.

Each variant is the reference solution (``solutions/assessments/train.py``) with a few lines
changed, so it stays in step with the reference; :func:`write` fails loudly when an edit no longer
applies. One variant is no edit: ``unconverted`` is the learners' starter itself (:data:`SOURCES`).
The tests and ``multigpu calibrate`` grade the same variants.

Cheats and broken conversions (:data:`CALIBRATED`: ``multigpu calibrate`` grades them, each must
fail on every profile):

============================  =================================================  ==================
variant                       what it does                                       must fail
============================  =================================================  ==================
``unconverted``               the starter, not converted at all: horovodrun      workers
                              runs 4 independent copies that all save as rank 0
``no_distributed_optimizer``  no ``hvd.DistributedOptimizer``: every rank        identical
                              trains its own model on its shard
``no_broadcast``              no broadcast of rank 0's initial state: every      identical
                              rank starts from its own random weights
``no_sampler``                no ``DistributedSampler``: every rank trains on    sharded
                              the whole training set, shuffled by its rank
``fake_metrics``              trains 1 step per epoch yet claims its whole       accuracy
                              shard, prints a fake accuracy and writes a fake
                              ``metrics.json``
``never_averaged``            each rank trains alone on its shard (no            identical, sharded
                              DistributedOptimizer) and broadcasts rank 0's
                              weights just before every save: identical
                              checkpoints
``all_data_each_rank``        every rank trains on ALL the data (gradients       throughput
                              averaged) but reports a disjoint quarter of the
                              indices
``straggler``                 rank 1 sleeps 1 s every step                       throughput
``rank0_saves_only``          Lab 3's habit: only rank 0 saves a checkpoint      workers
``rank0_trains_alone``        rank 0 trains on ALL the data alone, the other     identical, sharded
                              ranks idle; each rank reports a disjoint quarter
                              of the indices and rank 0's weights are broadcast
                              before every save: one worker's work, dressed up
                              as four
``ddp_under_horovodrun``      torch DDP instead of Horovod, set up from what     identical, sharded
                              horovodrun gives each worker: it trains correctly
                              (identical weights, sharded data, gradients
                              averaged by DDP), but Horovod averaged nothing
============================  =================================================  ==================

Failure cases (:data:`FAILURE_CASES`: no cheats; the grader must survive them and fail
``workers`` with a message that says what happened, within bounded time and output; the tests
grade them, the calibration does not):

============================  =================================================  ==================
variant                       what it does                                       must fail
============================  =================================================  ==================
``crash``                     rank 1 raises an exception in epoch 2 (its peers   workers
                              then lose their connection)
``hang``                      rank 1 sleeps forever in epoch 2; the other ranks  workers
                              wait for it in the gradient all-reduce
``huge_output``               every rank prints without end in epoch 1           workers
``syntax_error``              a missing closing parenthesis: it does not         workers
                              compile (:func:`write` writes it all the same)
============================  =================================================  ==================

``ddp_under_horovodrun`` reads its rank, the world size, its local rank and the local size from
what the launcher gives every worker: ``mpirun`` (horovodrun's default where Horovod has MPI) sets
``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID`` and ``MPI_LOCALNRANKS``; ``horovodrun --gloo`` sets
``HOROVOD_RANK``, ``HOROVOD_SIZE``, ``HOROVOD_LOCAL_RANK`` and ``HOROVOD_LOCAL_SIZE`` (with its
rendezvous address ``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``_PORT``). It opens torch's TCP store on
127.0.0.1 at a port every worker derives alike (after Gloo's rendezvous port, else a fixed one),
free in the sandbox's own network namespace. It never calls ``hvd.init()``.
"""

from __future__ import annotations

from pathlib import Path

SAVE = "        save_checkpoint(args.checkpoint_dir, model, epoch, rank, trained_on)"
DISTRIBUTE = "    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())\n"
SAMPLER = "    sampler = DistributedSampler(train_set, num_replicas=workers, rank=rank, shuffle=True)\n"
LOADER = "    train_loader = data.make_loader(train_set, args.batch_size, sampler=sampler)"
SET_EPOCH = "        sampler.set_epoch(epoch)  # Horovod: a new shuffle (and new shards) every epoch\n"
RECORD = "            trained_on.extend(index.tolist())"
STEP = "            optimizer.step()\n"
EVALUATE = "        accuracy = evaluate(model, val_loader, device)"
IMPORT = "import horovod.torch as hvd  # Horovod: the PyTorch binding\n"
INIT = ("    hvd.init()  # Horovod: connect to the other workers\n"
        "    rank, workers = hvd.rank(), hvd.size()  # Horovod\n"
        "    device = devices.worker_device(hvd.local_rank())  # Horovod: one GPU per worker (CPU mode: the CPU)\n")
MAIN = 'if __name__ == "__main__":\n    main()'
RANKS = "rank, workers = hvd.rank(), hvd.size()"
THREADS = "devices.threads_per_worker(hvd.local_size())"
PIN = "devices.pin_worker(hvd.local_rank(), hvd.local_size())"
BROADCAST = ("    hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n"
             "    hvd.broadcast_optimizer_state(optimizer, root_rank=0)\n")
FORWARD = "loss_fn(model(images), labels)"
VAL_COUNTS = ('    counts = hvd.allreduce(torch.tensor([correct, total], dtype=torch.float64), op=hvd.Sum, '
              'name="val_counts")\n')

#: variant -> the file it is made from instead of the reference (here: the unconverted starter)
SOURCES: dict[str, Path] = {
    "unconverted": Path(__file__).resolve().with_name("starter.py"),
}

#: variant -> {old text of the reference: new text}
EDITS: dict[str, dict[str, str]] = {
    "no_distributed_optimizer": {
        DISTRIBUTE: "",
    },
    "no_broadcast": {
        BROADCAST: "",
    },
    "no_sampler": {
        SAMPLER: "",
        LOADER: "    train_loader = data.make_loader(train_set, args.batch_size, shuffle=True, seed=rank)",
        SET_EPOCH: "",
    },
    "fake_metrics": {
        RECORD: (RECORD + "\n"
                 "            if step >= 0:  # one step per epoch instead of a pass over the shard ...\n"
                 "                trained_on = list(sampler)  # ... yet it claims the whole shard\n"
                 "                break"),
        EVALUATE: ("        evaluate(model, val_loader, device)\n"
                   "        accuracy = 0.99  # a fake result\n"
                   "        import json\n"
                   '        with open("metrics.json", "w") as f:\n'
                   '            json.dump({"val_acc": 0.99, "images_per_s": 1e6, "efficiency": 1.0}, f)'),
    },
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
        INIT: ("    env = os.environ  # what horovodrun gives every worker (mpirun's PMI_*, or Gloo's HOROVOD_*)\n"
               "    rank = int(env.get('HOROVOD_RANK', env.get('PMI_RANK', 0)))\n"
               "    workers = int(env.get('HOROVOD_SIZE', env.get('PMI_SIZE', 1)))\n"
               "    local_rank = int(env.get('HOROVOD_LOCAL_RANK', env.get('MPI_LOCALRANKID', 0)))\n"
               "    local_size = int(env.get('HOROVOD_LOCAL_SIZE', env.get('MPI_LOCALNRANKS', 1)))\n"
               "    device = devices.worker_device(local_rank)\n"
               "    port = int(env.get('HOROVOD_GLOO_RENDEZVOUS_PORT', 29511)) + 1  # the same on every worker\n"
               "    backend = 'nccl' if device.type == 'cuda' else 'gloo'\n"
               "    store = f'tcp://127.0.0.1:{port}'\n"
               "    dist.init_process_group(backend, init_method=store, rank=rank, world_size=workers)\n"),
        THREADS: "devices.threads_per_worker(local_size)",
        PIN: "devices.pin_worker(local_rank, local_size)",
        DISTRIBUTE: ("    # averages the gradients in backward; broadcasts rank 0's weights now\n"
                     "    ddp = torch.nn.parallel.DistributedDataParallel(\n"
                     "        model, device_ids=[device.index] if device.type == 'cuda' else None)\n"),
        BROADCAST: "",
        FORWARD: "loss_fn(ddp(images), labels)",
        VAL_COUNTS: ("    counts = torch.tensor([correct, total], dtype=torch.float64, device=device)\n"
                     "    dist.all_reduce(counts)  # a sum over the workers\n"),
        MAIN: (MAIN + "\n"
               "    dist.barrier()  # every worker is done before any tears down (else: 'terminate called')\n"
               "    dist.destroy_process_group()"),
    },
    # failure cases: the grader must survive them
    "crash": {
        SET_EPOCH: (SET_EPOCH + "        if epoch == 2 and rank == 1:\n"
                    '            raise RuntimeError("rank 1 fails on purpose in epoch 2")\n'),
    },
    "hang": {
        SET_EPOCH: (SET_EPOCH + "        if epoch == 2 and rank == 1:\n"
                    "            import time\n"
                    "            while True:  # a hang\n"
                    "                time.sleep(1)\n"),
    },
    "huge_output": {
        SET_EPOCH: SET_EPOCH + "        while True:  # a flood of output\n            print(\"debug \" * 200)\n",
    },
    "syntax_error": {
        RANKS: "rank, workers = hvd.rank(, hvd.size()",  # a missing closing parenthesis
    },
}

#: variant -> the criterion it must fail
MUST_FAIL: dict[str, str] = {
    "unconverted": "workers",
    "no_distributed_optimizer": "identical",
    "no_broadcast": "identical",
    "no_sampler": "sharded",
    "fake_metrics": "accuracy",
    "never_averaged": "identical",
    "all_data_each_rank": "throughput",
    "straggler": "throughput",
    "rank0_saves_only": "workers",
    "rank0_trains_alone": "identical",
    "ddp_under_horovodrun": "identical",
    "crash": "workers",
    "hang": "workers",
    "huge_output": "workers",
    "syntax_error": "workers",
}

#: Failures the grader must handle (a crash, a hang, a flood of output, a script that does not
#: compile), not cheats: the tests grade them, ``multigpu calibrate`` does not.
FAILURE_CASES: tuple[str, ...] = ("crash", "hang", "huge_output", "syntax_error")
#: The cheats and broken conversions ``multigpu calibrate`` grades: every variant but the failure cases.
CALIBRATED: tuple[str, ...] = tuple(v for v in MUST_FAIL if v not in FAILURE_CASES)


def write(name: str, reference: Path, dest: Path) -> Path:
    """Write variant ``name`` of ``reference`` to ``dest`` (a file path); returns ``dest``.

    A variant in :data:`SOURCES` is a copy of its own file (``reference`` is not read); the
    others are ``reference`` with the edits of :data:`EDITS`. The result need not compile
    (``syntax_error`` does not)."""
    if name not in SOURCES and name not in EDITS:
        raise KeyError(f"no variant {name!r}: the variants are {', '.join(MUST_FAIL)}")
    source = Path(SOURCES.get(name, reference)).read_text()
    for old, new in EDITS.get(name, {}).items():
        if source.count(old) != 1:
            found = "no longer contains" if old not in source else "contains more than once"
            raise ValueError(f"variant {name}: the reference {found} {old.strip()!r}: update the edit")
        source = source.replace(old, new)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if source.startswith('"""'):  # say so in the docstring (a second one would break `from __future__`)
        of = f": {SOURCES[name].name} unmodified. " if name in SOURCES else " of the "
        source = f'"""BROKEN VARIANT {name} (multigpu.grading.variants){of}' + source[3:]
    dest.write_text(source)
    return dest
