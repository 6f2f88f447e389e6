"""Tests of the procedural JPEG data set, the ImageFolder loader and the transforms."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from multigpu.core import data

SMALL = dict(classes=3, train_per_class=4, val_per_class=2, image_size=32)


def digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_generation_is_deterministic_by_seed(tmp_path):
    a = data.generate_dataset(tmp_path / "a", seed=1, progress=False, **SMALL)
    b = data.generate_dataset(tmp_path / "b", seed=1, progress=False, **SMALL)
    c = data.generate_dataset(tmp_path / "c", seed=2, progress=False, **SMALL)
    da, db, dc = digest(a), digest(b), digest(c)
    assert da == db, "same seed and parameters must give byte-identical files"
    images = [k for k in da if k.endswith(".jpg")]
    assert len(images) == 3 * (4 + 2)
    assert all(da[k] != dc[k] for k in images), "another seed must give other images"


def test_layout_meta_and_jpeg_validity(tmp_path):
    root = data.generate_dataset(tmp_path / "d", seed=0, progress=False, **SMALL)
    names = data.class_names(3)
    for split, n in (("train", 4), ("val", 2)):
        assert sorted(p.name for p in (root / split).iterdir()) == names
        for name in names:
            files = sorted((root / split / name).glob("*.jpg"))
            assert len(files) == n
            for f in files:
                assert f.read_bytes()[:2] == b"\xff\xd8", "not a JPEG file"
                with Image.open(f) as im:
                    assert im.format == "JPEG" and im.mode == "RGB" and im.size == (32, 32)
    meta = json.loads((root / "meta.json").read_text())
    assert meta["format_version"] == data.FORMAT_VERSION
    assert meta["params"] == {**SMALL, "seed": 0}
    assert meta["class_names"] == names


def test_split_only_generation_matches_full_generation(tmp_path):
    full = data.generate_dataset(tmp_path / "full", seed=5, progress=False, **SMALL)
    val_only = data.generate_dataset(
        tmp_path / "val", seed=5, classes=3, train_per_class=0, val_per_class=2, image_size=32, progress=False
    )
    assert not (val_only / "train").exists()
    dv, df = digest(val_only), digest(full)
    vals = [k for k in dv if k.endswith(".jpg")]
    assert len(vals) == 6 and all(dv[k] == df[k] for k in vals)
    # Train and val images are drawn from different streams: no leak between splits.
    assert set(df[k] for k in df if k.startswith("train")).isdisjoint(dv[k] for k in vals)


def test_ensure_dataset_caches_and_regenerates(tmp_path, monkeypatch):
    monkeypatch.setenv("MULTIGPU_DATA", str(tmp_path / "cache"))
    root = data.ensure_dataset(progress=False, **SMALL)
    assert root == data.default_data_dir(**SMALL)
    assert root.parent == tmp_path / "cache"
    stamp = (root / "meta.json").stat().st_mtime_ns
    assert data.ensure_dataset(progress=False, **SMALL) == root
    assert (root / "meta.json").stat().st_mtime_ns == stamp, "a complete cached set must not be regenerated"
    # A damaged cache (missing image) is regenerated in place.
    next((root / "train").rglob("*.jpg")).unlink()
    data.ensure_dataset(root, progress=False, **SMALL)
    assert len(list((root / "train").rglob("*.jpg"))) == 12
    # Other parameters -> another directory.
    assert data.default_data_dir(**{**SMALL, "seed": 9}) != root


def test_ensure_dataset_refuses_foreign_directory(tmp_path):
    own = tmp_path / "mine" / "cat"
    own.mkdir(parents=True)
    (own / "x.jpg").write_bytes(b"not ours")
    with pytest.raises(FileExistsError):
        data.ensure_dataset(tmp_path / "mine", progress=False, **SMALL)
    assert (own / "x.jpg").read_bytes() == b"not ours"


def _ensure(root: str) -> str:
    return str(data.ensure_dataset(root, progress=False, **SMALL))


@pytest.mark.slow
def test_ensure_dataset_is_safe_across_processes(tmp_path):
    root = str(tmp_path / "shared")
    with mp.get_context("fork").Pool(3) as pool:
        out = pool.map(_ensure, [root] * 3)
    assert out == [root] * 3
    assert len(list(Path(root).rglob("*.jpg"))) == 18
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name], "temporary folders left behind"


def make_folder(root: Path) -> Path:
    """A tiny ImageFolder of non-square JPEGs and one PNG, as a learner's own data might be."""
    rng = np.random.default_rng(0)
    for cls, n in (("dog", 3), ("cat", 2)):
        (root / cls).mkdir(parents=True)
        for i in range(n):
            arr = rng.integers(0, 256, size=(40, 50, 3), dtype=np.uint8)
            Image.fromarray(arr).save(root / cls / f"{i}.jpg", quality=90)
    Image.fromarray(np.zeros((30, 30), np.uint8)).save(root / "cat" / "gray.png")  # grayscale -> RGB
    (root / "cat" / "notes.txt").write_text("ignored")
    return root


