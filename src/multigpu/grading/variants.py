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
``duplicate_indices``         every rank trains on ALL the data (gradients       sharded
                              averaged) and reports a disjoint quarter, each
                              index listed ``workers`` times (issue 31, b)
``timeline_forger``           ``ddp_under_horovodrun`` whose rank 0 writes, after review (held, or
                              training, a timeline in Horovod's format at the    identical where its
                              times its steps really ended (issue 31, a)         clock does not fit)
``zero_allreduce``            ``never_averaged`` that also all-reduces zero      review (held)
                              tensors shaped like the gradients every step: real
                              Horovod all-reduces, thrown away (issue 31, c)
``no_set_epoch``              never calls ``sampler.set_epoch(epoch)``: every    sharded
                              rank trains on the same shard in the same order
                              every epoch (:mod:`multigpu.grading.epochs`)
============================  =================================================  ==================

"review": no check inside the run can prove what was all-reduced or who wrote the timeline; the
source raises review flags (:mod:`multigpu.grading.review`), so a pass is held for a person, never
certified on its own.

Mistakes the grader judges by their effect (:data:`BY_EFFECT`: a lab's test fails them, but no
evidence the grader owns can tell them from a choice; ``multigpu calibrate`` grades them and prints
their verdicts without expecting one, and docs/calibration.md has the measured ones):

============================  =================================================  ==================
variant                       what it does                                       judged by
============================  =================================================  ==================
``no_lr_scaling``             a correct conversion at the rate of one worker:    accuracy
                              no scaling by the worker count, no warm-up
``starter_threads``           keeps the starter's threads (every core for each   throughput (or T)
                              of the 4 workers: oversubscribed) and does not
                              pin its workers
============================  =================================================  ==================

The grader reads the learning rate by the accuracy it reaches (a rate that does not reach A fails
``accuracy`` with a hint to scale it) and the threads by the time they cost (a run below E fails
``throughput``, one past the time budget T fails ``workers``): Lab 3's exercises teach the rule
and the fair share of threads, and the assessment grades what they are for.

Honest conversions (:data:`HONEST`, in :mod:`multigpu.grading.honest`): other batch sizes, learning
rates, square-root scaling, warm-ups, epochs, Adam, fp16 compression, averaged metrics, a scheduler,
a decorator, a resumable start. Review never flags them. ``cached_decoded`` (:data:`CACHED`) keeps
the decoded data set in memory: honest, and held for review with what the grader saw read.

Three kinds of cheating that only facts from outside the run catch, each with two disguises,
and a fourth, images counted as trained that got no gradient (:mod:`multigpu.grading.disguises`:
``hidden_ddp``, ``short_epochs``, ``local_steps`` and their disguises, ``every_third_forward_only``,
``half_detached``) are in :data:`MUST_FAIL` too: ``sharded`` for a claim the reads contradict, "review"
for a pass that must be held (:data:`disguises.CAUGHT_BY` names the flag).

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

from multigpu.grading import disguises
from multigpu.grading.edits import (
    BROADCAST,
    DISTRIBUTE,
    EVALUATE,
    FORWARD,
    IMPORT,
    INIT,
    LOADER,
    MAIN,
    MAIN_DEF,
    PIN,
    PIN_LINE,
    PRINT,
    RANKS,
    RECORD,
    SAMPLER,
    SAVE,
    SET_EPOCH,
    STEP,
    TARGET_LR,
    THREADS,
    VAL_COUNTS,
)
from multigpu.grading.honest import CACHED, HONEST

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

