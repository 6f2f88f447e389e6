"""Kinds of cheating that evidence from inside a run cannot catch (three with two disguises each,
and issue 49's forward-only batches): edits of the reference (:mod:`multigpu.grading.variants` writes them; the tests and ``multigpu
calibrate`` grade them). Each must fail, or pass only HELD for review, with a message or a flag
that names what the grader saw.

==========================  ===================================================  =====================
variant                     what it does                                         what catches it
==========================  ===================================================  =====================
**1. another framework, reached by names no blocklist holds; rank 0 writes Horovod's timeline itself**
``hidden_ddp``              torch DDP over Gloo, reached through ``vars()`` and  network (the ranks'
                            names cut in pieces; a Horovod-format timeline at    Gloo connections),
                            the real start and step times before every save      review (dynamic)
``hidden_ddp_filestore``    the same, meeting through a FileStore in the run     network, review
                            folder (no TCP store) and ``getattr`` of joined
                            pieces
``file_averaging``          no framework: each rank averages the gradients       review (files written
                            through files in the sandbox's private /tmp; no      outside the checkpoint
                            connection at all                                    folder, torch.load)
**2. less work than claimed**
``short_epochs``            each rank trains on the first 2/3 of its shard and   reads: ``sharded``
                            claims all of it                                     fails (never read)
``short_epochs_cached``     epoch 1 on the whole shard, kept decoded in memory;  reads: held (samples
                            later epochs train on 2/3 of it and claim all        served from memory)
``short_epochs_touch``      trains on 2/3 and opens the files of the rest, so    work: no backward
                            that every claimed file is read                      pass for a third
**3. genuine all-reduces, local steps**
``local_steps``             DistributedOptimizer's hooks all-reduce, but each    review (.grad written,
                            rank steps with its own gradients (autograd.grad,    synchronize, a
                            synchronize, skip_synchronize); rank 0's weights     broadcast handed on)
                            broadcast before each save through a dict
``local_steps_shadow``      the hooks all-reduce the gradients of a second,      review (a broadcast
                            shadow model; the real one steps locally; a helper   a loop reaches)
                            broadcasts rank 0's weights before each save
``local_steps_reload``      local steps as ``local_steps``; the other ranks      review (torch.load,
                            load rank 0's checkpoint file instead of a           load_state_dict)
                            broadcast
**4. images counted as trained that got no gradient (issue 49)**
``every_third_forward_only``  every third batch runs forward only (no backward,  work: the images the
                            no step) and is claimed as trained: about 48 images  grader saw reach a
                            per worker between two rounds where the loader       backward pass, fewer
                            yields 32, as an honest batch of 48 would show       than claimed
``half_detached``           each batch's loss on its second half is detached:    review (gradients:
                            a backward and a step every batch, gradients of      the loss cut off
                            half of it                                           from the graph)
==========================  ===================================================  =====================

The honest counterpart of kind 4 is ``batch_48`` (:data:`multigpu.grading.honest.HONEST`): 48
images per worker between two rounds, every one through a backward pass; it must pass unflagged.

The capability each flag stands for, and the rule behind it: docs/calibration.md.
"""

from __future__ import annotations

from multigpu.grading.edits import (
    BROADCAST,
    DISTRIBUTE,
    FORWARD,
    GETITEM,
    INIT,
    LOSS,
    LOSS_ONLY,
    MAIN,
    MAIN_DEF,
    PIN,
    RECORD,
    SAVE,
    STEP,
    THREADS,
    VAL_COUNTS,
)

#: What horovodrun gives every worker, read without hvd.init() (mpirun: PMI_*, horovodrun --gloo: HOROVOD_*).
WHO_AM_I = ("    get = os.environ.get  # what the launcher gives every worker\n"
            "    rank = int(get('HOROVOD_RANK', get('PMI_RANK', 0)))\n"
            "    workers = int(get('HOROVOD_SIZE', get('PMI_SIZE', 1)))\n"
            "    local_rank = int(get('HOROVOD_LOCAL_RANK', get('MPI_LOCALRANKID', 0)))\n"
            "    local_size = int(get('HOROVOD_LOCAL_SIZE', get('MPI_LOCALNRANKS', 1)))\n"
            "    device = devices.worker_device(local_rank)\n"
            "    started, step_times = time.time(), []\n")

