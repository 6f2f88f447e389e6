"""Stage 3-4 of the input pipeline: transforms (augmentation on uint8 pixels) and the batch collate."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import default_collate

from multigpu.core.models import CPU_IMAGE_SIZE

#: Channel mean and standard deviation used to normalise inputs (the usual ImageNet values).
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


class Compose:
    """Apply transforms in order."""

    def __init__(self, transforms: Sequence[Callable]) -> None:
        self.transforms = list(transforms)

    def __call__(self, x: Any) -> Any:
        for t in self.transforms:
            x = t(x)
        return x

    def __repr__(self) -> str:
        return "Compose(" + ", ".join(repr(t) for t in self.transforms) + ")"


class Resize:
    """PIL: scale so the shorter side is ``size`` (no-op when it already is)."""

    def __init__(self, size: int) -> None:
        self.size = int(size)

    def __call__(self, img: Image.Image) -> Image.Image:
        w, h = img.size
        if min(w, h) == self.size:
            return img
        if w <= h:
            new = (self.size, max(1, round(h * self.size / w)))
        else:
            new = (max(1, round(w * self.size / h)), self.size)
        return img.resize(new, Image.Resampling.BILINEAR)

    def __repr__(self) -> str:
        return f"Resize({self.size})"


class CenterCrop:
    """PIL: the central ``size`` x ``size`` square."""

    def __init__(self, size: int) -> None:
        self.size = int(size)

    def __call__(self, img: Image.Image) -> Image.Image:
        w, h = img.size
        if (w, h) == (self.size, self.size):
            return img
        left, top = (w - self.size) // 2, (h - self.size) // 2
        return img.crop((left, top, left + self.size, top + self.size))

    def __repr__(self) -> str:
        return f"CenterCrop({self.size})"


class ToTensor:
    """PIL RGB image -> float32 tensor (3, H, W) in [0, 1]."""

    def __call__(self, img: Image.Image) -> torch.Tensor:
        arr = np.asarray(img.convert("RGB"), dtype=np.uint8)
        return torch.from_numpy(arr.copy()).permute(2, 0, 1).float().div_(255.0)

    def __repr__(self) -> str:
        return "ToTensor()"


class Normalize:
    """Tensor: ``(x - mean) / std`` per channel (returns a new tensor)."""

    def __init__(self, mean: Sequence[float] = MEAN, std: Sequence[float] = STD) -> None:
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean.flatten().tolist()}, std={self.std.flatten().tolist()})"


class RandomCrop:
    """Tensor (C, H, W): pad by ``padding`` with zeros (the mean after normalising), then crop a
    random ``size`` x ``size`` window. Uses torch's global RNG (seeded per DataLoader worker)."""

    def __init__(self, size: int, padding: int = 0) -> None:
        self.size, self.padding = int(size), int(padding)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        p = self.padding
        if p:
            x = torch.nn.functional.pad(x, (p, p, p, p))
        h, w = x.shape[-2:]
        if h < self.size or w < self.size:
            raise ValueError(f"image {h}x{w} is smaller than the crop {self.size}")
        top = int(torch.randint(0, h - self.size + 1, (1,)))
        left = int(torch.randint(0, w - self.size + 1, (1,)))
        return x[..., top : top + self.size, left : left + self.size].contiguous()

    def __repr__(self) -> str:
        return f"RandomCrop({self.size}, padding={self.padding})"


class RandomHorizontalFlip:
    """Tensor: mirror left-right with probability ``p`` (torch's global RNG)."""

    def __init__(self, p: float = 0.5) -> None:
        self.p = float(p)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if float(torch.rand(())) < self.p:
            return x.flip(-1)
        return x

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip(p={self.p})"


