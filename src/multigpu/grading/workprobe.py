"""Work per step, counted where the script cannot write it: the batches its own data loaders
yield and which of them reach a backward pass (issue 49, point 3).

A run's claim is the indices its ranks list as trained. The reads from outside
(:mod:`multigpu.grading.reads`) show that those files were opened, Horovod's timeline how many
rounds of gradient all-reduces there were; neither shows whether an image that was loaded also
got a gradient. A batch run forward only and listed as trained looks, in both, like an honest
larger batch (every third batch forward only at 32 a batch: 48 images per worker between two
rounds, as an honest batch of 48).

So the grader counts, inside every Python process of the sandboxed run, before the script's own
code runs (a ``sitecustomize`` it puts first on the run's ``PYTHONPATH``: :func:`sitecustomize`):
each batch a ``torch.utils.data.DataLoader`` yields (its size along the first dimension) and each
backward pass (``torch.autograd.backward``, which ``Tensor.backward`` calls). A batch is trained
when a backward pass covers it (:class:`Counts`: each covers the oldest batch its loader yielded
and none covered yet); micro-batches of one batch, batches fetched ahead in groups, accumulation
(``backward_passes_per_step``) and any number of steps count alike. At exit each
process writes its counts to this grading's record folder (:data:`RECORDS_VAR`), under a name of its
pid; the grader reads them after the run (:class:`WorkWatch`, :func:`work_flags`) and sets the
images that reached a backward pass against the images the ranks claimed.

What it trusts: the counts are made in the learner's processes, so a script could change them,
but only with what the review flags (the probe's module reached by import or dynamic access, a
file written outside the checkpoint folder, ``os._exit`` leaves no record and is flagged here as
a record missing). What it cannot see: less work inside a batch that does reach a backward pass
(half of the loss detached: the review's ``gradients`` flag), a backward pass on something other
than the batch's loss, batches not drawn from a DataLoader (no record: held with the figures).
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import json
import os
import sys
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The variable that tells the probe where to write (set by the grader for the submission's run only).
RECORDS_VAR = "MULTIGPU_WORK_RECORDS"
#: Claimed images may exceed the images that reached a backward pass by this fraction before the
#: pass is held (a loader wrapper that fetches one batch ahead shifts a batch an epoch; every
#: third, even every tenth batch forward only is far above it).
TOLERANCE = 0.05
#: What the grader writes as the run's ``sitecustomize.py``.
SITECUSTOMIZE = (
    '"""The grader\'s count of the batches and backward passes of a submission (multigpu.grading.workprobe)."""\n'
    "import os\n"
    f"if os.environ.get({RECORDS_VAR!r}):\n"
    "    from multigpu.grading import workprobe\n"
    f"    workprobe.install(os.environ[{RECORDS_VAR!r}])\n")


def sitecustomize(folder: Path) -> Path:
    """Write the probe's ``sitecustomize.py`` into ``folder`` (to be put first on ``PYTHONPATH``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (folder / "sitecustomize.py").chmod(0o644)  # the sandbox's account reads it, whatever the umask
    folder.chmod(0o755)
    return folder


# ----------------------------------------------------------------------------- inside the run


class Counts:
    """One process's counts (see the module doc). Each iterator of a DataLoader keeps the batches it
    yielded that no backward pass has covered yet, oldest first; a backward pass covers the oldest
    of the iterator that yielded last. So batches fetched ahead in a group and trained one by one
    count (two yielded, two backward passes), as do micro-batches of one batch (the extra backward
    passes find nothing left to cover), while a batch run forward only stays uncovered, and a
    validation loader's batches never get one."""

    def __init__(self) -> None:
        self.batches = self.samples = self.trained_batches = self.trained_samples = self.backward = 0
        self.sizes: Counter[int] = Counter()
        self.pending: dict[int, deque[int]] = {}
        self.last = 0

    def batch(self, n: int, source: int = 0) -> None:
        self.batches += 1
        self.samples += n
        self.sizes[n] += 1
        self.pending.setdefault(source, deque()).append(n)
        self.last = source

    def backward_pass(self) -> None:
        self.backward += 1
        waiting = self.pending.get(self.last)
        if waiting:
            self.trained_batches += 1
            self.trained_samples += waiting.popleft()

    def finished(self, source: int) -> None:
        """An iterator that is done: what it left uncovered stays so."""
        self.pending.pop(source, None)

    def to_dict(self) -> dict[str, Any]:
        rank = next((os.environ[v] for v in ("HOROVOD_RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK") if v in os.environ), "")
        return {"pid": os.getpid(), "rank": rank, "batches": self.batches, "samples": self.samples,
                "trained_batches": self.trained_batches, "trained_samples": self.trained_samples,
                "backward": self.backward, "sizes": {str(k): v for k, v in self.sizes.most_common(5)}}


