"""multigpu.hvdtools: composing the learner's script, reading runs, Horovod's polite wait."""

from __future__ import annotations

import ast

import pytest

from multigpu import hvdtools

import numpy as np  # a module the reference script does not import  # noqa: E402


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
    assert text.startswith("# Written by multigpu.hvdtools.compose_script")


def test_compose_refuses_unknown_steps_and_foreign_names(tmp_path):
    with pytest.raises(ValueError, match="not one of the script's steps"):
        hvdtools.compose_script(tmp_path / "a.py", [not_a_step])
    with pytest.raises(NameError, match="np"):
        hvdtools.compose_script(tmp_path / "b.py", [average_metric])


def test_reference_marks_distribution_lines():
    text = hvdtools.reference_path().read_text()
    main = text[text.index("def main("):]
    for step in range(1, 9):
        assert f"# Horovod: step {step}" in main, f"main() should call step {step} on a marked line"
    assert "import horovod.torch as hvd  # Horovod:" in text


def test_patient_waits_polls_before_synchronizing(monkeypatch):
    import horovod.torch as hvd

    polls = []
    state = {"done_after": 3}

    def fake_poll(handle):
        polls.append(handle)
        return len(polls) >= state["done_after"]

    monkeypatch.setattr(hvd, "poll", fake_poll)

    class FakeOptimizer:
        def __init__(self):
            self._handles = {"p": (42, None)}
            self.synced = False

        def synchronize(self):
            self.synced = True

    opt = hvdtools.patient_waits(FakeOptimizer(), interval_s=0.0)
    opt.synchronize()
    assert polls == [42, 42, 42] and opt.synced
    monkeypatch.setenv("MULTIGPU_HOROVOD_SPIN", "1")
    plain = FakeOptimizer()
    assert hvdtools.patient_waits(plain).synchronize.__func__ is FakeOptimizer.synchronize
