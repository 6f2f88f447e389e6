"""Section 1: the input pipeline against its read + decode bound."""

from __future__ import annotations

import itertools
import multiprocessing
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

from multigpu.course.bench.report import Figure, Plan, Section, Target, fmt, interleave, steps

# --------------------------------------------------------------------------- 1. input pipeline


def decode_files(paths: Sequence[str]) -> int:
    """Read and decode each file with Pillow, nothing else (the bound's work, also in a pool)."""
    from multigpu.core import data

    for path in paths:
        with open(path, "rb") as f:
            data.decode(f.read())
    return len(paths)


class DecodeBound:
    """Read + decode ``paths`` as fast as Pillow can in ``processes`` processes (0: this one).

    A context manager: the pool starts on entry, so its start-up is never timed (as with a
    loader's persistent workers). Each process decodes an equal share of the files.
    """

    def __init__(self, paths: Sequence[str], processes: int) -> None:
        self.paths, self.processes = list(paths), processes
        self.pool: Any = None

    def __enter__(self) -> DecodeBound:
        if self.processes > 0:
            self.pool = multiprocessing.get_context("spawn").Pool(self.processes)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()

    def images_per_s(self) -> float:
        """Read and decode every file once; images per second over all processes."""
        t0 = time.perf_counter()
        if self.pool is None:
            n = decode_files(self.paths)
        else:
            n = sum(self.pool.map(decode_files, [self.paths[i :: self.processes] for i in range(self.processes)]))
        return n / (time.perf_counter() - t0)


def bench_pipeline(plan: Plan, deadline: float) -> Section:
    """Section 1: the default input pipeline against the read + decode bound, interleaved."""
    from multigpu.core import data, training
    from multigpu.labs.lab2 import profiling

    section = Section("pipeline", "Input pipeline: JPEG read + decode + augment vs read + decode alone")
    root = data.ensure_dataset()
    dataset = data.JPEGFolder(root, data.train_transform(training.REFERENCE.image_size), split="train")
    loader = data.make_loader(dataset, training.REFERENCE.batch_size)  # every other setting at its default
    warmup = 1
    batches = list(itertools.islice(iter(cast(Iterable[list[int]], loader.batch_sampler)), warmup, warmup + plan.pipeline_batches))
    paths = [dataset.samples[i][0] for batch in batches for i in batch]  # exactly the files a timed run loads
    workers = loader.num_workers
    # Where the loader's time beyond read + decode goes: its batch step alone, on samples decoded
    # beforehand (crop, flip, normalise: the loader's own collate), and the part of it no loader
    # that hands out normalised float32 images can skip (uint8 -> float32, normalise; no augmentation).
    decoded = [[dataset[i] for i in batch] for batch in batches]
    plain = data.val_transform(training.REFERENCE.image_size)
    stacked = [plain.stack([image for image, _ in batch]) for batch in decoded]
    section.notes += _pipeline_notes(loader, len(paths), warmup)

    def per_image_us(step: Callable[[Any], Any], inputs: Sequence[Any]) -> float:
        t0 = time.perf_counter()
        for x in inputs:
            step(x)
        return 1e6 * (time.perf_counter() - t0) / len(paths)

    rates: dict[str, list[float]] = {"loader": [], "bound": [], "batch step": [], "conversion": []}
    order = interleave(list(rates), plan.pipeline_repeats)
    with DecodeBound(paths, workers) as bound, steps("pipeline", len(order)) as log:
        measure: dict[str, Callable[[], float]] = {
            "loader": lambda: profiling.loader_images_per_s(loader, batches=plan.pipeline_batches, warmup=warmup),
            "bound": bound.images_per_s,
            "batch step": lambda: per_image_us(loader.collate_fn, decoded),
            "conversion": lambda: per_image_us(plain.batch, stacked),
        }
        for run in measure.values():
            run()
        for r, name in order:
            rates[name].append(measure[name]())
            unit = "images/s" if name in ("loader", "bound") else "us"
            log.finished(f"{name}, repeat {r + 1}/{plan.pipeline_repeats}: {fmt(rates[name][-1], unit)}")
    section.figures = _pipeline_figures(rates)
    return section


def _pipeline_notes(loader: Any, images: int, warmup: int) -> list[str]:
    """What section 1 measures and how, as its notes say it."""
    workers = loader.num_workers
    return [
        f"`data.make_loader` defaults: batch size {loader.batch_size} (the reference), {workers} loader worker "
        f"process(es); {images} images of the generated set per run after {warmup} warm-up batch.",
        f"Bound: the same files read and decoded by Pillow in a tight loop in "
        f"{f'{workers} processes' if workers else 'the main process'} (as many as the loader uses), no augmentation.",
        "Batch step: the loader's `collate` (crop, flip, normalise into the float32 batch) on the same images "
        "decoded beforehand; conversion: `val_transform`'s batch step (uint8 -> float32, normalise, nothing "
        "random), what any loader that hands out normalised float32 images must do. The ceiling is the bound's "
        "time per image over that time plus the conversion's; 'the rest per image' is the loader's time per "
        "image less the bound's and the batch step's (the DataLoader's bookkeeping, the copy out of Pillow).",
        "One untimed round of each first (page cache, start-up).",
    ]


def _pipeline_figures(rates: dict[str, list[float]]) -> list[Figure]:
    """Section 1's figures from its rates: the loader against its bound, and where the time per image goes."""
    loader_us = [1e6 / x for x in rates["loader"]]
    bound_us = [1e6 / x for x in rates["bound"]]
    return [
        Figure("read + decode + augment (default DataLoader)", "images/s", rates["loader"]),
        Figure("read + decode bound (Pillow alone)", "images/s", rates["bound"]),
        Figure("pipeline / bound", "ratio", [a / b for a, b in zip(rates["loader"], rates["bound"])], Target(">=", 0.9)),
        Figure("read + decode, per image", "us", bound_us),
        Figure("batch step (crop, flip, normalise), per image", "us", rates["batch step"]),
        Figure("the rest, per image (DataLoader bookkeeping, copy out of Pillow)", "us",
               [total - b - c for total, b, c in zip(loader_us, bound_us, rates["batch step"])]),
        Figure("uint8 -> normalised float32 alone (no augmentation), per image", "us", rates["conversion"]),
        Figure("ceiling of a loader that hands out normalised float32: bound / (bound + conversion)", "ratio",
               [b / (b + c) for b, c in zip(bound_us, rates["conversion"])],
               note="per repeat; what read + decode and the unavoidable conversion alone allow"),
    ]