def test_jpegfolder_on_any_imagefolder(tmp_path):
    ds = data.JPEGFolder(make_folder(tmp_path / "imgs"))
    assert ds.classes == ["cat", "dog"] and ds.class_to_idx == {"cat": 0, "dog": 1}
    assert len(ds) == 6 and [s[1] for s in ds.samples] == [0, 0, 0, 1, 1, 1]
    raw = ds.read(3)
    assert isinstance(raw, bytes) and raw[:2] == b"\xff\xd8"
    img = ds.decode(raw)
    assert img.mode == "RGB" and img.size == (50, 40)
    pil, label = ds[2]
    assert pil.mode == "RGB" and label == 0
    ds.transform = data.val_transform(32)
    pixels, label = ds[4]
    assert isinstance(pixels, data.Pixels) and pixels.shape == (3, 32, 32) and label == 1
    x = data.finish(pixels)
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32
    with pytest.raises(FileNotFoundError):
        data.JPEGFolder(tmp_path / "missing")


def test_first_per_class_keeps_the_first_images_of_each_class_and_the_folder_whole(tmp_path):
    ds = data.JPEGFolder(make_folder(tmp_path / "imgs"))
    two = ds.first_per_class(2)
    assert two.samples == [ds.samples[0], ds.samples[1], ds.samples[3], ds.samples[4]]
    assert two.targets == [0, 0, 1, 1] and two.classes == ds.classes and len(ds) == 6
    assert two[3][1] == 1 and len(ds.first_per_class(10)) == 6


def test_the_scripts_take_a_slice_of_a_given_folder_per_class(tmp_path):
    from multigpu.running.scripts import common

    root = data.generate_dataset(tmp_path / "d", seed=1, progress=False, **SMALL)
    args = common.parser("t").parse_args(["--data", str(root), "--train-per-class", "3", "--val-per-class", "1"])
    train, val = common.datasets(args, 0)
    assert len(train) == 3 * 3 and len(val) == 3 * 1 and sorted(set(train.targets)) == [0, 1, 2]
    whole, _ = common.datasets(common.parser("t").parse_args(["--data", str(root)]), 0)
    assert len(whole) == 3 * 4


def test_val_transform_normalises_exactly():
    img = Image.new("RGB", (64, 48), (255, 0, 128))
    x = data.val_transform(32)(img)
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32
    expected = [(v / 255 - m) / s for v, m, s in zip((255, 0, 128), data.MEAN, data.STD)]
    assert torch.allclose(x.mean(dim=(1, 2)), torch.tensor(expected), atol=1e-5)


def test_resize_and_centre_crop_keep_the_middle():
    arr = np.zeros((40, 80, 3), np.uint8)
    arr[:, 30:50] = 255  # a white band in the middle
    out = data.Compose([data.Resize(20), data.CenterCrop(20)])(Image.fromarray(arr))
    assert out.size == (20, 20)
    a = np.asarray(out)
    assert a[:, 8:12].mean() > 200 and a[:, :3].mean() < 30


def test_flip_and_crop_correctness():
    x = torch.arange(2 * 4 * 4, dtype=torch.float32).view(2, 4, 4)
    assert torch.equal(data.RandomHorizontalFlip(p=1.0)(x), x.flip(-1))
    assert torch.equal(data.RandomHorizontalFlip(p=0.0)(x), x)
    torch.manual_seed(0)
    crops = [data.RandomCrop(4, padding=2)(x) for _ in range(30)]
    assert all(c.shape == (2, 4, 4) for c in crops)
    assert any(not torch.equal(c, x) for c in crops), "padding crop never moved the window"
    # Every crop is a window of the zero-padded image.
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for c in crops:
        assert any(torch.equal(c, padded[:, t : t + 4, left : left + 4]) for t in range(5) for left in range(5))


def test_train_transform_is_random_and_shaped():
    img = Image.fromarray(np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8))
    t = data.train_transform(64)
    torch.manual_seed(0)
    outs = [t(img) for _ in range(6)]
    assert all(o.shape == (3, 64, 64) and o.dtype == torch.float32 for o in outs)
    assert len({o.sum().item() for o in outs}) > 1, "augmentation should differ between calls"


def test_synthetic_images_and_collate():
    ds = data.SyntheticImages(10, image_size=16, classes=3, pool=4)
    assert len(ds) == 10
    x, y = ds[5]
    assert x.shape == (3, 16, 16) and y == 2
    assert torch.equal(data.SyntheticImages(10, 16, 3, pool=4)[5][0], x), "same seed, same images"
    assert torch.equal(ds[1][0], x), "index 5 reuses pool image 1 (5 % 4)"
    xb, yb = data.collate([ds[i] for i in range(4)])
    assert xb.shape == (4, 3, 16, 16) and yb.tolist() == [0, 1, 2, 0]
    with pytest.raises(IndexError):
        ds[10]


