"""Work per step from outside the script's own records (grading/workprobe.py, observations.py):
the batches a run's data loaders yield and which reach a backward pass, counted by the grader's
probe in every process of the run, set against the images the ranks claim (issue 49, point 3).
The real gradings of the forward-only variants are at the end (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from multigpu.core import layout
from multigpu.grading import grader, observations, rules, variants, workprobe


def test_a_batch_counts_as_trained_when_a_backward_pass_covers_it():
    counts = workprobe.Counts()
    for step in range(9):  # every third batch of 32 forward only
        counts.batch(32, source=1)
        if step % 3 != 2:
            counts.backward_pass()
    counts.finished(1)
    assert (counts.trained_batches, counts.trained_samples) == (6, 192)
    counts.batch(16, source=2)  # micro-batches: two backward passes, one batch
    counts.backward_pass()
    counts.backward_pass()
    counts.batch(32, source=2)  # two batches fetched ahead in a group, then trained one by one
    counts.batch(32, source=2)
    counts.backward_pass()
    counts.backward_pass()
    for _ in range(3):  # a validation loader's batches: no backward pass
        counts.batch(25, source=3)
    counts.batch(32, source=2)  # a batch run forward only
    counts.batch(32, source=2)
    counts.backward_pass()
    record = counts.to_dict()
    assert (record["batches"], record["samples"], record["trained_batches"], record["trained_samples"]) == \
        (17, 507, 10, 304)
    assert record["backward"] == 11 and record["sizes"] == {"32": 13, "25": 3, "16": 1}


def test_the_size_of_a_batch_is_its_first_tensors_first_dimension():
    x = torch.zeros(7, 3)
    assert workprobe.batch_size(x) == 7 and workprobe.batch_size((x, torch.zeros(7))) == 7
    assert workprobe.batch_size({"image": x}) == 7 and workprobe.batch_size([1, 2]) == 0


def _observed(claimed: int, trained: int, lost: str = "", rounds: int = 20) -> observations.Observed:
    log = workprobe.WorkLog(({"trained_samples": trained, "sizes": {"32": trained // 32}},), lost)
    return observations.Observed(None, "", None, "mpi", log, claimed, rounds, 4)


def test_images_claimed_beyond_those_that_reached_a_backward_pass_hold_the_pass_with_the_figures():
    forward_only = observations.flags(_observed(claimed=3840, trained=2560))
    assert [f.kind for f in forward_only] == ["work"]
    assert "1280 of the images" in forward_only[0].why
    assert "48.0 claimed, 32.0 trained" in forward_only[0].code, forward_only[0].code
    assert observations.flags(_observed(claimed=3840, trained=3840)) == []  # an honest batch of 48 alike
    assert observations.flags(_observed(claimed=3840, trained=3700)) == []  # within the tolerance
    assert "no batch drawn from a torch DataLoader" in observations.flags(_observed(3840, 0))[0].why
    assert "cannot be confirmed" in observations.flags(_observed(3840, 3840, lost="x could not be read"))[0].why
    figures = _observed(3840, 2560).figures()["work"]
    assert figures["claimed_per_round"] == 48.0 and figures["trained_per_round"] == 32.0


def test_the_watch_reads_only_plain_small_records(tmp_path):
    (tmp_path / "1.json").write_text(json.dumps({"trained_samples": 64}))
    (tmp_path / "2.json").symlink_to(tmp_path / "1.json")
    (tmp_path / "3.json").write_text("[1, 2")
    log = workprobe.WorkWatch(tmp_path).stopped()
    assert log.trained == 64 and len(log.records) == 1 and log.lost


@pytest.mark.slow
def test_the_probe_counts_in_a_real_process_before_the_scripts_own_code(tmp_path):
    """The sitecustomize the grader writes is imported by Python itself at start-up, so the
    script's first line already runs counted."""
    probe, records = workprobe.sitecustomize(tmp_path / "probe"), tmp_path / "records"
    records.mkdir()
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "data = TensorDataset(torch.randn(96, 3), torch.randint(0, 2, (96,)))\n"
        "model = torch.nn.Linear(3, 2)\n"
        "for step, (x, y) in enumerate(DataLoader(data, batch_size=32)):\n"
        "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "    if step % 3 != 2:\n"
        "        loss.backward()\n")
    env = {"PATH": "/usr/bin:/bin", workprobe.RECORDS_VAR: str(records),
           "PYTHONPATH": f"{probe}:{layout.IMPORT_ROOT}"}
    subprocess.run([sys.executable, str(script)], check=True, env=env, timeout=120)
    log = workprobe.WorkWatch(records).stopped()
    assert [(r["samples"], r["trained_samples"], r["backward"]) for r in log.records] == [(96, 64, 2)]


def _grade(name: str, tmp: Path, epochs: int) -> grader.GradeResult:
    t = time.monotonic()
    result = grader.grade(variants.write(name, grader.REFERENCE, tmp / f"{name}.py"), rules.QUICK,
                          args=("--epochs", str(epochs)))
    result.measurements["test_grading_s"] = time.monotonic() - t
    print(result.report(), result.measurements.get("work"))
    return result


@pytest.mark.slow
@pytest.mark.parametrize("name", ["every_third_forward_only", pytest.param("batch_48", marks=pytest.mark.matrix)])
def test_forward_only_batches_are_held_and_an_honest_batch_of_48_is_not(name, tmp_path):
    """Issue 49: a conversion that runs every third batch forward only showed about 48 images per
    worker between two rounds where its loader gives 32, and passed unflagged; an honest batch of
    48 shows the same from outside. The probe tells them apart (2 epochs: the figures, not A)."""
    result = _grade(name, tmp_path, epochs=2)
    assert result.ok("workers"), result.message("workers")
    work = result.measurements["work"]
    kinds = {f["kind"] for f in result.review["flags"]}
    if name == "batch_48":
        assert work["trained"] >= work["claimed"] and "work" not in kinds, result.review
        assert work["loader_batches"].get("48"), work
    else:
        assert "work" in kinds, result.review
        assert work["claimed"] > 1.3 * work["trained"] and work["loader_batches"].get("32"), work
        assert work["claimed_per_round"] > 1.3 * work["trained_per_round"], work