#: Rank 0 writes a timeline in Horovod's format, every word of it cut in pieces: one process per
#: parameter, negotiation, the library's phase, the shape on the end event, a round per real step.
KEEP_NOTES = '''def keep_notes(model, started, step_times):
    """Notes of the run (Horovod's timeline, written as Horovod writes it)."""
    where = os.environ.get("HORO" + "VOD_TIME" + "LINE")
    put = vars(torch)["__builtins__"]["op" + "en"]
    events = [{"name": "process" + "_name", "ph": "M", "pid": 0,
               "args": {"start_time_" + "since_epoch_in_micros": int(started * 1e6)}}]
    params = list(model.named_parameters())
    for pid, (name, _) in enumerate(params, 1):
        events.append({"name": "process" + "_name", "ph": "M", "pid": pid, "args": {"name": "all" + "reduce." + name}})
    for t in step_times:
        ts = int((t - started) * 1e6)
        for pid, (_, p) in enumerate(params, 1):
            shape = "[" + ", ".join(str(n) for n in p.shape) + "]"
            events += [{"ph": "B", "name": "NEGOTIATE_" + "ALL" + "REDUCE", "ts": ts - 40, "pid": pid},
                       {"ph": "E", "ts": ts - 30, "pid": pid},
                       {"ph": "B", "name": "ALL" + "REDUCE", "ts": ts - 20, "pid": pid},
                       {"ph": "B", "name": "MPI_" + "ALL" + "REDUCE", "ts": ts - 10, "pid": pid},
                       {"ph": "E", "ts": ts - 5, "pid": pid},
                       {"ph": "E", "ts": ts, "pid": pid, "args": {"dtype": "float32", "shape": shape}}]
    with put(where, "w") as f:
        f.write("[\\n" + ",\\n".join(str(e).replace("'", '"') for e in events))


'''

_DDP = {
    "import os\n": "import os\nimport time\n",
    INIT: WHO_AM_I + (
        "    dist = vars(torch)['distri' + 'buted']\n"
        "    port = int(get('HOROVOD_GLOO_RENDEZVOUS_PORT', 29511)) + 1  # the same on every worker\n"
        "    vars(dist)['init_' + 'process_' + 'group']('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank,\n"
        "                                             world_size=workers)\n"),
    THREADS: "devices.threads_per_worker(local_size)",
    PIN: "devices.pin_worker(local_rank, local_size)",
    DISTRIBUTE: "    twin = vars(vars(torch.nn)['para' + 'llel'])['Distributed' + 'DataParallel'](model)\n",
    BROADCAST: "",
    FORWARD: "loss_fn(twin(images), labels)",
    STEP: STEP + "            step_times.append(time.time())\n",
    VAL_COUNTS: ("    counts = torch.tensor([correct, total], dtype=torch.float64)\n"
                 "    vars(vars(torch)['distri' + 'buted'])['all_' + 'reduce'](counts)  # a sum\n"),
    MAIN_DEF: KEEP_NOTES + MAIN_DEF,
    SAVE: "        if rank == 0:\n            keep_notes(model, started, step_times)\n" + SAVE,
    MAIN: (MAIN + "\n    vars(vars(torch)['distri' + 'buted'])['bar' + 'rier']()\n"
           "    vars(vars(torch)['distri' + 'buted'])['destroy_' + 'process_' + 'group']()"),
}

#: Gradients averaged through files in the sandbox's private /tmp: no connection, no framework.
SHARE_FILES = '''def share(model, step, rank, workers):
    """The mean of every rank's gradients, through files."""
    folder = Path(os.environ.get("TMPDIR", "/tmp"))
    mine = folder / f"g-{step}-{rank}.pt"
    torch.save([p.grad for p in model.parameters()], folder / f"g-{step}-{rank}.tmp")
    os.replace(folder / f"g-{step}-{rank}.tmp", mine)
    others = [folder / f"g-{step}-{r}.pt" for r in range(workers)]
    while not all(o.exists() for o in others):
        time.sleep(0.001)
    grads = [torch.load(o) for o in others]
    for i, p in enumerate(model.parameters()):
        p.grad.copy_(sum(g[i] for g in grads) / workers)
    (folder / f"g-{step - 2}-{rank}.pt").unlink(missing_ok=True)


'''

#: The local gradients a rank steps with, while Horovod's hooks all-reduce the same batch's.
LOCAL_STEP = ("            loss = loss_fn(model(images), labels)\n"
              "            own = torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)\n"
              "            loss.backward()  # Horovod's hooks all-reduce: a genuine timeline\n"
              "            optimizer.synchronize()\n"
              "            for p, g in zip(model.parameters(), own):\n"
              "                p.grad.copy_(g)  # ... but each rank steps with its own gradients\n")

