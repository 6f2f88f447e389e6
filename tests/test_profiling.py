"""multigpu.labs.lab2.profiling: stage timers, model-alone and loader-alone throughput, profiler table."""

from __future__ import annotations

import pytest
import torch

from multigpu.core import data, models
from multigpu.labs.lab2 import profiling


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = data.ensure_dataset(tmp_path_factory.mktemp("d") / "shapes", progress=False, classes=3,
                               train_per_class=40, val_per_class=2, image_size=64)
    return data.JPEGFolder(root, data.train_transform(64), split="train")


def test_stage_times_cover_every_stage(tiny):
    st = profiling.time_stages(tiny, n_images=48, batch_size=16)
    assert list(st.seconds) == list(profiling.STAGES)
    assert st.images == 48
    assert all(t > 0 for t in st.seconds.values())
    assert st.bottleneck in profiling.STAGES
    rates = st.images_per_s
    assert st.pipeline_images_per_s == pytest.approx(profiling.serial_rate(rates), rel=1e-6)
    assert st.pipeline_images_per_s < min(rates.values())
    assert "copy" in st.notes and "decode" in st.table()


def test_serial_rate_is_harmonic():
    assert profiling.serial_rate([100.0, 100.0]) == pytest.approx(50.0)
    assert profiling.serial_rate({"a": 300.0, "b": 150.0}) == pytest.approx(100.0)


def test_model_alone_and_loader_alone():
    torch.manual_seed(0)
    m = models.build_model("alexnet_small")
    rate = profiling.model_images_per_s(m, batch_size=8, steps=2)
    assert rate > 0
    ds = data.SyntheticImages(64, 64, 10)
    loader = data.make_loader(ds, 8)
    assert profiling.loader_images_per_s(loader, batches=4) > rate, "an in-memory loader outruns a training step"
    with pytest.raises(ValueError):
        profiling.loader_images_per_s(data.make_loader(data.SyntheticImages(8, 64, 10), 8), batches=2, warmup=2)


def test_pipeline_vs_model_ratio(tiny):
    m = models.build_model("alexnet_small", num_classes=3)
    c = profiling.pipeline_vs_model(data.make_loader(tiny, 16, shuffle=True), m, repeats=2, loader_images=48,
                                    model_steps=1)
    assert c.ratio == pytest.approx(c.pipeline_images_per_s / c.model_images_per_s)
    assert len(c.pipeline_runs) == 2 and "ratio" in str(c)


def test_profile_table_names_the_step_phases(tiny):
    table = profiling.profile_steps(models.build_model("alexnet_small", num_classes=3), data.make_loader(tiny, 8),
                                    steps=2, row_limit=30)
    for name in ("forward", "backward", "load"):
        assert name in table


def test_plot_stages():
    import matplotlib

    matplotlib.use("Agg")
    ax = profiling.plot_stages({"read": 1000.0, "decode": 300.0}, 200.0)
    assert len(ax.patches) == 2


def _amp_step(model, optimizer, scaler, images, labels, dtype):  # bfloat16 on a CPU: the scaler is off
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=dtype):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()


def test_step_options_side_by_side_and_a_failing_option_reported():
    options = profiling.EAGER_OPTIONS
    rows = profiling.compare_step_options("alexnet_small", _amp_step, batch_size=8, steps=1, repeats=1, options=options)
    assert [r["option"] for r in rows] == list(options)
    assert all(r["error"] is None and r["images_per_s"] > 0 and r["first_step_s"] > 0 for r in rows)
    assert rows[0]["speedup"] == 1.0
    assert profiling.mixed_precision_dtype("cpu") == torch.bfloat16

    def unwritten(*args):
        raise NotImplementedError()

    rows = profiling.compare_step_options("alexnet_small", unwritten, batch_size=8, steps=1, repeats=1, options=options[:2])
    assert rows[0]["images_per_s"] > 0 and rows[1]["error"] == "NotImplementedError: "
    assert "failed: NotImplementedError" in profiling.format_step_options(rows)
    with pytest.raises(ValueError, match="unknown option"):
        profiling.compare_step_options("alexnet_small", _amp_step, options=["float64"])


def test_a_slow_option_runs_one_step_a_round_once_a_round_passes_its_time():
    import time

    calls = []

    def slow_amp_step(*args):  # autocast on a CPU without bfloat16 instructions: many times float32's step
        calls.append(1)
        time.sleep(0.3)
        return _amp_step(*args)

    rows = profiling.compare_step_options("alexnet_small", slow_amp_step, batch_size=8, steps=5, repeats=2,
                                          options=("float32", "mixed precision"), round_s=0.2)
    assert len(calls) == 2 + 2 * 1, "two first steps, then one step in each of the 2 rounds"
    fast, slow = rows
    assert slow["images_per_s"] < 8 / 0.3 and slow["speedup"] < 1 and fast["images_per_s"] > slow["images_per_s"]
