"""Datasets over image folders (stages 1-2 of the input pipeline: read, decode) and in memory."""

from __future__ import annotations

import copy
import io
import os
from collections.abc import Callable, Sequence, Sized
from pathlib import Path
from typing import Any, cast

import torch
from PIL import Image
from torch.utils.data import Dataset

from multigpu.core.data.transforms import ImageTransform
from multigpu.core.models import CPU_IMAGE_SIZE

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp", ".tif", ".tiff")


def decode(data: bytes, size: int | None = None) -> Image.Image:
    """Decode image bytes (JPEG or anything Pillow reads) to an RGB PIL image.

    With ``size`` (the side the transform will resize to), a JPEG at least twice as large on
    both sides is decoded at 1/2, 1/4 or 1/8 scale, whichever keeps both sides >= ``size``
    (Pillow's draft mode: the JPEG decoder scales while it decodes, several times faster than
    decoding everything and resizing). A 500x375 photo for a 64x64 model decoded 2.3x faster,
    pixels within 1/255 on average after the resize; the generated 64x64 set is unaffected.
    """
    with Image.open(io.BytesIO(data)) as im:
        if size is not None and min(im.size) >= 2 * size and im.format == "JPEG":
            im.draft("RGB", (size, size))
        return im.convert("RGB")


def find_classes(directory: str | os.PathLike) -> tuple[list[str], dict[str, int]]:
    """Sorted class folder names of an ImageFolder directory and their labels."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"no such directory: {directory}")
    names = sorted(e.name for e in os.scandir(directory) if e.is_dir() and not e.name.startswith("."))
    if not names:
        raise FileNotFoundError(f"{directory} has no class sub-folders (expected {directory}/<class>/*.jpg)")
    return names, {n: i for i, n in enumerate(names)}


class JPEGFolder(Dataset):
    """A torch Dataset over any ImageFolder directory: ``root/<class>/<image>``.

    Stages (timed separately in Lab 2): :meth:`read` returns the file's bytes, :func:`decode`
    turns them into an RGB PIL image, ``transform`` (if any) turns that into a tensor.
    ``dataset[i]`` runs all three and returns ``(image, label)``; without a transform the image
    is the PIL image. With one of the course's transforms (:func:`train_transform`,
    :func:`val_transform`) the image is :class:`Pixels` (uint8, not yet augmented): the
    loader's :func:`collate` augments and normalises the whole batch at once (:func:`finish`
    does it for one image). Any other callable is applied as it is. ``root`` is a split folder such as
    ``.../train``; pass a data set root together with ``split="train"`` as a shortcut.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        transform: Callable[[Image.Image], Any] | None = None,
        *,
        split: str | None = None,
        extensions: Sequence[str] = IMAGE_EXTENSIONS,
    ) -> None:
        self.root = Path(root) / split if split else Path(root)
        self.transform = transform
        self.classes, self.class_to_idx = find_classes(self.root)
        exts = tuple(e.lower() for e in extensions)
        self.samples: list[tuple[str, int]] = []
        for name in self.classes:
            files = sorted(
                os.path.join(dirpath, f)
                for dirpath, _, fnames in os.walk(self.root / name, followlinks=True)
                for f in fnames
                if f.lower().endswith(exts)
            )
            self.samples.extend((f, self.class_to_idx[name]) for f in files)
        if not self.samples:
            raise FileNotFoundError(f"no images with extensions {exts} under {self.root}/<class>/")
        self.targets = [label for _, label in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def first_per_class(self, count: int) -> JPEGFolder:
        """The same folder limited to the first ``count`` images (in file-name order) of each class."""
        subset = copy.copy(self)
        taken: dict[int, int] = {}
        subset.samples = []
        for path, label in self.samples:
            if taken.get(label, 0) < count:
                taken[label] = taken.get(label, 0) + 1
                subset.samples.append((path, label))
        subset.targets = [label for _, label in subset.samples]
        return subset

    def read(self, index: int) -> bytes:
        """Stage 1: the raw bytes of image ``index``."""
        with open(self.samples[index][0], "rb") as f:
            return f.read()

    @staticmethod
    def decode(data: bytes, size: int | None = None) -> Image.Image:
        """Stage 2: bytes -> RGB PIL image (same as the module-level :func:`decode`)."""
        return decode(data, size)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        transform = self.transform
        if isinstance(transform, ImageTransform):
            # Pixels: the loader's collate augments and normalises the whole batch at once
            return transform.sample(decode(self.read(index), transform.size)), self.samples[index][1]
        image: Any = decode(self.read(index))
        if transform is not None:
            image = transform(image)
        return image, self.samples[index][1]

    def __repr__(self) -> str:
        return f"JPEGFolder({str(self.root)!r}, {len(self)} images, {len(self.classes)} classes)"


class SyntheticImages(Dataset):
    """Random images already in memory as normalised tensors: compute-only timing, no I/O.

    Holds a pool of at most ``pool`` distinct images (so 224x224 sets stay small) and returns
    ``(pool[i % pool], i % classes)``; deterministic by ``seed``.
    """

    def __init__(
        self, n: int = 1024, image_size: int = CPU_IMAGE_SIZE, classes: int = 10, *, seed: int = 0, pool: int = 64
    ) -> None:
        self.n, self.image_size, self.num_classes = int(n), int(image_size), int(classes)
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randn(min(pool, self.n), 3, self.image_size, self.image_size, generator=g)
        self.classes = [str(c) for c in range(self.num_classes)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < self.n:
            raise IndexError(index)
        return self.images[index % len(self.images)], index % self.num_classes


class WithIndex(Dataset):
    """``(image, label, index)`` from a dataset of ``(image, label)``: which sample was trained on
    (Lab 4's elastic script records it; the assessment's starter has its own copy, so that a
    learner's script shows all it does)."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self.classes = getattr(dataset, "classes", None)

    def __len__(self) -> int:
        return len(cast(Sized, self.dataset))

    def __getitem__(self, i: int):
        image, label = self.dataset[i]
        return image, label, i