class Pixels:
    """One image's pixels, not yet augmented or normalised: ``size`` x ``size`` RGB, uint8.

    What a :class:`JPEGFolder` with one of the course's transforms returns per sample. Per
    image the pipeline only copies the pixels out of the decoded image (as Pillow holds them,
    4 bytes per pixel: R, G, B and an unused byte); the rest of the transform (random crop,
    flip, normalisation) runs once per batch in :func:`collate`, vectorised. It carries the
    :class:`ImageTransform` that finishes it, so it passes through any wrapper dataset (one
    that adds the sample's index, say) to the batch step.

    It is deliberately not a tensor: in the loader, making a torch tensor per image cost more
    than all the per-batch work together (measured on the 2-core machine). For one image:
    :meth:`finish` gives the float tensor the model takes, :meth:`numpy` the uint8 pixels
    ``(3, size, size)`` (``np.asarray(pixels)`` too).
    """

    __slots__ = ("data", "transform")
    dtype = torch.uint8

    def __init__(self, data: bytes, transform: ImageTransform) -> None:
        self.data, self.transform = data, transform

    @property
    def shape(self) -> tuple[int, int, int]:
        return (3, self.transform.size, self.transform.size)

    def numpy(self) -> np.ndarray:
        """The pixels as a read-only uint8 array ``(3, size, size)`` (a view, no copy)."""
        s = self.transform.size
        return np.frombuffer(self.data, np.uint8).reshape(s, s, 4)[..., :3].transpose(2, 0, 1)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        a = self.numpy()
        return a.astype(dtype) if dtype is not None else (a.copy() if copy else a)

    def finish(self) -> torch.Tensor:
        """This image as its transform delivers it: float32 ``(3, size, size)``, augmented, normalised."""
        return self.transform.batch(self.transform.stack([self]))[0]

    def __repr__(self) -> str:
        return f"Pixels(uint8 {self.shape}, {self.transform!r})"


