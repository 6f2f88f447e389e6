"""The course's image data: a procedural JPEG data set, ImageFolder loaders and transforms.

No data set can be downloaded, so the default one is drawn on the machine: ten shape classes
(circle, ring, triangle, ...), a bright shape of random colour on a dark gradient background,
with random position, scale, rotation, mirroring, clutter, blur, noise and a random JPEG quality,
written as real JPEG files in ImageFolder layout::

    root/meta.json                 generation parameters and format version
    root/train/<class>/<class>_00000.jpg
    root/val/<class>/<class>_00000.jpg

Generation is deterministic: every image is drawn from its own random stream, seeded by
``(seed, split, class, index)``, so the same parameters give byte-identical files and a split
can be generated alone (the grader makes a held-out validation set with its own seed:
``generate_dataset(root, seed=1234, train_per_class=0, val_per_class=200)``).

The loaders work on ANY ImageFolder directory of JPEG (or other Pillow-readable) files, e.g.
CIFAR-10 or Imagenette exported as JPEG folders. The input pipeline is split into stages that
Lab 2 times one by one: :meth:`JPEGFolder.read` (file -> bytes), :func:`decode`
(bytes -> RGB PIL image), a transform (PIL -> normalised tensor, with augmentation) and
:func:`collate` (list of samples -> batch). Everything is torch + Pillow; torchvision is not used.

The package is split by stage: :mod:`~multigpu.core.data.generate` (drawing and caching the data
set), :mod:`~multigpu.core.data.datasets` (reading and decoding), :mod:`~multigpu.core.data.transforms`
(augmentation and collate) and :mod:`~multigpu.core.data.loader` (the DataLoader); everything is
importable from ``multigpu.core.data`` itself.

The course's transforms do as little as possible per image, because per-image work is what
caps a loader below its JPEG decoder: :meth:`ImageTransform.sample` only copies the pixels out
of the decoded image (:class:`Pixels`, uint8); :func:`collate` then crops, flips and normalises
the whole batch in a few vectorised operations (:meth:`ImageTransform.batch`).
"""

from __future__ import annotations

from .datasets import (  # noqa: F401
    IMAGE_EXTENSIONS,
    JPEGFolder,
    SyntheticImages,
    WithIndex,
    decode,
    find_classes,
)
from .generate import (  # noqa: F401
    DEFAULTS,
    FORMAT_VERSION,
    GENERATOR,
    SHAPES,
    STYLE,
    class_names,
    data_home,
    dataset_name,
    dataset_params,
    default_data_dir,
    encode_jpeg,
    ensure_dataset,
    generate_dataset,
    image_rng,
    read_meta,
    render_image,
)
from .loader import (  # noqa: F401
    load_datasets,
    make_loader,
)
from .transforms import (  # noqa: F401
    MEAN,
    STD,
    CenterCrop,
    Compose,
    ImageTransform,
    Normalize,
    Pixels,
    RandomCrop,
    RandomHorizontalFlip,
    Resize,
    ToTensor,
    collate,
    finish,
    train_transform,
    val_transform,
)