def batch_size(batch: Any) -> int:
    """Images in a batch: the first dimension of its first tensor (a tensor, a tuple or list, a dict)."""
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else [batch]
    for x in items:
        shape = getattr(x, "shape", None)
        if shape is not None and len(shape):
            return int(shape[0])
    return 0


class CountedIterator:
    """A DataLoader's iterator that counts each batch it yields (everything else is the iterator's)."""

    def __init__(self, iterator: Any, counts: Counts) -> None:
        self.iterator, self.counts = iterator, counts

    def __iter__(self) -> CountedIterator:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self.iterator)
        except StopIteration:
            self.counts.finished(id(self))
            raise
        self.counts.batch(batch_size(batch), id(self))
        return batch

    def __len__(self) -> int:
        return len(self.iterator)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.iterator, name)


def _patch(module: Any, counts: Counts) -> None:
    """Count in ``torch.utils.data.dataloader`` or ``torch.autograd``, whichever ``module`` is."""
    if module.__name__ == "torch.utils.data.dataloader":
        loader = module.DataLoader
        iterate = loader.__iter__

        def counted_iter(self: Any) -> CountedIterator:
            return CountedIterator(iterate(self), counts)

        loader.__iter__ = counted_iter
    else:
        backward = module.backward

        def counted_backward(*args: Any, **kwargs: Any) -> Any:
            counts.backward_pass()
            return backward(*args, **kwargs)

        module.backward = counted_backward


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loading of the two modules it counts in, to patch them once loaded."""

    TARGETS = ("torch.utils.data.dataloader", "torch.autograd")

    def __init__(self, counts: Counts) -> None:
        self.counts = counts

    def find_spec(self, name: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if name not in self.TARGETS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        loader, counts = spec.loader, self.counts
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _patch(module, counts)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install(folder: str) -> None:
    """Count this process's batches and backward passes; write them to ``folder`` at exit."""
    counts = Counts()
    sys.meta_path.insert(0, _Finder(counts))

    def write() -> None:
        if not (counts.batches or counts.backward):
            return
        path = Path(folder) / f"{os.getpid()}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(counts.to_dict()))
        os.replace(tmp, path)

    atexit.register(write)


# ----------------------------------------------------------------------------- the grader's side


@dataclass(frozen=True)
class WorkLog:
    """The records the run's processes left (one per process that yielded a batch or ran a
    backward pass); ``lost`` says why some could not be read."""

    records: tuple[dict[str, Any], ...]
    lost: str = ""

    @property
    def trained(self) -> int:
        return sum(int(r.get("trained_samples", 0)) for r in self.records)

    def batch_sizes(self) -> Counter[int]:
        sizes: Counter[int] = Counter()
        for r in self.records:
            sizes.update({int(k): int(v) for k, v in (r.get("sizes") or {}).items()})
        return sizes


class WorkWatch:
    """A runner observer (:class:`multigpu.grading.runner.Observer`) that reads the probe's records
    of the run from ``folder`` once it has ended."""

    MAX_RECORDS = 256

    def __init__(self, folder: Path):
        self.folder = folder

    def started(self, start: float) -> None:
        return None

    def tick(self, pids: set[int], elapsed: float) -> None:
        return None

    def stopped(self) -> WorkLog:
        records, lost = [], ""
        for path in sorted(self.folder.glob("*.json"))[:self.MAX_RECORDS]:
            try:
                if path.is_symlink() or path.stat().st_size > 100_000:
                    raise ValueError("not a record")
                record = json.loads(path.read_text())
                if not isinstance(record, dict):
                    raise ValueError("not a record")
                records.append(record)
            except (OSError, ValueError):
                lost = f"the record {path.name} could not be read"
        return WorkLog(tuple(records), lost)
