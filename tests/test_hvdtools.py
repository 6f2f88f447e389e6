"""multigpu.running.hvdtools: composing the learner's script, reading runs; Horovod's patched wait."""

from __future__ import annotations

import ast

import numpy as np  # a module the reference script does not import
import pytest

from multigpu.running import hvdtools


def lr_schedule(base_lr, warmup_epochs):
    return lambda epoch: base_lr * 7  # recognisable


def average_metric(value, name):
    return float(np.mean([value]))  # uses a name the script lacks


def not_a_step():
    return 1


def test_compose_replaces_exactly_the_given_steps(tmp_path):
    path = hvdtools.compose_script(tmp_path / "train.py", [lr_schedule])
    text = path.read_text()
    tree = ast.parse(text)
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert set(hvdtools.STEPS) <= set(funcs), "every step is still defined"
    assert "base_lr * 7" in ast.get_source_segment(text, funcs["lr_schedule"])
    assert "hvd.size()" not in ast.get_source_segment(text, funcs["lr_schedule"])
    # the other steps and main() are the reference's
    ref = hvdtools.reference_path().read_text()
    ref_funcs = {n.name: n for n in ast.parse(ref).body if isinstance(n, ast.FunctionDef)}
    for name in ("init_horovod", "average_metric", "main"):
        assert ast.get_source_segment(text, funcs[name]) == ast.get_source_segment(ref, ref_funcs[name])
    assert text.startswith("# Written by multigpu.running.hvdtools.compose_script")


def test_compose_refuses_unknown_steps_and_foreign_names(tmp_path):
    with pytest.raises(ValueError, match="not one of the script's steps"):
        hvdtools.compose_script(tmp_path / "a.py", [not_a_step])
    with pytest.raises(NameError, match="np"):
        hvdtools.compose_script(tmp_path / "b.py", [average_metric])


def test_reference_marks_distribution_lines():
    text = hvdtools.reference_path().read_text()
    main = text[text.index("def main("):]
    for step in range(1, len(hvdtools.STEPS) + 1):
        assert f"# Horovod: step {step}" in main, f"main() should call step {step} on a marked line"
    assert "import horovod.torch as hvd  # Horovod:" in text


def _late_allreduce(delay_s: float) -> tuple[float, float, float]:
    """Rank 1 joins an all-reduce ``delay_s`` late; return the CPU time of the waiting thread, the
    wall time of its wait, and the sum (a Horovod worker, under horovodrun)."""
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()
    tensor = torch.ones(1000)
    hvd.synchronize(hvd.allreduce_async_(torch.ones(1), name="warmup"))
    if hvd.rank() == 1:
        time.sleep(delay_s)
    cpu, wall = time.thread_time(), time.perf_counter()
    hvd.synchronize(hvd.allreduce_async_(tensor, op=hvd.Sum, name="late"))
    return time.thread_time() - cpu, time.perf_counter() - wall, tensor[0].item()


@pytest.mark.slow
def test_horovods_wait_sleeps_instead_of_spinning():
    """The project's Horovod patch (item 4): ``hvd.synchronize`` sleeps until the all-reduce is
    done. Stock Horovod polls and yields in a loop, which takes a whole core for the wait (its
    CPU time would be about its wall time), the core a CPU worker's all-reduce needs."""
    from multigpu.running import launch

    (cpu, wall, total), _ = launch.run_horovod(_late_allreduce, 2, args=(1.0,), echo=False, timeout=120)
    assert total == 2.0
    assert wall > 0.8, f"rank 0 should have waited about 1 s for rank 1, waited {wall:.2f} s"
    assert cpu < 0.05 * wall, f"rank 0's waiting thread used {cpu:.2f} s of CPU in {wall:.2f} s: a busy wait"