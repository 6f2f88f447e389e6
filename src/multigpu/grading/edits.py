"""Lines of the reference solution (``solutions/assessments/train.py``) that the variants edit
(:mod:`multigpu.grading.variants`, :mod:`multigpu.grading.disguises`): each must occur exactly
once in the reference, or :func:`variants.write` says which edit no longer applies."""

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
PIN_LINE = ("    # Horovod (CPU mode): each worker on its own core (README, Performance, has the bench's figures)\n"
            "    devices.pin_worker(hvd.local_rank(), hvd.local_size())\n")
BROADCAST = ("    hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n"
             "    hvd.broadcast_optimizer_state(optimizer, root_rank=0)\n")
FORWARD = "loss_fn(model(images), labels)"
PRINT = ('            print(f"epoch {epoch}/{args.epochs}: loss {loss.item():.3f}, validation accuracy {accuracy:.3f}", '
         'flush=True)\n')
MAIN_DEF = "def main(argv: list[str] | None = None) -> None:\n"
TARGET_LR = "    target_lr = args.lr * workers  # Horovod: the global batch is `workers` times larger\n"
OPTIMIZER = "    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,\n"
VAL_COUNTS = ('    counts = hvd.allreduce(torch.tensor([correct, total], dtype=torch.float64), op=hvd.Sum, '
              'name="val_counts")\n')
LOSS = "            loss = loss_fn(model(images), labels)\n            loss.backward()\n"
LOSS_ONLY = "            loss = loss_fn(model(images), labels)\n"
GETITEM = "        image, label = self.dataset[i]\n"
BATCHES = "        for step, (images, labels, index) in enumerate(train_loader):\n"
LR_EACH_STEP = ("            for group in optimizer.param_groups:  # Horovod: scaled learning rate\n"
                "                group[\"lr\"] = learning_rate(epoch - 1 + step / steps_per_epoch)\n")
EVALUATE_LOOP = ("    with torch.no_grad():\n"
                 "        for images, labels in loader:\n"
                 "            out = model(images.to(device))\n"
                 "            correct += int((out.argmax(1) == labels.to(device)).sum())\n"
                 "            total += labels.numel()\n")