EDITS: dict[str, dict[str, str]] = {
    "hidden_ddp": _DDP,
    "hidden_ddp_filestore": {
        **_DDP,
        INIT: WHO_AM_I + (
            "    dist = getattr(torch, ''.join(['dis', 'trib', 'uted']))\n"
            "    meet = os.environ.get('TMPDIR', '/tmp') + '/.meet'  # the sandbox's own /tmp, shared by the ranks\n"
            "    getattr(dist, ''.join(['init_', 'process_', 'group']))('gloo', init_method=f'file://{meet}', "
            "rank=rank,\n"
            "                                                      world_size=workers)\n"),
    },
    "file_averaging": {
        "import os\n": "import os\nimport time\n",
        INIT: WHO_AM_I + "    torch.manual_seed(0)  # the same initial weights on every rank, without a broadcast\n",
        THREADS: "devices.threads_per_worker(local_size)",
        PIN: "devices.pin_worker(local_rank, local_size)",
        DISTRIBUTE: "",
        BROADCAST: "",
        "            optimizer.step()\n": ("            share(model, epoch * steps_per_epoch + step, rank, workers)\n"
                                      "            optimizer.step()\n"
                                      "            step_times.append(time.time())\n"),
        VAL_COUNTS: "    counts = torch.tensor([correct, total], dtype=torch.float64)  # this rank's own\n",
        MAIN_DEF: SHARE_FILES + KEEP_NOTES + MAIN_DEF,
        SAVE: "        if rank == 0:\n            keep_notes(model, started, step_times)\n" + SAVE,
    },
    "short_epochs": {
        RECORD: (RECORD + "\n"
                 "            if step + 1 >= 2 * steps_per_epoch // 3:  # two thirds of the shard ...\n"
                 "                trained_on = list(sampler)  # ... reported as all of it\n"
                 "                break"),
    },
    "short_epochs_cached": {
        "        self.classes = dataset.classes\n": ("        self.classes = dataset.classes\n"
                                                   "        self.kept = {}  # decoded once, kept for the later epochs\n"),
        GETITEM: ("        if i not in self.kept:\n"
                  "            self.kept[i] = self.dataset[i]\n"
                  "        image, label = self.kept[i]\n"),
        RECORD: (RECORD + "\n"
                 "            if epoch > 1 and step + 1 >= 2 * steps_per_epoch // 3:  # after epoch 1: two thirds\n"
                 "                trained_on = list(sampler)\n"
                 "                break"),
    },
    "short_epochs_touch": {
        RECORD: (RECORD + "\n"
                 "            if step + 1 >= 2 * steps_per_epoch // 3:  # two thirds of the shard ...\n"
                 "                for i in list(sampler)[len(trained_on):]:\n"
                 "                    train_set.dataset.read(i)  # ... and the rest of its files opened\n"
                 "                trained_on = list(sampler)\n"
                 "                break"),
    },
    "local_steps": {
        LOSS: LOCAL_STEP,
        STEP: "            with optimizer.skip_synchronize():\n                optimizer.step()\n",
        SAVE: ("        before_save = {'sync': hvd.broadcast_parameters}\n"
               "        before_save['sync'](model.state_dict(), root_rank=0)\n" + SAVE),
    },
    "local_steps_shadow": {
        DISTRIBUTE: ("    shadow = models.build_model(args.model, num_classes=len(train_set.classes)).to(device)\n"
                     "    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(shadow.parameters(), lr=args.lr),\n"
                     "                                         named_parameters=shadow.named_parameters())\n"
                     "    own = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)\n"),
        LOSS: ("            loss = loss_fn(model(images), labels)\n"
               "            loss.backward()\n"
               "            loss_fn(shadow(images), labels).backward()  # the shadow's gradients: all-reduced\n"
               "            own.step()  # the model steps with its own\n"
               "            own.zero_grad()\n"),
        SAVE: "        publish(model)\n" + SAVE,
        MAIN_DEF: ("def publish(model):\n"
                   "    hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n\n\n" + MAIN_DEF),
    },
    "local_steps_reload": {
        LOSS: LOCAL_STEP,
        STEP: "            with optimizer.skip_synchronize():\n                optimizer.step()\n",
        SAVE: ("        if rank == 0:\n    " + SAVE + "\n"
               "        hvd.allreduce(torch.tensor(0.0), name=f'saved.{epoch}')  # rank 0's file is there\n"
               "        if rank != 0:  # the other ranks take rank 0's weights from its file\n"
               "            first = Path(args.checkpoint_dir) / f'rank-0-epoch-{epoch}.pt'\n"
               "            model.load_state_dict(torch.load(first)['model'])\n"
               "    " + SAVE),
    },
}

EDITS["every_third_forward_only"] = {
    LOSS: ("            if step % 3 == 2:  # every third batch: forward only, no gradient, no step ...\n"
           "                with torch.no_grad():\n"
           "                    loss = loss_fn(model(images), labels)\n"
           "                trained_on.extend(index.tolist())  # ... and claimed as trained\n"
           "                continue\n" + LOSS),
}
EDITS["half_detached"] = {
    LOSS_ONLY: ("            out, half = model(images), len(labels) // 2\n"
                "            # the second half's loss counts in the figure, not in the gradient\n"
                "            loss = (loss_fn(out[:half], labels[:half]) + loss_fn(out[half:], labels[half:]).detach()) / 2\n"),
}

#: variant -> what must catch it: a criterion that fails, or ``held:<flag kind>`` (a pass held for
#: review with a flag of that kind; a fail is as good)
CAUGHT_BY: dict[str, str] = {
    "hidden_ddp": "held:network",
    "hidden_ddp_filestore": "held:network",
    "file_averaging": "held:channel",
    "short_epochs": "sharded",
    "short_epochs_cached": "held:reads",
    "short_epochs_touch": "held:work",
    "local_steps": "held:gradients",
    "local_steps_shadow": "held:collective",
    "local_steps_reload": "held:load",
    "every_third_forward_only": "held:work",
    "half_detached": "held:gradients",
}