class ImageTransform:
    """The course's image transform, split into a per-image half and a per-batch half.

    - :meth:`sample` (per image, in the loader's ``dataset[i]``): shorter side to ``size`` and
      the centre square (skipped when the image already is ``size`` x ``size``, as the
      generated set's are), then the pixels, copied out of Pillow once: a :class:`Pixels`.
    - :meth:`stack` (per batch, in :func:`collate`): the batch's pixels side by side, uint8
      ``(B, 3, size, size)``.
    - :meth:`batch` (per batch, in :func:`collate`): a random horizontal flip (probability
      ``flip_p``) and a random ``size`` x ``size`` crop of the image zero-padded by
      ``padding`` pixels, both drawn per image, then ``(x / 255 - mean) / std`` per channel:
      float32 ``(B, 3, size, size)``. The padding is zero AFTER normalising (the mean colour),
      as with :class:`RandomCrop` after :class:`Normalize`.
    - Calling the transform on one PIL image does all three: the normalised float32
      ``(3, size, size)`` tensor that ``Compose([Resize, CenterCrop, ToTensor, Normalize,
      RandomCrop, RandomHorizontalFlip])`` gives, up to float rounding.

    Why the split: for the generated 64x64 images, per-image float conversion, normalisation,
    padding, cropping and flipping cost twice the JPEG decode; in the loader, the per-image
    half costs about 5 us and the per-batch half about 20 us per image next to a read + decode
    of about 100 us (CPU time, busy 2-core machine). The random numbers come from torch's
    global generator (seeded per DataLoader worker): one crop offset and one flip per image,
    so a seed fixes them, as before.
    """

    def __init__(
        self,
        size: int = CPU_IMAGE_SIZE,
        *,
        padding: int = 0,
        flip_p: float = 0.0,
        mean: Sequence[float] = MEAN,
        std: Sequence[float] = STD,
    ) -> None:
        self.size, self.padding, self.flip_p = int(size), int(padding), float(flip_p)
        self.mean, self.std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        # (x / 255 - mean) / std as x * scale + shift, per channel, in float32.
        std32 = [np.float32(s) for s in self.std]
        self._scale = [np.float32(1.0) / (np.float32(255.0) * s) for s in std32]
        self._shift = [-np.float32(m) / s for m, s in zip(self.mean, std32)]
        self._fit = Compose([Resize(self.size), CenterCrop(self.size)])

    @property
    def random(self) -> bool:
        """Whether :meth:`batch` draws random numbers (training) or not (evaluation)."""
        return self.padding > 0 or self.flip_p > 0

    def sample(self, img: Image.Image) -> Pixels:
        """Per image: the ``size`` x ``size`` RGB pixels of ``img`` as :class:`Pixels`."""
        s = self.size
        if img.size != (s, s):
            img = self._fit(img)
        if img.mode != "RGB":
            img = img.convert("RGB")
        return Pixels(_rgbx_bytes(img), self)

    def stack(self, pixels: Sequence[Pixels]) -> torch.Tensor:
        """Per batch: the pixels of ``pixels`` side by side, uint8 ``(B, 3, size, size)``.

        One copy of every image's bytes; the result is a channel-first view of them (4 bytes
        per pixel, as Pillow keeps RGB), which :meth:`batch` reads without another copy.
        """
        s = self.size
        joined = bytearray().join([p.data for p in pixels])
        rgbx = torch.frombuffer(joined, dtype=torch.uint8) if joined else torch.empty(0, dtype=torch.uint8)
        return rgbx.as_strided((len(pixels), 3, s, s), (4 * s * s, 1, 4 * s, 4))

    def batch(self, x: torch.Tensor) -> torch.Tensor:
        """Per batch: uint8 ``(B, 3, size, size)`` -> augmented, normalised float32 (``x`` is not changed)."""
        s = self.size
        if x.dtype != torch.uint8 or x.dim() != 4 or tuple(x.shape[1:]) != (3, s, s):
            raise ValueError(f"expected uint8 images of shape (B, 3, {s}, {s}), got {x.dtype} {tuple(x.shape)}")
        b = x.shape[0]
        in_place = x.stride() == (4 * s * s, 1, 4 * s, 4) and (
            x.untyped_storage().nbytes() >= x.storage_offset() + 4 * s * s * b
        )
        if in_place:  # laid out as stack() gives it: read its 4-byte pixels where they are
            rgbx = x.as_strided((b, s, s, 4), (4 * s * s, 4 * s, 4, 1)).numpy()
        else:  # any other layout: copy into that one first
            rgbx = np.zeros((b, s, s, 4), np.uint8)
            rgbx[..., :3] = x.permute(0, 2, 3, 1).numpy()
        return self._finish(rgbx)

    def batch_pixels(self, pixels: Sequence[Pixels]) -> torch.Tensor:
        """``batch(stack(pixels))`` in one step, as the loader's :func:`collate` runs it: with
        augmentation, each image's crop window is copied straight from its own bytes."""
        s = self.size
        if self.random:
            return self._finish([np.frombuffer(p.data, np.uint8).reshape(s, s, 4) for p in pixels])
        return self._finish(np.frombuffer(b"".join([p.data for p in pixels]), np.uint8).reshape(-1, s, s, 4))

    def _finish(self, images: np.ndarray | Sequence[np.ndarray]) -> torch.Tensor:
        """The batch step on uint8 pixels ``(size, size, 4)`` (R, G, B, unused): an array of B
        images or a list of them. Each image is copied once into the float32 batch (its crop
        window, flipped or not, channel-first); then the whole batch is normalised, one channel
        at a time; last, what a crop took from the padding is set to zero.

        NumPy rather than torch: its element-wise operations stay on one thread, while torch
        split them over every core, which on a busy machine was several times slower than one
        thread; and between JPEG decodes each torch call costs tens of microseconds, so the
        batch makes two (measured on the 2-core machine).
        """
        b, s, p = len(images), self.size, self.padding
        out = np.empty((b, 3, s, s), np.float32)
        cuts: list[tuple[int, int, int]] = []
        if not self.random:
            rgbx = np.asarray(images)
            for c in range(3):
                np.copyto(out[:, c], rgbx[..., c])  # uint8 -> float32, channel-last -> channel-first
        else:
            u = torch.rand(b, 3).numpy()  # torch's generator, as RandomCrop and RandomHorizontalFlip use
            flips = (u[:, 0] < self.flip_p).tolist()
            shifts = ((u[:, 1:] * (2 * p + 1)).astype(np.int64) - p).tolist()  # uniform in -p..p
            for i in range(b):
                image = images[i][:, ::-1] if flips[i] else images[i]
                dy, dx = shifts[i]
                # The crop of the padded image at offset (p + dy, p + dx) is the image moved by
                # (-dy, -dx): copy the part that stays inside; the rest is padding.
                h, w, y, x = s - abs(dy), s - abs(dx), max(0, -dy), max(0, -dx)
                window = image[max(0, dy) : max(0, dy) + h, max(0, dx) : max(0, dx) + w, :3]
                out[i, :, y : y + h, x : x + w] = window.transpose(2, 0, 1)
                if dy or dx:
                    cuts.append((i, dy, dx))
        with np.errstate(invalid="ignore", over="ignore"):  # the padding holds garbage until zeroed below
            for c in range(3):
                plane = out[:, c]
                plane *= self._scale[c]
                plane += self._shift[c]
        for i, dy, dx in cuts:  # the padding: zero after normalising (the mean colour)
            image = out[i]
            if dy > 0:
                image[:, s - dy :] = 0.0
            elif dy < 0:
                image[:, :-dy] = 0.0
            if dx > 0:
                image[:, :, s - dx :] = 0.0
            elif dx < 0:
                image[:, :, :-dx] = 0.0
        return torch.from_numpy(out)

    def __call__(self, img: Image.Image) -> torch.Tensor:
        return self.sample(img).finish()

    def __repr__(self) -> str:
        return (
            f"ImageTransform({self.size}, padding={self.padding}, flip_p={self.flip_p}, "
            f"mean={list(self.mean)}, std={list(self.std)})"
        )


