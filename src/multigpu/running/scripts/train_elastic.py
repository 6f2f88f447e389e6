"""Elastic Horovod training (Lab 4): workers may die or join mid-epoch and training goes on.

Launch through :func:`multigpu.labs.lab4.elastic.run` (which writes the host discovery script), or::

    horovodrun --gloo -np 4 --min-np 2 --max-np 4 --host-discovery-script ./discover.sh \\
        python -m multigpu.running.scripts.train_elastic --ledger runs/elastic

What makes it elastic (each such line carries a ``# Elastic:`` comment):

- ``hvd.elastic.TorchState`` holds everything a new or surviving worker needs to continue: the
  model, the optimizer, the :class:`~horovod.torch.elastic.ElasticSampler` (which samples of the
  epoch are done) and the epoch. ``state.commit()`` every ``--commit-every`` steps copies it to
  memory; when a worker dies the others get an error in their next all-reduce, go back to the
  last commit (``state.restore()``), re-form the ring with whoever is left, and continue.
- ``@hvd.elastic.run`` wraps the training function: it catches that error, resets Horovod and
  calls the function again after broadcasting rank 0's committed state to every worker (new
  ones included).
- The sampler re-divides the samples of the epoch that are not done among the new set of workers.

The ledger (``--ledger DIR``): at every commit each process appends the indices of the samples it
trained since the previous commit to ``DIR/<pid>.jsonl``; what it trained after its last commit
is never written (the work a failure throws away). Rank 0 also writes one line per step, without
indices, so that a watcher can act between two commits. :func:`multigpu.labs.lab4.elastic.account` checks that
the written samples cover every sample of every epoch exactly once.

Command line: ``--epochs`` (default 2), ``--batch-size`` per worker (default 16), ``--base-lr``
(default 0.01, times the number of workers), ``--synthetic N`` images (default 1024),
``--commit-every K`` steps (default 4), ``--step-delay S`` seconds of sleep per step (to give a
person time to kill a worker), ``--ledger DIR``, ``--seed``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import horovod.torch as hvd
import torch
from torch.utils.data import DataLoader

from multigpu.core import data, devices, models


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--base-lr", type=float, default=0.01)
    p.add_argument("--synthetic", type=int, default=1024)
    p.add_argument("--model", default="alexnet_small")
    p.add_argument("--commit-every", type=int, default=4)
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--ledger", default=None)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


class Ledger:
    """This process's ledger file (``None``: none is written) and the sample indices it trained
    since its last commit."""

    def __init__(self, folder: str | None) -> None:
        self.path = Path(folder) / f"{os.getpid()}.jsonl" if folder else None
        self.trained: list[int] = []

    def write(self, event: str, **entry: Any) -> None:
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps({"event": event, **entry}) + "\n")

    def commit(self, state: Any, epoch: int) -> None:
        # The ledger line first: commit() may raise HostsUpdatedInterrupt (a host was added) after
        # it has saved the state, and then these samples are committed all the same.
        self.write("commit", epoch=epoch, rank=hvd.rank(), size=hvd.size(), indices=self.trained[:], time=time.time())
        self.trained.clear()
        state.commit()  # Elastic: copy the state to memory; a failure comes back to here

    def on_reset(self, optimizer: torch.optim.Optimizer, base_lr: float) -> Callable[[], None]:
        """The reset callback: after workers left or joined, before the state is broadcast."""

        def reset() -> None:  # Elastic
            lost = len(self.trained)
            self.trained.clear()  # uncommitted work is undone: the state goes back to the last commit
            for group in optimizer.param_groups:
                group["lr"] = base_lr * hvd.size()  # the rate follows the number of workers
            self.write("reset", rank=hvd.rank(), size=hvd.size(), lost=lost, time=time.time())

        return reset


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    hvd.init()
    torch.manual_seed(args.seed)
    if devices.detect().mode == "cpu":
        torch.set_num_threads(devices.threads_per_worker(hvd.local_size()))
    dataset = data.WithIndex(data.SyntheticImages(args.synthetic, models.default_image_size(args.model), seed=args.seed))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=args.seed)  # Elastic: re-divides what is left
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = models.build_model(args.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.base_lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    ledger = Ledger(args.ledger)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0)  # Elastic
    state.register_reset_callbacks([ledger.on_reset(optimizer, args.base_lr)])
    ledger.write("start", rank=hvd.rank(), size=hvd.size(), host=os.environ.get("HOROVOD_HOSTNAME", ""), time=time.time())
    train(state, args, model, optimizer, loader, ledger)
    ledger.write("end", rank=hvd.rank(), size=hvd.size(), time=time.time())


@hvd.elastic.run  # Elastic: on a lost worker, restore the last commit and call again
def train(state: Any, args: argparse.Namespace, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
          loader: DataLoader, ledger: Ledger) -> None:
    loss_fn = torch.nn.CrossEntropyLoss()
    while state.epoch < args.epochs:
        epoch = state.epoch
        model.train()
        for step, (x, y, index) in enumerate(loader, 1):
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
            ledger.trained.extend(index.tolist())
            if hvd.rank() == 0:  # a heartbeat: whoever watches the run sees it is between two commits
                ledger.write("step", epoch=epoch, rank=0, size=hvd.size(), time=time.time())
            state.sampler.record_batch(step, args.batch_size)  # Elastic: these samples are done
            if args.step_delay:
                time.sleep(args.step_delay)
            if step % args.commit_every == 0:
                ledger.commit(state, epoch)
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}/{args.epochs} done on {hvd.size()} workers", flush=True)
        state.epoch = epoch + 1
        state.sampler.set_epoch(state.epoch)  # Elastic: a new epoch, nothing of it done yet
        ledger.commit(state, epoch)


if __name__ == "__main__":
    main()