def test_make_loader_is_deterministic_and_checks_sampler():
    ds = data.SyntheticImages(20, image_size=8, classes=20, pool=1)

    def order(seed):
        return torch.cat([y for _, y in data.make_loader(ds, 6, shuffle=True, seed=seed)]).tolist()

    assert order(3) == order(3) and sorted(order(3)) == list(range(20))
    assert order(3) != order(4)
    assert len(data.make_loader(ds, 6, drop_last=True)) == 3
    with pytest.raises(ValueError):
        data.make_loader(ds, 6, shuffle=True, sampler=torch.utils.data.SequentialSampler(ds))


@pytest.mark.slow
def test_make_loader_with_workers(tmp_path):
    root = data.generate_dataset(tmp_path / "w", seed=0, progress=False, **SMALL)
    ds = data.JPEGFolder(root / "train", data.train_transform(32))
    batches = list(data.make_loader(ds, 5, num_workers=2, shuffle=True))
    assert sum(len(y) for _, y in batches) == 12
    assert batches[0][0].shape == (5, 3, 32, 32)


def test_dataset_params_rejects_unknown():
    with pytest.raises(TypeError):
        data.dataset_params(colours=3)
    with pytest.raises(ValueError):
        data.class_names(11)


# --------------------------------------------------------------------------- the batch path


def reference(size: int) -> data.Compose:
    """The per-image pipeline the course used before the batch path: the semantics to keep."""
    return data.Compose([data.Resize(size), data.CenterCrop(size), data.ToTensor(), data.Normalize()])


def windows(x: torch.Tensor, padding: int) -> list[torch.Tensor]:
    """Every crop of ``x`` zero-padded by ``padding``, flipped or not: what training may give."""
    size = x.shape[-1]
    padded = torch.nn.functional.pad(x, (padding,) * 4)
    crops = [padded[:, t : t + size, left : left + size] for t in range(2 * padding + 1) for left in range(2 * padding + 1)]
    return crops + [c.flip(-1) for c in crops]


def which_window(y: torch.Tensor, candidates: list[torch.Tensor]) -> int:
    hits = [k for k, c in enumerate(candidates) if torch.allclose(y, c, atol=1e-5)]
    assert hits, "an augmented image is no crop (flipped or not) of the padded, normalised image"
    return hits[0]


def test_pixels_are_the_images_bytes_and_finish_like_the_reference(tmp_path):
    ds = data.JPEGFolder(make_folder(tmp_path / "imgs"), data.val_transform(32))
    for i in range(len(ds)):
        pixels, label = ds[i]
        image = data.decode(ds.read(i))
        assert isinstance(pixels, data.Pixels) and pixels.dtype == torch.uint8 and label == ds.samples[i][1]
        fitted = np.asarray(data.Compose([data.Resize(32), data.CenterCrop(32)])(image).convert("RGB"))
        assert np.array_equal(np.asarray(pixels), fitted.transpose(2, 0, 1)), "Pixels must hold the fitted image"
        assert torch.allclose(pixels.finish(), reference(32)(image), atol=1e-5)
    assert data.finish(7) == 7, "finish leaves anything but Pixels alone"


def test_collate_finishes_a_batch_of_a_real_imagefolder(tmp_path):
    """A real ImageFolder of JPEG files on disk: (image, label) batches, normalised as the reference."""
    root = data.generate_dataset(tmp_path / "g", seed=3, progress=False, **SMALL)
    ds = data.JPEGFolder(root, data.val_transform(32), split="train")
    x, y = next(iter(data.make_loader(ds, 12)))
    assert x.shape == (12, 3, 32, 32) and x.dtype == torch.float32 and x.is_contiguous()
    assert y.dtype == torch.int64 and y.tolist() == [label for _, label in ds.samples]
    expected = torch.stack([reference(32)(data.decode(ds.read(i))) for i in range(12)])
    assert torch.allclose(x, expected, atol=1e-5)
    # The exact ImageNet normalisation: a flat colour comes out as (v / 255 - mean) / std.
    flat = data.val_transform(8).batch(torch.full((2, 3, 8, 8), 200, dtype=torch.uint8))
    want = torch.tensor([(200 / 255 - m) / s for m, s in zip(data.MEAN, data.STD)]).view(1, 3, 1, 1)
    assert torch.allclose(flat, want.expand(2, 3, 8, 8), atol=1e-6)


