"""Honest conversions a learner may write, as edits of the reference (:mod:`multigpu.grading.variants`
writes them): other hyperparameters, other ways to scale the rate, other ways to write the same
conversion. None raises a review flag (tests/test_review.py; the review flags capabilities,
:mod:`multigpu.grading.review_rules`, and so do conversions written independently:
``tests/fixtures/corpus``) and none is flagged by what the grader sees of its run.

:data:`CACHED` is honest too: each rank keeps the images it decoded in memory, so in later epochs
the grader sees only the files new to a rank's reshuffled shard opened (about half of it with 2
ranks); it is held for review with the figures (kind ``reads``,
:mod:`multigpu.grading.observations`): the grader cannot tell a cache from less work.
"""

from __future__ import annotations

from multigpu.grading.edits import (
    DISTRIBUTE,
    EVALUATE,
    EVALUATE_LOOP,
    GETITEM,
    INIT,
    LR_EACH_STEP,
    MAIN_DEF,
    OPTIMIZER,
    PRINT,
    SAMPLER,
    SET_EPOCH,
    STEP,
    TARGET_LR,
)

#: Honest conversions a learner may write: other hyperparameters, other ways to scale the rate,
#: other ways to write the same conversion. Review never flags them (tests/test_review.py).
HONEST: dict[str, dict[str, str]] = {
    "batch_16": {"BATCH = 32": "BATCH = 16"},
    "batch_48": {"BATCH = 32": "BATCH = 48"},
    "batch_64": {"BATCH = 32": "BATCH = 64"},
    "batch_128": {"BATCH = 32": "BATCH = 128"},
    "lr_half": {"LR = 0.01": "LR = 0.005"},
    "lr_double": {"LR = 0.01": "LR = 0.02"},
    "sqrt_scaling": {TARGET_LR: "    target_lr = args.lr * workers ** 0.5  # Horovod: square-root scaling\n"},
    "sqrt_scaling_math": {TARGET_LR: "    import math\n    target_lr = args.lr * math.sqrt(hvd.size())\n"},
    "no_warmup": {"WARMUP = 1.0": "WARMUP = 0.0"},
    "long_warmup": {"WARMUP = 1.0": "WARMUP = 2.0"},
    "six_epochs": {"EPOCHS = 5": "EPOCHS = 6"},
    "one_decay_epoch": {"DECAY = 2": "DECAY = 1"},
    "momentum_low": {'"--momentum", type=float, default=0.9': '"--momentum", type=float, default=0.8'},
    "fp16_compression": {DISTRIBUTE: ("    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),\n"
                                      "                                         compression=hvd.Compression.fp16)\n")},
    "average_op": {DISTRIBUTE: ("    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),\n"
                                "                                         op=hvd.Average)\n")},
    "adam": {OPTIMIZER: "    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr / 10,\n"},
    "averaged_loss": {EVALUATE: (EVALUATE + '\n        mean_loss = hvd.allreduce(loss.detach(), name="train_loss")  '
                                 '# Horovod: the mean of the ranks'),
                      "loss {loss.item():.3f}": "loss {mean_loss.item():.3f}"},
    "timed_epochs": {"import os\n": "import os\nimport time\n",
                     SET_EPOCH: SET_EPOCH + "        started = time.perf_counter()\n",
                     PRINT: PRINT + "            print(f\"took {time.perf_counter() - started:.1f} s\")\n"},
    "metric_helper": {
        MAIN_DEF: ("def metric_average(value: float, name: str) -> float:\n"
                   "    return float(hvd.allreduce(torch.tensor(value), name=name))  # Horovod: averaged over ranks\n\n\n"
                   + MAIN_DEF),
        EVALUATE: EVALUATE + "\n        mean_loss = metric_average(loss.item(), 'train_loss')",
        "loss {loss.item():.3f}": "loss {mean_loss:.3f}"},
    "rank_zero_sampler_seed": {SAMPLER: ("    sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True,\n"
                                         "                                 seed=42)\n")},
    # other ways to write the same conversion
    "lambda_lr": {
        "        return decay * target_lr\n": (
            "        return decay * target_lr\n\n"
            "    # Horovod: the same rule as a scheduler, stepped once per batch\n"
            "    scheduler = torch.optim.lr_scheduler.LambdaLR(\n"
            "        optimizer, lr_lambda=lambda i: learning_rate(i / steps_per_epoch) / args.lr)\n"),
        LR_EACH_STEP: "",
        STEP: STEP + "            scheduler.step()\n"},
    "no_grad_decorator": {
        "def evaluate(": "@torch.no_grad()\ndef evaluate(",
        EVALUATE_LOOP: ("    for images, labels in loader:  # no gradients: the decorator turns them off\n"
                        "        out = model(images.to(device))\n"
                        "        correct += int((out.argmax(1) == labels.to(device)).sum())\n"
                        "        total += labels.numel()\n")},
    "cuda_set_device": {INIT: INIT + ("    if torch.cuda.is_available():  # Horovod: pin each worker to its GPU\n"
                                      "        torch.cuda.set_device(hvd.local_rank())\n")},
    "resume_epoch": {
        "    for epoch in range(1, args.epochs + 1):\n": (
            "    # Horovod: where to start (a resumed run would read it on rank 0), the same on every rank\n"
            "    first_epoch = hvd.broadcast_object(1, root_rank=0, name=\"first_epoch\")\n"
            "    for epoch in range(first_epoch, args.epochs + 1):\n")},
    "seeded_model": {"    model = models.build_model(": "    torch.manual_seed(0)  # the same start on any machine\n"
                                                     "    model = models.build_model("},
    "rank0_log": {
        MAIN_DEF: ("def log(message: str) -> None:\n"
                   "    if hvd.rank() == 0:  # Horovod: one worker prints\n"
                   "        print(message, flush=True)\n\n\n" + MAIN_DEF),
        PRINT: ('        log(f"epoch {epoch}/{args.epochs}: loss {loss.item():.3f}, validation accuracy '
                '{accuracy:.3f}")\n'),
        "        if rank == 0:  # Horovod: one worker prints\n": ""},
}

#: The honest conversion that caches the decoded data set, and the flag its pass is held with.
CACHED: dict[str, dict[str, str]] = {
    "cached_decoded": {
        "        self.classes = dataset.classes\n": ("        self.classes = dataset.classes\n"
                                                   "        self.kept = {}  # decoded once: later epochs skip the JPEGs\n"),
        GETITEM: ("        if i not in self.kept:\n"
                  "            self.kept[i] = self.dataset[i]\n"
                  "        image, label = self.kept[i]\n"),
    },
}
CACHED_HELD_BY = "reads"
