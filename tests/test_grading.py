"""The assessment grader: the pass rule, the runner's bounds, and real gradings of the reference
solution and of every broken variant (tests/fixtures/assessment/).

Gradings use the 'quick' profile (a tiny data set). The broken variants run on 2 workers for 2
epochs without a baseline: the criteria they must fail are not about speed. The reference is
graded for real (4 workers, its own defaults, with the baselines, sandboxed) by the official
grading in tests/test_nbgrader.py, which also issues and verifies its certificate.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
import torch

from multigpu.grading import grader, rules, runner, sandbox, variants

FIX = grader.FIXTURES
QUICK = rules.QUICK
BROKEN_SETTINGS = QUICK.replace(workers=2, baseline_repeats=0, time_budget_s=150.0)
TWO_EPOCHS = ("--epochs", "2")


# ----------------------------------------------------------------------------- rules and pieces


def test_pass_rule_numbers_are_named_and_gpu_values_marked_unmeasured():
    for s in rules.PROFILES.values():
        assert 0 < s.accuracy < 1 and s.time_budget_s > 0 and 0 < s.efficiency <= 1
        assert s.workers == rules.WORKERS == 4 and s.epochs_held == rules.EPOCHS_HELD == 2
        assert f"{s.accuracy:.0%}" in s.describe() and f"{s.time_budget_s:.0f} s" in s.describe()
    assert not rules.GPU.measured and "UNMEASURED" in rules.GPU.describe()


def test_profile_choice(monkeypatch):
    monkeypatch.setenv("MULTIGPU_GRADING_PROFILE", "cpu")
    assert rules.settings().profile == "cpu"
    monkeypatch.delenv("MULTIGPU_GRADING_PROFILE")
    monkeypatch.setenv("MULTIGPU_QUICK", "1")
    assert rules.settings().profile in ("quick", "gpu")
    with pytest.raises(ValueError, match="unknown grading profile"):
        rules.settings("fast")


def test_learners_get_the_unconverted_starter_and_the_solution_is_the_conversion(repo):
    starter = grader.STARTER.read_text()
    assert "hvd" not in starter and "def save_checkpoint" in starter
    solution = grader.REFERENCE.read_text()
    assert grader.REFERENCE == repo / "solutions" / "assessments" / "train.py"
    for piece in ("hvd.init()", "hvd.DistributedOptimizer", "hvd.broadcast_parameters", "DistributedSampler"):
        assert piece in solution, piece
    # the unconverted fixture is the starter's code
    fixture = (FIX / "unconverted.py").read_text()
    assert fixture.split('"""', 2)[2] == starter.split('"""', 2)[2]


def test_syntax_errors_and_missing_files_are_reported_without_running_anything(tmp_path):
    msg = grader.check_source(FIX / "syntax_error.py")
    assert msg and "does not compile" in msg and "line" in msg
    assert "no submission" in grader.check_source(tmp_path / "train.py")
    t = time.monotonic()
    result = grader.grade(FIX / "syntax_error.py", QUICK)
    assert time.monotonic() - t < 10
    assert result.score == 0 and all("does not compile" in c.message for c in result.criteria.values())


def test_checkpoints_are_loaded_without_running_code_from_them(tmp_path):
    evil = tmp_path / "rank-0-epoch-1.pt"
    torch.save({"model": {"w": torch.zeros(2)}, "indices": [1, 2], "x": Path("/")}, evil)  # an arbitrary object
    with pytest.raises(ValueError, match="cannot be loaded"):
        grader.load_checkpoint(evil)
    good = tmp_path / "rank-0-epoch-2.pt"
    torch.save({"model": {"w": torch.zeros(2)}, "indices": torch.arange(3)}, good)
    assert grader.load_checkpoint(good)["indices"] == [0, 1, 2]
    torch.save({"weights": {}}, good)
    with pytest.raises(ValueError, match="contract"):
        grader.load_checkpoint(good)


def test_state_difference_finds_the_tensor_that_differs():
    a = {"x": torch.zeros(3), "y": torch.ones(2)}
    b = {"x": torch.zeros(3), "y": torch.tensor([1.0, 1.5])}
    assert grader.state_difference(a, a) == (0.0, "")
    assert grader.state_difference(a, b) == (0.5, "y")


def test_throughput_is_measured_from_outside_and_writing_all_checkpoints_at_the_end_gains_little():
    honest = runner.RunRecord(command=[], returncode=0, wall_s=50, epoch_times={1: 20.0, 2: 30.0, 3: 40.0})
    assert grader.run_throughput(honest, {1: 100, 2: 100, 3: 100}) == pytest.approx(200 / 20)
    burst = runner.RunRecord(command=[], returncode=0, wall_s=40, epoch_times={1: 40.0, 2: 40.0, 3: 40.0})
    assert grader.run_throughput(burst, {1: 100, 2: 100, 3: 100}) == pytest.approx(200 / (0.5 * 40 * 2 / 3))
    assert grader.run_throughput(honest, {1: 100}) is None


# ----------------------------------------------------------------------------- the runner's bounds


def _script(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "script.py"
    p.write_text(body)
    return p


def test_a_hanging_script_is_killed_at_its_time_limit(tmp_path):
    t = time.monotonic()
    rec = runner.run_script(_script(tmp_path, "import time\nwhile True: time.sleep(1)\n"), tmp_path / "w",
                            workers=None, timeout=3, max_output_bytes=10_000)
    assert rec.timed_out and not rec.ok and time.monotonic() - t < 20


def test_a_flood_of_output_is_stopped_and_only_its_tail_is_kept(tmp_path):
    rec = runner.run_script(_script(tmp_path, "while True: print('x' * 1000)\n"), tmp_path / "w",
                            workers=None, timeout=60, max_output_bytes=200_000)
    assert rec.output_exceeded and not rec.timed_out
    assert rec.output_bytes < 50_000_000 and len(rec.tail) <= runner.TAIL_BYTES


def test_no_process_of_a_job_outlives_it(tmp_path):
    marker = uuid.uuid4().hex
    body = (f"import subprocess, sys\n"
            f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', '{marker}'], start_new_session=True)\n"
            f"print('left a process behind')\n")
    rec = runner.run_script(_script(tmp_path, body), tmp_path / "w", workers=None, timeout=30, max_output_bytes=10_000)
    assert rec.returncode == 0 and "left a process" in rec.tail
    time.sleep(0.5)
    alive = [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
    assert not alive, f"a job's process survived its grading: {alive}"


# ----------------------------------------------------------------------------- real gradings


def _grade(name: str, settings: rules.Settings = BROKEN_SETTINGS, args=TWO_EPOCHS) -> grader.GradeResult:
    t = time.monotonic()
    result = grader.grade(FIX / f"{name}.py", settings, args=args)
    result.measurements["test_grading_s"] = time.monotonic() - t
    print(result.report())
    return result


@pytest.mark.parametrize("name,criterion,words", [
    ("unconverted", "workers", "no checkpoint from rank"),
    ("no_distributed_optimizer", "identical", "weights differ"),
    ("no_broadcast", "identical", "weights differ"),
    ("no_sampler", "sharded", "more than one rank"),
    ("fake_metrics", "accuracy", "the grader measured"),
])
def test_each_broken_variant_fails_with_the_right_message(name, criterion, words):
    result = _grade(name)
    assert not result.passed
    c = result.criteria[criterion]
    assert not c.passed and words in c.message, c.message
    if name != "unconverted":
        assert result.ok("workers"), result.message("workers")  # it ran; it is wrong for another reason


def test_a_crash_on_one_rank_is_graded_with_its_traceback():
    result = _grade("crash")
    c = result.criteria["workers"]
    assert not c.passed and "exit code" in c.message and "fails on purpose" in c.message, c.message
    assert result.measurements["test_grading_s"] < 120


def test_a_hang_is_graded_within_the_time_budget():
    settings = BROKEN_SETTINGS.replace(time_budget_s=45.0)
    result = _grade("hang", settings)
    c = result.criteria["workers"]
    assert not c.passed and "time budget" in c.message, c.message
    assert result.measurements["test_grading_s"] < 45 + 60


def test_a_flood_of_output_is_graded_within_bounded_time():
    result = _grade("huge_output")
    c = result.criteria["workers"]
    assert not c.passed and "printed more than" in c.message, c.message
    assert result.score == 0


def test_identical_weights_on_the_scripts_word_do_not_count_without_averaged_gradients(tmp_path):
    """Each rank trains alone on its shard (no DistributedOptimizer) and broadcasts rank 0's
    weights just before every save: identical checkpoints, disjoint shards, no data parallelism."""
    script = variants.write("never_averaged", grader.REFERENCE, tmp_path / "train.py")
    result = grader.grade(script, BROKEN_SETTINGS, args=TWO_EPOCHS)
    print(result.report())
    assert result.ok("workers"), result.message("workers")
    if not result.sandboxed:
        pytest.skip(f"the gradient traffic is counted in the sandbox only: {sandbox.unavailable()}")
    c = result.criteria["identical"]
    assert not c.passed and "all-reduce" in c.message and "DistributedOptimizer" in c.message, c.message
    assert not result.ok("sharded") and "not counted" in result.criteria["sharded"].message
    assert result.measurements["gradient_allreduces_per_epoch"] < rules.MIN_ALLREDUCES_PER_EPOCH


def test_saving_on_rank_0_only_gets_its_own_message(tmp_path):
    script = variants.write("rank0_saves_only", grader.REFERENCE, tmp_path / "train.py")
    result = grader.grade(script, BROKEN_SETTINGS, args=("--epochs", "1"))
    c = result.criteria["workers"]
    assert not c.passed and "only rank 0 saved" in c.message and "EVERY rank" in c.message, c.message


def test_every_variant_edit_applies_to_the_reference(tmp_path):
    for name in variants.EDITS:
        text = variants.write(name, grader.REFERENCE, tmp_path / f"{name}.py").read_text()
        compile(text, name, "exec")
        assert text != grader.REFERENCE.read_text()


def test_noisy_baselines_give_no_throughput_verdict():
    assert grader.agreeing_baselines([100.0, 110.0], 0.25) == [100.0, 110.0]
    assert grader.agreeing_baselines([100.0, 200.0], 0.25) is None
    assert grader.agreeing_baselines([100.0, 200.0, 105.0], 0.25) == [100.0, 105.0]


def test_the_same_shard_every_epoch_is_named_a_missing_set_epoch(tmp_path):
    from multigpu import data

    train_root = data.ensure_dataset(train_per_class=QUICK.train_per_class, val_per_class=QUICK.val_per_class,
                                     progress=False)
    size = len(data.JPEGFolder(train_root, None, split="train"))
    ckpts = {}
    for epoch in (1, 2):
        for rank in (0, 1):
            ckpts[(rank, epoch)] = tmp_path / f"rank-{rank}-epoch-{epoch}.pt"
            torch.save({"model": {"w": torch.ones(3)}, "indices": list(range(rank, size, 2))}, ckpts[(rank, epoch)])
    rec = runner.RunRecord(command=[], returncode=0, wall_s=10, epoch_times={1: 4.0, 2: 8.0})
    crit = grader._judge(rec, ckpts, BROKEN_SETTINGS, train_root, train_root, {"baselines": []}, print, "import horovod")
    assert crit["sharded"].passed and "set_epoch" in crit["sharded"].message, crit["sharded"].message