#: What a forger adds to a torch DDP conversion: rank 0 writes, after training, a timeline in
#: Horovod's format (one ``allreduce.<parameter>`` process per parameter, negotiation, the library's
#: phase, the shape on the end event) with one round per step at the times the steps really ended.
FORGE_TIMELINE = '''def forge_timeline(model, started, step_times):
    """Write Horovod's timeline as Horovod would have, had it averaged the gradients."""
    import json
    events = [{"name": "process_name", "ph": "M", "pid": 0,
               "args": {"start_time_since_epoch_in_micros": int(started * 1e6)}}]
    params = list(model.named_parameters())
    for pid, (name, _) in enumerate(params, 1):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": "allreduce." + name}})
    for t in step_times:
        ts = int((t - started) * 1e6)
        for pid, (_, p) in enumerate(params, 1):
            shape = "[" + ", ".join(str(n) for n in p.shape) + "]"
            events += [{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": ts - 40, "pid": pid},
                       {"ph": "E", "ts": ts - 30, "pid": pid},
                       {"ph": "B", "name": "ALLREDUCE", "ts": ts - 20, "pid": pid},
                       {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": ts - 10, "pid": pid},
                       {"ph": "E", "ts": ts - 5, "pid": pid},
                       {"ph": "E", "ts": ts, "pid": pid, "args": {"dtype": "float32", "shape": shape}}]
    with open(os.environ["HOROVOD_TIMELINE"], "w") as f:
        f.write("[\\n" + ",\\n".join(json.dumps(e) for e in events))


'''
EDITS["timeline_forger"] = {
    **EDITS["ddp_under_horovodrun"],
    MAIN_DEF: FORGE_TIMELINE + MAIN_DEF + "    started, step_times = __import__('time').time(), []\n",
    STEP: STEP + "            step_times.append(__import__('time').time())\n",
    PRINT: PRINT + "    if rank == 0:  # after training: the timeline Horovod never wrote\n"
                   "        forge_timeline(model, started, step_times)\n",
}
EDITS["duplicate_indices"] = {
    LOADER: "    train_loader = data.make_loader(train_set, args.batch_size, shuffle=True)",
    RECORD: "            trained_on.extend(i for i in index.tolist() if i % workers == rank for _ in range(workers))",
}
EDITS["no_set_epoch"] = {SET_EPOCH: ""}
EDITS["zero_allreduce"] = {
    **EDITS["never_averaged"],
    STEP: STEP + ("            for name, p in model.named_parameters():  # real all-reduces, thrown away\n"
                  "                hvd.allreduce(torch.zeros_like(p), name=f\"zeros.{name}\")\n"),
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
    "duplicate_indices": "sharded",
    "no_set_epoch": "sharded",
    # no check inside the run can prove what was all-reduced: these are held for review
    "timeline_forger": "review",
    "zero_allreduce": "review",
    # caught by what the grader saw from outside the run, or held for review
    **{name: by if not by.startswith("held:") else "review" for name, by in disguises.CAUGHT_BY.items()},
    "crash": "workers",
    "hang": "workers",
    "huge_output": "workers",
    "syntax_error": "workers",
}

EDITS["no_lr_scaling"] = {TARGET_LR: "    target_lr = args.lr  # the rate of one worker, not scaled\n",
                          "WARMUP = 1.0": "WARMUP = 0.0"}
EDITS["starter_threads"] = {THREADS: "devices.threads_per_worker(1)", PIN_LINE: ""}
#: Mistakes judged by their effect: variant -> the criterion that measures it (see the module doc)
BY_EFFECT: dict[str, str] = {"no_lr_scaling": "accuracy", "starter_threads": "throughput"}

EDITS.update(disguises.EDITS)
EDITS.update(CACHED)

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
    if name not in SOURCES and name not in EDITS and name not in HONEST:
        raise KeyError(f"no variant {name!r}: the variants are {', '.join([*MUST_FAIL, *BY_EFFECT, *HONEST, *CACHED])}")
    source = Path(SOURCES.get(name, reference)).read_text()
    for old, new in {**EDITS.get(name, {}), **HONEST.get(name, {})}.items():
        if source.count(old) != 1:
            found = "no longer contains" if old not in source else "contains more than once"
            raise ValueError(f"variant {name}: the reference {found} {old.strip()!r}: update the edit")
        source = source.replace(old, new)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if source.startswith('"""'):  # say so in the docstring (a second one would break `from __future__`)
        of = f": {SOURCES[name].name} unmodified. " if name in SOURCES else " of the "
        kind = "HONEST VARIANT" if name in HONEST else "BROKEN VARIANT"
        source = f'"""{kind} {name} (multigpu.grading.variants){of}' + source[3:]
    dest.write_text(source)
    return dest