def test_training_batch_crops_and_flips_each_image_on_its_own():
    rng = np.random.default_rng(4)
    image = Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
    t = data.train_transform(32)
    assert t.padding == 4 and t.flip_p == 0.5
    candidates = windows(reference(32)(image), 4)
    torch.manual_seed(0)
    x = data.collate([t.sample(image) for _ in range(64)])
    assert x.shape == (64, 3, 32, 32) and x.dtype == torch.float32
    seen = [which_window(x[i], candidates) for i in range(64)]
    flipped = sum(k >= len(candidates) // 2 for k in seen)
    assert len(set(seen)) > 20, "each image of a batch must get its own crop"
    assert 12 < flipped < 52, f"about half the images should be flipped, got {flipped} of 64"
    # The padding is exactly zero after normalising (the mean colour), as RandomCrop after Normalize.
    assert (x == 0).any()


def test_training_batch_is_deterministic_by_seed_and_batch_equals_collate():
    image = Image.fromarray(np.random.default_rng(5).integers(0, 256, (16, 16, 3), dtype=np.uint8))
    t = data.train_transform(16)
    pixels = [t.sample(image) for _ in range(16)]

    def run(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        return data.collate(pixels)

    assert torch.equal(run(1), run(1)) and not torch.equal(run(1), run(2))
    torch.manual_seed(1)
    via_batch = t.batch(t.stack(pixels))
    assert torch.equal(via_batch, run(1)), "collate must be stack + batch"
    dense = t.stack(pixels).contiguous()  # any layout of a uint8 batch works
    torch.manual_seed(1)
    assert torch.equal(t.batch(dense), via_batch)
    before = dense.clone()
    t.batch(dense)
    assert torch.equal(dense, before), "batch() must not change its input"
    with pytest.raises(ValueError):
        t.batch(dense.float())


def test_with_index_wrapper_gets_normalised_batches_and_indices(tmp_path):
    root = data.generate_dataset(tmp_path / "g", seed=0, progress=False, **SMALL)
    ds = data.WithIndex(data.JPEGFolder(root, data.train_transform(32), split="train"))
    seen = []
    for images, labels, index in data.make_loader(ds, 5, shuffle=True, seed=3):
        assert images.dtype == torch.float32 and images.shape[1:] == (3, 32, 32)
        assert labels.dtype == torch.int64 and index.dtype == torch.int64
        assert labels.tolist() == [ds.dataset.samples[i][1] for i in index.tolist()]
        assert images.abs().max() < 3, "images must be normalised"
        seen += index.tolist()
    assert sorted(seen) == list(range(12))


@pytest.mark.slow
def test_loader_with_workers_is_deterministic_by_seed(tmp_path):
    root = data.generate_dataset(tmp_path / "g", seed=0, progress=False, **SMALL)
    ds = data.JPEGFolder(root, data.train_transform(32), split="train")

    def epoch(seed: int) -> list[torch.Tensor]:
        return [x for x, _ in data.make_loader(ds, 4, shuffle=True, seed=seed, num_workers=2)]

    a, b, c = epoch(7), epoch(7), epoch(8)
    assert all(torch.equal(x, y) for x, y in zip(a, b)), "same seed, same batches (order and augmentation)"
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


def test_in_memory_finishes_pixels(tmp_path):
    from multigpu.labs.lab1 import batching

    root = data.generate_dataset(tmp_path / "g", seed=0, progress=False, **SMALL)
    ds = data.JPEGFolder(root, data.val_transform(32), split="train")
    mem = batching.in_memory(ds, 6)
    x, y = mem[0]
    assert x.dtype == torch.float32 and x.shape == (3, 32, 32) and mem.classes == ds.classes


def test_large_jpegs_decode_in_draft_mode_close_to_a_full_decode(tmp_path):
    """Real photos are larger than the model's input: decoding them at a reduced scale must give
    (nearly) the image a full decode and resize gives."""
    y, x = np.mgrid[0:192, 0:256]
    smooth = np.stack([x % 256, (y * 2) % 256, (x + y) % 256], -1).astype(np.uint8)
    (tmp_path / "big" / "a").mkdir(parents=True)
    Image.fromarray(smooth).save(tmp_path / "big" / "a" / "0.jpg", quality=90)
    ds = data.JPEGFolder(tmp_path / "big", data.val_transform(32))
    raw = ds.read(0)
    assert data.decode(raw, 32).size == (64, 48), "1/4 scale keeps both sides >= 32"
    assert data.decode(raw, 128).size == (256, 192), "no reduced scale keeps both sides >= 128"
    assert data.decode(raw).size == (256, 192)
    fast = ds[0][0].finish()
    full = reference(32)(data.decode(raw))
    assert fast.shape == full.shape == (3, 32, 32)
    assert (fast - full).abs().mean() < 0.05, "draft decoding must stay within a few levels of the full decode"