def _rgbx_bytes(img: Image.Image) -> bytes:
    """The pixels of an RGB image as Pillow holds them: 4 bytes each (R, G, B, unused).

    Calls Pillow's raw encoder directly: ``img.tobytes("raw", "RGBX")`` gives the same bytes
    but its Python layers cost three times the copy itself, once per image.
    """
    w, h = img.size
    try:
        encoder = Image.core.raw_encoder("RGB", "RGBX")
        encoder.setimage(img.im, (0, 0, w, h))
        _, status, data = encoder.encode(4 * w * h)
        if status == 1:  # all of it in one piece
            return data
    except (AttributeError, TypeError, ValueError):  # another Pillow: the public way below
        pass
    return img.tobytes("raw", "RGBX")


def train_transform(
    size: int = CPU_IMAGE_SIZE, *, padding: int | None = None, flip: bool = True, mean=MEAN, std=STD
) -> ImageTransform:
    """Training augmentation: shorter side to ``size``, centre square, random crop of the image
    zero-padded by ``padding`` (default ``size // 8``), random horizontal flip, normalise.

    Per image only the pixels are taken; the rest runs once per batch (see :class:`ImageTransform`).
    """
    padding = size // 8 if padding is None else padding
    return ImageTransform(size, padding=padding, flip_p=0.5 if flip else 0.0, mean=mean, std=std)


def val_transform(size: int = CPU_IMAGE_SIZE, *, mean=MEAN, std=STD) -> ImageTransform:
    """Evaluation: shorter side to ``size``, centre square, normalise (no randomness)."""
    return ImageTransform(size, mean=mean, std=std)


def finish(image: Any) -> Any:
    """One sample's image as the model takes it: :meth:`Pixels.finish` for :class:`Pixels`,
    anything else unchanged. For code that uses ``dataset[i]`` one sample at a time."""
    return image.finish() if isinstance(image, Pixels) else image


def _collate_pixels(column: Sequence[Pixels]) -> torch.Tensor:
    """The batch step of a column of :class:`Pixels`: stack them, then finish them together with
    their transform (each with its own when they come from different transforms)."""
    transform = column[0].transform
    if all(p.transform is transform for p in column):
        return transform.batch_pixels(column)
    return torch.stack([p.finish() for p in column])


def collate(samples: list[Any]) -> Any:
    """Stage 4: stack a list of samples such as ``(image, label)`` or ``(image, label, index)``
    into batch tensors (a list with one tensor per field, as ``default_collate`` gives).

    Images that are still :class:`Pixels` are stacked and finished here, once for the whole
    batch, by their transform (:meth:`ImageTransform.batch`): the batch comes out augmented
    and normalised, float32. Anything else goes to torch's ``default_collate``.
    """
    first = samples[0] if len(samples) else None
    if isinstance(first, Pixels):
        return _collate_pixels(samples)
    if isinstance(first, (tuple, list)) and any(isinstance(f, Pixels) for f in first):
        return [
            _collate_pixels(column) if isinstance(column[0], Pixels) else default_collate(list(column))
            for column in zip(*samples)
        ]
    return default_collate(samples)


