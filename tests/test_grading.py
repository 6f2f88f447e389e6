"""The assessment grader: the pass rule, the runner's bounds, and real gradings of the reference
solution and of every broken variant (grading/variants.py: the reference with a few lines changed).

Gradings use the 'quick' profile (a tiny data set). The broken variants run on 2 workers for 2
epochs without a baseline: the criteria they must fail are not about speed. The reference is
graded for real (4 workers, its own defaults, with the baselines, sandboxed) by the official
grading in tests/test_nbgrader.py, which also issues and verifies its certificate.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
import uuid
from pathlib import Path

import psutil
import pytest
import torch

from multigpu.grading import audit, disguises, grader, rules, runner, variants
from multigpu.running import launch

QUICK = rules.QUICK
#: The broken variants' gradings: 2 workers, no baselines, and the quick profile's own time budget
#: (300 s): a variant fails for its own reason, and the slowest (every rank on all the data) takes
#: about 30 s on the quiet 2-core machine, so a busy machine does not turn it into a timeout. The
#: budget itself is checked by test_a_hang_is_graded_within_the_time_budget (25 s).
BROKEN_SETTINGS = QUICK.replace(workers=2, baseline_repeats=0)
#: Where the verdict asserted is structural (the weights differ, a shard repeats, no Horovod rounds,
#: a crash, the output cap, the files read), a tenth of the quick profile's training set: the same
#: code paths, about 7 steps an epoch per worker instead of 47.
TINY_SETTINGS = BROKEN_SETTINGS.replace(train_per_class=30, holdout_per_class=10)
TWO_EPOCHS = ("--epochs", "2")
#: A timeline's file name in the tests (a grading draws its own: grader.timeline_file)
TIMELINE = "horovod-timeline.json"


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


def test_fewer_gpus_than_workers_grade_on_the_cpu_profile_and_the_gpu_profile_refuses(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the grader sees 2 GPUs
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Simulated GPU")
    for var in ("MULTIGPU_GRADING_PROFILE", "MULTIGPU_QUICK", "MULTIGPU_FORCE_CPU"):
        monkeypatch.delenv(var, raising=False)
    assert rules.settings().profile == "cpu"  # 4 workers need 4 GPUs
    with pytest.raises(ValueError, match="this machine has 2 GPU.*--profile cpu"):
        grader.grade(grader.REFERENCE, rules.GPU, sandbox="off", workdir=tmp_path)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert rules.settings().profile == "gpu"


def test_learners_get_the_unconverted_starter_and_the_solution_is_the_conversion(repo, tmp_path):
    starter = grader.STARTER.read_text()
    assert "hvd" not in starter and "def save_checkpoint" in starter
    solution = grader.REFERENCE.read_text()
    assert grader.REFERENCE == repo / "solutions" / "assessments" / "train.py"
    for piece in ("hvd.init()", "hvd.DistributedOptimizer", "hvd.broadcast_parameters", "DistributedSampler"):
        assert piece in solution, piece
    # the unconverted variant is the starter's code
    unconverted = variants.write("unconverted", grader.REFERENCE, tmp_path / "unconverted.py").read_text()
    assert unconverted.split('"""', 2)[2] == starter.split('"""', 2)[2]


@pytest.mark.slow  # grade() probes the sandbox once per process (a bwrap start) before it reads the source
def test_syntax_errors_and_missing_files_are_reported_without_running_anything(tmp_path):
    script = variants.write("syntax_error", grader.REFERENCE, tmp_path / "syntax_error.py")  # not train.py
    msg = grader.check_source(script)
    assert msg and "does not compile" in msg and "line" in msg
    assert "no submission" in grader.check_source(tmp_path / "train.py")
    t = time.monotonic()
    result = grader.grade(script, QUICK)
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


@pytest.mark.timeout(30)
def test_a_fifo_or_a_symlink_named_like_a_checkpoint_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "rank-1-epoch-1.pt"
    os.mkfifo(fifo)  # opening it for reading would block until someone writes: the grader must not
    with pytest.raises(ValueError, match="not a regular file"):
        grader.load_checkpoint(fifo)
    target = tmp_path / "elsewhere.pt"
    torch.save({"model": {"w": torch.zeros(2)}, "indices": [0]}, target)
    link = tmp_path / "rank-2-epoch-1.pt"
    link.symlink_to(target)
    with pytest.raises(ValueError, match="cannot be opened"):
        grader.load_checkpoint(link)
    others = tmp_path / "another-run"
    others.mkdir()
    torch.save({"model": {"w": torch.zeros(2)}, "indices": [0]}, others / "rank-0-epoch-1.pt")
    folder = tmp_path / "checkpoints"
    folder.symlink_to(others)  # the run's folder made a link to another run's: none of its files count
    assert grader.find_checkpoints(others) and grader.find_checkpoints(folder) == {}


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


@pytest.mark.slow
def test_a_hanging_script_is_killed_at_its_time_limit(tmp_path):
    t = time.monotonic()
    rec = runner.run_untrusted(_script(tmp_path, "import time\nwhile True: time.sleep(1)\n"), tmp_path / "w",
                            workers=None, timeout=3, max_output_bytes=10_000)
    assert rec.timed_out and not rec.ok and time.monotonic() - t < 20


@pytest.mark.slow
def test_a_flood_of_output_is_stopped_and_only_its_tail_is_kept(tmp_path):
    rec = runner.run_untrusted(_script(tmp_path, "while True: print('x' * 1000)\n"), tmp_path / "w",
                            workers=None, timeout=60, max_output_bytes=200_000)
    assert rec.output_exceeded and not rec.timed_out
    assert rec.output_bytes < 50_000_000 and len(rec.tail) <= launch.TAIL_BYTES


@pytest.mark.slow
def test_no_process_of_a_job_outlives_it(tmp_path):
    """Unsandboxed: a script that leaves a process behind (holding its stdout) and exits 0 ends its run
    when it exits, and the process is killed by the job's token."""
    marker = uuid.uuid4().hex
    body = (f"import subprocess, sys\n"
            f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', '{marker}'], start_new_session=True)\n"
            f"print('left a process behind')\n")
    rec = runner.run_untrusted(_script(tmp_path, body), tmp_path / "w", workers=None, timeout=30, max_output_bytes=10_000)
    assert rec.returncode == 0 and "left a process" in rec.tail
    assert not rec.timed_out and rec.wall_s < 15, f"the run waited for the process it left: {rec.wall_s:.0f} s"
    time.sleep(0.5)
    alive = [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
    assert not alive, f"a job's process survived its grading: {alive}"


# ----------------------------------------------------------------------------- real gradings


def _grade(name: str, tmp: Path, settings: rules.Settings = TINY_SETTINGS, args=TWO_EPOCHS) -> grader.GradeResult:
    """Grade variant ``name`` of the reference (grading/variants.py), written to the folder ``tmp``."""
    t = time.monotonic()
    script = variants.write(name, grader.REFERENCE, tmp / f"{name}.py")
    result = grader.grade(script, settings, args=args)
    result.measurements["test_grading_s"] = time.monotonic() - t
    print(result.report())
    return result


# "unconverted" (the starter as released) is graded in every make test by the nbgrader round trip,
# as the blank student's submission (tests/test_nbgrader.py checks its verdict and message)
@pytest.mark.slow
@pytest.mark.parametrize("name,criterion,words", [
    ("no_distributed_optimizer", "identical", "weights differ"),
    pytest.param("no_broadcast", "identical", "weights differ", marks=pytest.mark.matrix),
    pytest.param("no_sampler", "sharded", "more than one rank", marks=pytest.mark.matrix),
    ("no_set_epoch", "sharded", "call sampler.set_epoch(epoch)"),
    ("fake_metrics", "accuracy", "the grader measured"),
    # torch DDP launched by horovodrun
    ("ddp_under_horovodrun", "identical", "no Horovod gradient all-reduce"),
])
def test_each_broken_variant_fails_with_the_right_message(name, criterion, words, tmp_path):
    assert variants.MUST_FAIL[name] == criterion
    result = _grade(name, tmp_path)
    assert not result.passed
    c = result.criteria[criterion]
    assert not c.passed and words in c.message, c.message
    assert result.ok("workers"), result.message("workers")  # it ran; it is wrong for another reason
    if name == "ddp_under_horovodrun":  # it trains correctly: only Horovod's absence fails it
        assert variants.MUST_FAIL[name] == criterion
        assert "DistributedOptimizer" in c.message and "torch DDP" in c.message, c.message
        assert result.measurements["max_weight_difference"] <= grader.IDENTICAL_TOL
        assert result.measurements["horovod_timeline_bytes"] is None  # hvd.init() never ran: no timeline
        assert "not counted" in result.criteria["sharded"].message


@pytest.mark.slow
def test_a_crash_on_one_rank_is_graded_with_its_traceback(tmp_path):
    result = _grade("crash", tmp_path)
    c = result.criteria["workers"]
    assert not c.passed and "exit code" in c.message and "fails on purpose" in c.message, c.message
    assert result.measurements["test_grading_s"] < 120


@pytest.mark.slow
def test_a_hang_is_graded_within_the_time_budget(tmp_path):
    settings = TINY_SETTINGS.replace(time_budget_s=25.0)
    result = _grade("hang", tmp_path, settings)
    c = result.criteria["workers"]
    assert not c.passed and "time budget" in c.message, c.message
    assert result.measurements["test_grading_s"] < 25 + 60


@pytest.mark.slow
def test_a_flood_of_output_is_graded_within_bounded_time(tmp_path):
    result = _grade("huge_output", tmp_path)
    c = result.criteria["workers"]
    assert not c.passed and "printed more than" in c.message, c.message
    assert result.score == 0


@pytest.mark.slow
def test_identical_weights_on_the_scripts_word_do_not_count_without_averaged_gradients(tmp_path):
    """Each rank trains alone on its shard (no DistributedOptimizer) and broadcasts rank 0's
    weights just before every save: identical checkpoints, disjoint shards, no data parallelism."""
    script = variants.write("never_averaged", grader.REFERENCE, tmp_path / "train.py")
    result = grader.grade(script, TINY_SETTINGS, args=TWO_EPOCHS)
    print(result.report())
    assert result.ok("workers"), result.message("workers")
    c = result.criteria["identical"]
    # Horovod's own timeline (every mode): broadcasts and the validation counts, no gradient
    assert not c.passed and "no Horovod gradient all-reduce" in c.message and "DistributedOptimizer" in c.message, \
        c.message
    assert result.measurements["horovod_timeline_bytes"] > 0
    assert result.measurements["horovod_gradient_rounds_per_epoch"] == 0
    assert not result.ok("sharded") and "not counted" in result.criteria["sharded"].message


@pytest.mark.slow
def test_saving_on_rank_0_only_gets_its_own_message(tmp_path):
    script = variants.write("rank0_saves_only", grader.REFERENCE, tmp_path / "train.py")
    result = grader.grade(script, TINY_SETTINGS, args=("--epochs", "1"))
    c = result.criteria["workers"]
    assert not c.passed and "only rank 0 saved" in c.message and "EVERY rank" in c.message, c.message


def test_every_variant_edit_applies_to_the_reference(tmp_path):
    assert set(variants.MUST_FAIL) | set(variants.BY_EFFECT) | set(variants.CACHED) == \
        set(variants.EDITS) | set(variants.SOURCES)
    assert not set(variants.MUST_FAIL) & set(variants.BY_EFFECT)
    assert set(disguises.CAUGHT_BY) <= set(variants.CALIBRATED)  # issue 40's cheats: graded by calibrate too
    assert set(variants.BY_EFFECT.values()) <= {"accuracy", "throughput"}  # what the grader measures itself
    # the calibration grades the cheats; the failure cases (crash, hang, ...) are the tests' alone
    assert set(variants.CALIBRATED) == set(variants.MUST_FAIL) - set(variants.FAILURE_CASES)
    assert all(variants.MUST_FAIL[name] == "workers" for name in variants.FAILURE_CASES)
    for name in (*variants.SOURCES, *variants.EDITS):
        text = variants.write(name, grader.REFERENCE, tmp_path / f"{name}.py").read_text()
        if name == "syntax_error":  # written all the same
            with pytest.raises(SyntaxError):
                compile(text, name, "exec")
        else:
            compile(text, name, "exec")
        assert text != grader.REFERENCE.read_text()
        assert name in variants.MUST_FAIL or name in variants.BY_EFFECT or name in variants.CACHED
    ddp = (tmp_path / "ddp_under_horovodrun.py").read_text()
    assert "hvd." not in ddp and "horovod.torch" not in ddp and "DistributedDataParallel" in ddp
    unscaled = (tmp_path / "no_lr_scaling.py").read_text()
    assert "args.lr * workers" not in unscaled and "WARMUP = 0.0" in unscaled
    threads = (tmp_path / "starter_threads.py").read_text()
    assert "pin_worker" not in threads and "threads_per_worker(1)" in threads
    assert "sampler.set_epoch" not in (tmp_path / "no_set_epoch.py").read_text()


@pytest.mark.slow
@pytest.mark.matrix  # test_an_accuracy_fail_names_an_unscaled_or_unwarmed_learning_rate checks its message in every make test
def test_a_rate_never_scaled_is_judged_by_the_accuracy_it_reaches(tmp_path):
    """A correct conversion at one worker's rate (no scaling, no warm-up), 3 epochs on 2 workers:
    the grader cannot tell the rate from evidence it owns, so it fails no other criterion, and
    accuracy passes or fails on the held-out accuracy with a hint to scale the rate. The time
    budget is doubled: the test is about the verdicts, not the speed."""
    result = _grade("no_lr_scaling", tmp_path, BROKEN_SETTINGS.replace(time_budget_s=600.0), args=("--epochs", "3"))
    for criterion in ("workers", "identical", "sharded"):
        assert result.ok(criterion), f"{criterion}: {result.message(criterion)}"
    c = result.criteria[variants.BY_EFFECT["no_lr_scaling"]]
    assert c.passed or "hvd.size()" in c.message, c.message


@pytest.mark.slow
@pytest.mark.matrix
def test_the_starters_threads_are_judged_by_what_they_cost(tmp_path):
    """The starter's threads kept (every core for each worker, unpinned), 1 epoch on 2 workers:
    the grader cannot count threads, so a run that completes fails neither identical nor sharded;
    what oversubscribed cores cost shows as time (on a busy machine the run can exceed T) and
    throughput. One epoch: the threads cost the same every epoch, and the 2-core machine spends
    about a minute on each."""
    result = _grade("starter_threads", tmp_path, args=("--epochs", "1"))
    if result.ok("workers"):
        assert result.ok("identical") and result.ok("sharded"), result.report()
    else:
        assert "time budget" in result.message("workers"), result.message("workers")


def test_noisy_baselines_give_no_throughput_verdict():
    assert grader.agreeing_baselines([100.0, 110.0], 0.25) == [100.0, 110.0]
    assert grader.agreeing_baselines([100.0, 200.0], 0.25) is None
    assert grader.agreeing_baselines([100.0, 200.0, 105.0], 0.25) == [100.0, 105.0]


@pytest.mark.parametrize("new_order", [False, True])
def test_the_same_shard_every_epoch_is_named_a_missing_set_epoch(new_order, tmp_path):
    """The same shard in the same order every epoch (no sampler.set_epoch) fails sharded; the same
    shard in a new order each epoch passes with a note naming set_epoch."""
    from multigpu.core import data

    train_root = data.ensure_dataset(train_per_class=QUICK.train_per_class, val_per_class=QUICK.val_per_class,
                                     progress=False)
    size = len(data.JPEGFolder(train_root, None, split="train"))
    ckpts = {}
    for epoch in (1, 2):
        for rank in (0, 1):
            ckpts[(rank, epoch)] = tmp_path / f"rank-{rank}-epoch-{epoch}.pt"
            shard = list(range(rank, size, 2))
            indices = shard[::-1] if new_order and epoch == 2 else shard
            torch.save({"model": {"w": torch.ones(3)}, "indices": indices}, ckpts[(rank, epoch)])
    rec = runner.RunRecord(command=[], returncode=0, wall_s=10, epoch_times={1: 4.0, 2: 8.0})
    timeline = _write_timeline(tmp_path / TIMELINE, {"w": [3]}, rounds=10)
    crit = grader.judge(rec, ckpts, BROKEN_SETTINGS, train_root, train_root, {"baselines": []}, print,
                         "import horovod", timeline_path=timeline)
    assert crit["identical"].passed, crit["identical"].message
    c = crit["sharded"]
    assert c.passed == new_order and "sampler.set_epoch(epoch)" in c.message, c.message
    assert ("same order" in c.message) != new_order, c.message


# ----------------------------------------------------------------------------- Horovod's own account: its timeline


def _write_timeline(path: Path, shapes: dict[str, list[int]], rounds: int) -> Path:
    """A timeline in the format Horovod's rank 0 writes (checked against a real one in
    test_the_timeline_of_a_real_horovod_run_counts_its_gradient_rounds): ``rounds`` completed
    all-reduces of each named tensor, unterminated as Horovod often leaves it."""
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": 1}}]
    for pid, name in enumerate(shapes, 1):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"allreduce.{name}"}})
    ts = 1000
    for _ in range(rounds):
        for pid, shape in enumerate(shapes.values(), 1):
            events += [{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": ts, "pid": pid},
                       {"ph": "X", "name": "0", "ts": ts, "pid": pid, "dur": 0},
                       {"ph": "E", "ts": ts + 1, "pid": pid},
                       {"ph": "B", "name": "ALLREDUCE", "ts": ts + 2, "pid": pid},
                       {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": ts + 3, "pid": pid},
                       {"ph": "E", "ts": ts + 4, "pid": pid},
                       {"ph": "E", "ts": ts + 5, "pid": pid,
                        "args": {"dtype": "float32", "shape": "[" + ", ".join(map(str, shape)) + "]"}}]
            ts += 10
    path.write_text("[\n" + ",\n".join(json.dumps(e) for e in events) + ",")
    return path


#: A tiny Horovod job: 5 steps with named parameters, then 3 with unnamed ones (another model).
HOROVOD_JOB = """
import time
import torch
import horovod.torch as hvd
hvd.init()
torch.manual_seed(0)
named = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
unnamed = torch.nn.Linear(6, 5)
for model, steps, inputs, names in ((named, 5, 8, True), (unnamed, 3, 6, False)):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters() if names else None)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(4, inputs)).sum().backward()
        optimizer.step()
hvd.allreduce(torch.zeros(2), name="val_counts")
time.sleep(1)  # Horovod's timeline writer drops what it has not written when Horovod shuts down
print("done", hvd.rank())
"""


@pytest.fixture(scope="module")
def real_timeline(tmp_path_factory) -> Path:
    """The timeline a real 2-worker horovodrun job wrote (``HOROVOD_TIMELINE``, as the grader sets it)."""
    work = tmp_path_factory.mktemp("horovod-job")
    path = work / TIMELINE
    rec = runner.run_untrusted(_script(work, HOROVOD_JOB), work / "run", workers=2, timeout=120,
                            max_output_bytes=100_000, env={"HOROVOD_TIMELINE": str(path)})
    assert rec.ok and rec.tail.count("done") == 2, rec.tail[-3000:]
    assert path.is_file(), "horovodrun's rank 0 wrote no timeline where HOROVOD_TIMELINE said"
    return path


def _shapes(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: torch.zeros(v.shape) for k, v in model.state_dict().items()}


NAMED = _shapes(torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3)))
UNNAMED = _shapes(torch.nn.Linear(6, 5))


@pytest.mark.slow
def test_the_timeline_of_a_real_horovod_run_counts_its_gradient_rounds(real_timeline):
    from multigpu.running import timeline

    events = timeline.load(real_timeline, max_bytes=rules.MAX_TIMELINE_BYTES)
    names = {e["args"]["name"] for e in events if e.get("ph") == "M" and "name" in e.get("args", {})}
    # DistributedOptimizer's names: allreduce.<parameter>, or allreduce.allreduce.noname.<group>.<i>
    assert {"allreduce.0.weight", "allreduce.2.bias", "allreduce.val_counts"} <= names, names
    assert any(n.startswith("allreduce.allreduce.noname.") for n in names), names
    assert grader.gradient_allreduce_rounds(events, NAMED) == (5, 5 * 4)  # matched by shape, named or not
    assert grader.gradient_allreduce_rounds(events, UNNAMED) == (3, 3 * 2)
    verdict = grader.horovod_averaging(real_timeline, NAMED, samples_per_worker=20, epochs=1, settings=QUICK)
    assert verdict["ok"] and "5 complete rounds" in verdict["message"], verdict
    assert verdict["measurements"]["horovod_timeline_bytes"] == real_timeline.stat().st_size
    # twice the batch the grader tolerates between two all-reduces: too few rounds
    verdict = grader.horovod_averaging(real_timeline, NAMED, samples_per_worker=10 * rules.MAX_IMAGES_PER_ALLREDUCE,
                                       epochs=1, settings=QUICK)
    assert not verdict["ok"] and "too few" in verdict["message"], verdict


@pytest.mark.slow
def test_a_timeline_cut_anywhere_is_read_or_refused_without_a_crash(real_timeline, tmp_path):
    """A run killed at its time limit leaves half a timeline: what was written counts, no more."""
    text = real_timeline.read_bytes()
    cut = tmp_path / TIMELINE
    for end in range(0, len(text), max(len(text) // 40, 1)):
        cut.write_bytes(text[:end])
        verdict = grader.horovod_averaging(cut, NAMED, samples_per_worker=20, epochs=1, settings=QUICK)
        assert isinstance(verdict["message"], str) and "Horovod" in verdict["message"]
        assert verdict["measurements"].get("horovod_gradient_rounds_per_epoch", 0) <= 5


def _junk(kind: str, path: Path, tmp_path: Path) -> None:
    secret = "SECRET-KEY-MATERIAL"
    if kind == "binary":
        path.write_bytes(b"\x00\xff" * 1000 + secret.encode())
    elif kind == "text":
        path.write_text(f"not a timeline {secret} }} }} }}")
    elif kind == "nested":
        path.write_text("[" * 200_000)
    elif kind == "object":
        path.write_text(json.dumps({"ph": "E", "secret": secret}))
    elif kind == "numbers":
        path.write_text(json.dumps(list(range(1000))))
    elif kind == "odd_types":
        path.write_text(json.dumps([
            {"name": "process_name", "ph": "M", "pid": [1], "args": {"name": "allreduce.w"}},
            {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": 5}},
            {"name": "process_name", "ph": "M", "pid": 3, "args": "allreduce.w"},
            {"name": "process_name", "ph": "M", "pid": 4, "args": {"name": "allreduce.w"}},
            {"ph": "E", "pid": 4, "args": {"shape": "[3"}}, {"ph": "E", "pid": 4, "args": {"shape": 3}},
            {"ph": "E", "pid": 4, "args": {"shape": "[" + "9" * 500 + "]"}}, {"ph": "E", "pid": "4"},
            {"ph": "E", "pid": 4, "args": {"shape": "[-3]"}}, None, "E", 7]))
    elif kind == "empty":
        path.write_text("")
    elif kind == "oversized":  # sparse: no disk used
        with open(path, "wb") as f:
            f.truncate(rules.MAX_TIMELINE_BYTES + 1)
    elif kind == "symlink":  # to a valid timeline: the grader reads no file outside the run's folder
        path.symlink_to(_write_timeline(tmp_path / "elsewhere.json", {"w": [3]}, rounds=10))
    elif kind == "fifo":  # reading would block forever
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()


@pytest.mark.parametrize("kind", ["binary", "text", "nested", "object", "numbers", "odd_types", "empty", "oversized",
                                  "symlink", "fifo", "directory"])
def test_a_junk_timeline_is_a_fail_with_a_message_never_a_crash(kind, tmp_path):
    path = tmp_path / "run" / TIMELINE
    path.parent.mkdir()
    _junk(kind, path, tmp_path)
    t = time.monotonic()
    verdict = grader.horovod_averaging(path, {"w": torch.zeros(3)}, samples_per_worker=20, epochs=1, settings=QUICK)
    assert time.monotonic() - t < 30
    assert not verdict["ok"], verdict
    message = verdict["message"]
    assert "could not be read" in message or "no Horovod gradient all-reduce" in message, message
    assert "SECRET" not in message
    if kind == "oversized":
        assert f"{rules.MAX_TIMELINE_BYTES // 2**20} MB" in message and "larger than" in message, message


def test_horovod_averaging_needs_every_tensor_every_step():
    weights = {"a": torch.zeros(4, 2), "b": torch.zeros(4), "c": torch.zeros(4)}  # two tensors of one shape

    def rounds(shapes: dict[str, list[int]], n: int, tmp: Path) -> dict:
        path = _write_timeline(tmp / f"{len(shapes)}-{n}.json", shapes, n)
        return grader.horovod_averaging(path, weights, samples_per_worker=64 * 10, epochs=2, settings=QUICK)

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        every = rounds({"a": [4, 2], "b": [4], "c": [4]}, 20, Path(tmp))
        assert every["ok"] and every["measurements"]["horovod_gradient_rounds_per_epoch"] == 10, every
        part = rounds({"b": [4], "c": [4]}, 20, Path(tmp))  # the [4, 2] tensor never all-reduced
        assert not part["ok"] and "never all of them" in part["message"], part
        half = rounds({"a": [4, 2], "b": [4]}, 20, Path(tmp))  # counted by shape: 20 of [4] are 10 rounds of b and c
        assert half["measurements"]["horovod_gradient_rounds_per_epoch"] == 5, half
        once = rounds({"a": [4, 2], "b": [4], "c": [4]}, 2, Path(tmp))  # once an epoch: 640 images a step
        assert not once["ok"] and "too few" in once["message"] and "2 complete rounds" in once["message"], once
    missing = grader.horovod_averaging(None, weights, 640, 2, QUICK, source="model = DistributedDataParallel(model)")
    assert not missing["ok"] and "no Horovod gradient all-reduce" in missing["message"]
    assert "torch DDP" in missing["message"] and "your script uses torch.distributed" in missing["message"]


def test_an_accuracy_fail_names_an_unscaled_or_unwarmed_learning_rate():
    reference = grader.REFERENCE.read_text()
    assert grader.learning_rate_hints(reference) == []  # scaled (lr * workers) and warmed up
    unscaled = reference.replace("target_lr = args.lr * workers", "target_lr = args.lr")
    assert [h for h in grader.learning_rate_hints(unscaled) if "hvd.size()" in h and "scale" in h]
    cold = re.sub(r"warm[_-]?up", "ramp", reference, flags=re.IGNORECASE)
    assert [h for h in grader.learning_rate_hints(cold) if h.startswith("no warm-up")]
    assert grader.learning_rate_hints(grader.STARTER.read_text()) == []  # unconverted: other messages first
    assert grader.learning_rate_hints("def broken(:") == []


def test_a_run_where_only_rank_0_ever_saves_is_stopped_after_a_grace():
    """An unconverted script (4 copies, all 'rank 0') can never earn a point: the grader stops it
    once rank 0 saved epoch 1 and no other rank followed within the grace (20 s, or a quarter of
    the time rank 0 took); a real run, or one that saves every rank's checkpoints in a burst, is
    never stopped."""
    rule = grader.lone_rank0(4, grace_s=20.0)
    alone = {(0, 1): 40.0}
    assert rule(alone, 59.9) == ""  # within the grace
    assert "stopped early" in rule(alone, 60.0) and "no other rank" in rule(alone, 60.0)
    slow = {(0, 1): 200.0}  # rank 0 took 200 s to its first checkpoint: the grace is 50 s
    assert rule(slow, 249.0) == "" and "stopped early" in rule(slow, 250.0)
    assert rule({**alone, (3, 1): 59.0}, 600.0) == ""  # another rank saved: a real (if slow) run
    assert rule({}, 600.0) == ""  # nothing saved yet: the time budget decides
    assert grader.lone_rank0(1)(alone, 600.0) == ""  # a one-worker grading has only rank 0
    rec = runner.RunRecord(command=["x"], returncode=-9, wall_s=60.0, stopped_early=rule(alone, 60.0))
    assert not rec.ok and grader.run_failure(rec, BROKEN_SETTINGS).startswith("stopped early")


# ----------------------------------------------------------------------------- evidence a submission can forge (issue 31)


def _fake_run(tmp_path: Path, indices: dict[int, list[int]], epochs=(1, 2)) -> dict[tuple[int, int], Path]:
    """Checkpoints of identical weights where rank r reports ``indices[r]`` every epoch."""
    ckpts = {}
    for epoch in epochs:
        for rank, idx in indices.items():
            ckpts[(rank, epoch)] = tmp_path / f"rank-{rank}-epoch-{epoch}.pt"
            torch.save({"model": {"w": torch.ones(3)}, "indices": idx}, ckpts[(rank, epoch)])
    return ckpts


def _quick_train_root():
    from multigpu.core import data

    root = data.ensure_dataset(train_per_class=QUICK.train_per_class, val_per_class=QUICK.val_per_class, progress=False)
    return root, len(data.JPEGFolder(root, None, split="train"))


def test_an_index_listed_twice_fails_sharded_and_counts_as_one_image(tmp_path):
    """Issue 31 (b): every rank reports a disjoint shard with each index listed `workers` times."""
    root, size = _quick_train_root()
    ckpts = _fake_run(tmp_path, {r: [i for i in range(r, size, 2) for _ in range(2)] for r in (0, 1)})
    rec = runner.RunRecord(command=[], returncode=0, wall_s=10, epoch_times={1: 4.0, 2: 8.0})
    timeline = _write_timeline(tmp_path / TIMELINE, {"w": [3]}, rounds=40)
    m = {"baselines": [size / 4.0, size / 4.0], "ideal_factor": 2}
    crit = grader.judge(rec, ckpts, BROKEN_SETTINGS, root, root, m, print, "import horovod", timeline_path=timeline)
    assert crit["identical"].passed, crit["identical"].message
    c = crit["sharded"]
    assert not c.passed and "rank 0 listed" in c.message and "more than once" in c.message, c.message
    # the images of an epoch are the distinct indices: 'size' a 4-s epoch, not twice that
    assert m["throughput"] == pytest.approx(size / 4.0)
    loaded = {k: grader.load_checkpoint(p) for k, p in ckpts.items()}
    assert grader.images_per_epoch(loaded) == {1: size, 2: size}


def test_samples_listed_but_never_read_fail_sharded_and_do_not_count_as_images(tmp_path):
    """Issue 40 (2): the ranks list their whole shards, the grader saw only two thirds of the files
    opened: sharded fails with what it saw, images/s count what was read, and the pass would
    not be held for that (a claim the reads contradict is a fail, not a question)."""
    from array import array

    from multigpu.grading import connections, observations, reads

    root, size = _quick_train_root()
    ckpts = _fake_run(tmp_path, {r: list(range(r, size, 2)) for r in (0, 1)})
    read = [i for i in range(size) if i % 3]
    log = reads.ReadLog(array("i", read + read), {**{(r, 1): len(read) for r in (0, 1)},
                                                   **{(r, 2): 2 * len(read) for r in (0, 1)}})
    rec = runner.RunRecord(command=[], returncode=0, wall_s=10, epoch_times={1: 4.0, 2: 8.0},
                           checkpoint_times={(r, e): 4.0 * e for r in (0, 1) for e in (1, 2)},
                           observed={"reads": log, "talk": connections.Talk([], 8, [])})
    timeline = _write_timeline(tmp_path / TIMELINE, {"w": [3]}, rounds=40)
    m = {"baselines": [size / 4.0, size / 4.0], "ideal_factor": 2}
    crit, ev = grader.judged(rec, ckpts, BROKEN_SETTINGS, root, root, m, print, "import horovod",
                             timeline_path=timeline)
    c = crit["sharded"]
    assert not c.passed and f"the ranks claimed {size} samples, and {size - len(read)} of them were never read" \
        in c.message and "watched the training set" in c.message, c.message
    assert m["throughput"] == pytest.approx(len(read) / 4.0)  # epoch 2's images: the ones read
    assert m["reads_per_epoch"][1] == {"epoch": 2, "claimed": size, "read": len(read), "confirmed": len(read),
                                       "earlier": 0, "never": size - len(read)}
    assert observations.flags(ev.observed) == [] and m["foreign_connections"] == []


def test_a_timeline_that_fits_is_not_taken_at_its_word_when_the_ranks_talked_outside_horovod(tmp_path):
    """Issue 40 (1): the timeline counts its rounds, but the grader saw a connection between the
    ranks over MPI (where Horovod opens none): identical says so and the review holds the pass."""
    from array import array

    from multigpu.grading import connections, observations, reads

    root, size = _quick_train_root()
    ckpts = _fake_run(tmp_path, {r: list(range(r, size, 2)) for r in (0, 1)})
    log = reads.ReadLog(array("i", list(range(size)) * 2), {**{(r, 1): size for r in (0, 1)},
                                                            **{(r, 2): 2 * size for r in (0, 1)}})
    gloo = connections.Link("rank 0", "rank 1", 40123, 29512, 3.0)
    rec = runner.RunRecord(command=["horovodrun", "--mpi"], returncode=0, wall_s=10, epoch_times={1: 4.0, 2: 8.0},
                           observed={"reads": log, "talk": connections.Talk([gloo], 8, [])})
    timeline = _write_timeline(tmp_path / TIMELINE, {"w": [3]}, rounds=40)
    m = {"baselines": [], "ideal_factor": 2}
    crit, ev = grader.judged(rec, ckpts, BROKEN_SETTINGS, root, root, m, print, "import horovod",
                             timeline_path=timeline)
    c = crit["identical"]
    assert c.passed and "1 TCP connection(s) that Horovod did not open" in c.message, c.message
    assert [r.never for r in ev.observed.reads] == [0, 0]  # every listed sample read in its epoch
    assert [f.kind for f in observations.flags(ev.observed)] == ["network"]
    assert m["foreign_connections"] == ["rank 0 (port 40123) <-> rank 1 (port 29512), from 3 s"]


def test_an_efficiency_above_the_ideal_is_never_a_pass(tmp_path):
    from multigpu.grading import evidence
    from multigpu.grading.criteria import throughput

    root, size = _quick_train_root()
    ckpts = _fake_run(tmp_path, {r: list(range(r, size, 2)) for r in (0, 1)})
    rec = runner.RunRecord(command=[], returncode=0, wall_s=10, epoch_times={1: 4.0, 2: 8.0})
    others_passed = {n: grader.Criterion(n, 1, True, "") for n in throughput.AFTER}
    crit = {}
    for ratio in (1.0, 1.2, 1.3, 3.0):  # throughput / ideal; the ideal is 2 x the baseline
        m = {"baselines": [size / 4.0 / 2 / ratio] * 2, "ideal_factor": 2}
        ev = dataclasses.replace(evidence.collect(rec, ckpts, BROKEN_SETTINGS, root, root, m, print),
                                 verdicts=others_passed)
        crit[ratio] = throughput.judge(ev, BROKEN_SETTINGS)
        assert crit[ratio].measured["efficiency"] == pytest.approx(ratio, rel=1e-3)
    assert crit[1.0].passed and crit[1.2].passed, crit[1.2].message  # within the stated tolerance
    for ratio in (1.3, 3.0):
        assert not crit[ratio].passed and "does not trust" in crit[ratio].message, crit[ratio].message
    assert rules.MAX_TRUSTED_EFFICIENCY == 1 + QUICK.baseline_tolerance


def _clock(real_timeline: Path, shift_s: float, trained_until: float | None = None) -> grader.RunClock:
    """A run clock that puts the real timeline's start ``shift_s`` after the run's start."""
    from multigpu.running import timeline

    start = grader.timeline_start(timeline.load(real_timeline, max_bytes=rules.MAX_TIMELINE_BYTES))
    return grader.RunClock(started_at=start - shift_s, wall_s=60.0,
                           trained_until=trained_until if trained_until is not None else 50.0)


@pytest.mark.slow
def test_a_timeline_counts_only_where_it_fits_the_runs_clock(real_timeline, tmp_path):
    """Issue 31 (a): a timeline written by the submission after training, or with a made-up clock,
    is not Horovod's account of the run."""
    def verdict(clock, path=real_timeline):
        return grader.horovod_averaging(path, NAMED, samples_per_worker=20, epochs=1, settings=QUICK, clock=clock)

    fits = verdict(_clock(real_timeline, shift_s=3.0))
    assert fits["ok"] and "5 complete rounds" in fits["message"], fits
    # the timeline started before the run, or after it ended: made up, or not this run's
    for shift in (-10.0, 70.0):
        v = verdict(_clock(real_timeline, shift_s=shift))
        assert not v["ok"] and "does not fit the run" in v["message"], v
    # every round ended after the last epoch's checkpoints: written when training was over
    late = verdict(_clock(real_timeline, shift_s=3.0, trained_until=0.5))
    assert not late["ok"] and "after the last epoch's checkpoints" in late["message"], late
    # no start time: not Horovod's format
    text = real_timeline.read_text().replace("start_time_since_epoch_in_micros", "started")
    (tmp_path / TIMELINE).write_text(text)
    v = verdict(_clock(real_timeline, shift_s=3.0), tmp_path / TIMELINE)
    assert not v["ok"] and "lacks the start time" in v["message"], v
    assert TIMELINE not in v["message"]  # the grader's file name is its own


def test_an_allreduce_counts_only_in_horovods_format(tmp_path):
    """A bare begin/end pair with the right shape is no all-reduce: Horovod's ALLREDUCE phase holds
    the library's own phase (MPI_, GLOO_, NCCL_ALLREDUCE)."""
    weights = {"w": torch.zeros(3)}
    path = _write_timeline(tmp_path / TIMELINE, {"w": [3]}, rounds=4)
    events = json.loads(path.read_text().rstrip(",") + "]")
    assert grader.gradient_allreduce_rounds(events, weights) == (4, 4)
    bare = [e for e in events if e.get("name") not in ("NEGOTIATE_ALLREDUCE", "GLOO_ALLREDUCE", "0")]
    bare = [e for i, e in enumerate(bare) if not (e.get("ph") == "E" and "args" not in e)]
    assert grader.gradient_allreduce_rounds(bare, weights) == (0, 0)
    assert grader.timeline_file(tmp_path) != grader.timeline_file(tmp_path)  # a name no script can know


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param("duplicate_indices", marks=pytest.mark.matrix), "timeline_forger",
                                  pytest.param("zero_allreduce", marks=pytest.mark.matrix)])
def test_the_forgeries_of_issue_31_are_failed_or_held_never_certified(name, tmp_path):
    """(b) every rank trains on all the data and lists each index of a disjoint shard `workers`
    times: sharded fails. (a) torch DDP whose rank 0 writes a Horovod-format timeline (real step
    times): the run may fit, the source is flagged. (c) each rank trains alone, zeros shaped like
    the gradients all-reduced every step, rank 0's weights broadcast before each save: flagged."""
    if name == "duplicate_indices":  # every rank on all the data: one epoch
        result = _grade(name, tmp_path, args=("--epochs", "1"))
    else:
        result = _grade(name, tmp_path)
    assert result.ok("workers"), result.message("workers")
    assert not (result.passed and not result.held), result.report()
    kinds = {f["kind"] for f in result.review["flags"]}
    if name == "duplicate_indices":
        c = result.criteria["sharded"]
        assert not c.passed and "more than once" in c.message, c.message
    elif name == "timeline_forger":  # torch's Gloo connections between the ranks, seen from outside
        assert {"timeline", "channel", "network"} <= kinds, result.review
    else:
        assert "collective" in kinds, result.review
        assert result.measurements["horovod_gradient_rounds_per_epoch"] > 0  # the zeros are real all-reduces
    assert result.review["held"] == (result.passed and bool(kinds))
    assert result.source_sha256 == audit.sha256((tmp_path / f"{name}.py").read_bytes())


@pytest.mark.slow
@pytest.mark.parametrize("name,epochs", [("short_epochs", 1), ("hidden_ddp", 1), ("cached_decoded", 2)])
def test_what_the_grader_sees_from_outside_fails_or_holds_the_cheats_of_issue_40(name, epochs, tmp_path):
    """(2) each rank trains on 2/3 of its shard and lists all of it: the files of the rest were never
    opened, sharded fails. (1) torch DDP reached through vars() and names cut in pieces, with a
    forged timeline: the ranks' Gloo connections are seen from outside, the pass is held. An honest
    conversion that caches the decoded data set opens no file after epoch 1: held with the figures.
    The other disguises are caught by the review of their source (tests/test_review.py); ``multigpu
    calibrate`` grades all nine."""
    # the honest cache's pass must be held: on the quick profile's data, where it can pass
    settings = BROKEN_SETTINGS if name == "cached_decoded" else TINY_SETTINGS
    result = _grade(name, tmp_path, settings, args=("--epochs", str(epochs)))
    assert result.ok("workers"), result.message("workers")
    assert not (result.passed and not result.held), result.report()
    kinds = {f["kind"] for f in result.review["flags"]}
    reads = result.measurements["reads_per_epoch"]
    if name == "short_epochs":
        c = result.criteria["sharded"]
        assert not c.passed and "never read" in c.message and "watched the training set" in c.message, c.message
        assert reads[0]["never"] > 0.25 * reads[0]["claimed"], reads  # the last third of each shard
        assert not {"reads", "network"} & kinds and result.measurements["foreign_connections"] == []
    elif name == "hidden_ddp":
        assert {"network", "dynamic"} <= kinds, result.review
        assert result.measurements["foreign_connections"], result.measurements  # torch's Gloo, rank to rank
        if result.ok("identical"):  # its forged timeline fits: the verdict says it is not taken at its word
            assert "connection(s) that Horovod did not open" in result.criteria["identical"].message
        assert all(r["confirmed"] == r["claimed"] for r in reads), reads
    else:
        assert kinds == {"reads"} and result.ok("sharded"), result.report()
        # each rank keeps what it decoded; its new shard of epoch 2 is about half new to it (read),
        # half in its memory (not read again: "earlier")
        e2 = reads[1]
        assert e2["never"] == 0 and e2["earlier"] > 0.25 * e2["claimed"] and e2["confirmed"] + e2["earlier"] == \
            e2["claimed"], reads
        assert result.review["held"] == result.passed


# ----------------------------------------------------------------------------- the pipeline of criteria


def test_the_criteria_are_one_module_each_in_order_and_read_only_earlier_verdicts(tmp_path):
    from multigpu.grading import criteria, evidence

    assert [c.NAME for c in criteria.CRITERIA] == ["workers", "identical", "sharded", "accuracy", "throughput"]
    assert grader.POINTS == {c.NAME: c.POINTS for c in criteria.CRITERIA} and sum(grader.POINTS.values()) == 10
    with pytest.raises(ValueError, match="throughput reads"):  # a criterion never reads a later verdict
        criteria.check_order((criteria.throughput, criteria.workers))
    # no checkpoint: the criteria that require them fail with the evidence's reason; workers says why
    rec = runner.RunRecord(command=[], returncode=0, wall_s=10)
    ev = evidence.collect(rec, {}, BROKEN_SETTINGS, tmp_path, tmp_path, {"baselines": []}, print)
    assert "nothing to compare" in ev.unavailable[evidence.CHECKPOINTS] and not ev.loaded
    verdicts = criteria.judge_all(ev, BROKEN_SETTINGS)
    assert list(verdicts) == list(grader.POINTS) and not any(c.passed for c in verdicts.values())
    for name in ("identical", "sharded", "accuracy"):
        assert verdicts[name].message == ev.unavailable[evidence.CHECKPOINTS]
    assert "left no checkpoint" in verdicts["workers"].message
    assert verdicts["workers"].measured == {"epochs": 0}


def test_a_session_reuses_only_a_grading_of_the_same_bytes_settings_arguments_and_sandbox(tmp_path, monkeypatch):
    from multigpu.grading import reuse

    raw = b"print('a conversion')\n"
    result = grader.deferred(QUICK, "graded earlier")
    result.criteria["workers"].passed = True
    monkeypatch.delenv(reuse.ENV, raising=False)
    reuse.keep(result, raw, QUICK, ())
    assert reuse.earlier(raw, QUICK, (), sandboxed=False) is None  # no session folder: nothing kept
    monkeypatch.setenv(reuse.ENV, str(tmp_path / "kept"))
    reuse.keep(result, raw, QUICK, ())
    again = reuse.earlier(raw, QUICK, (), sandboxed=False)
    assert again is not None and again.to_dict() == result.to_dict()
    assert reuse.earlier(raw + b"#", QUICK, (), sandboxed=False) is None
    assert reuse.earlier(raw, QUICK.replace(accuracy=0.5), (), sandboxed=False) is None
    assert reuse.earlier(raw, QUICK, ("--epochs", "1"), sandboxed=False) is None
    assert reuse.earlier(raw, QUICK, (), sandboxed=True) is None  # an unsandboxed verdict never stands for a sandboxed one
    script = tmp_path / "train.py"
    script.write_bytes(raw)
    assert grader.grade(script, QUICK, sandbox="off").to_dict() == result.to_dict() | {"script": str(script)}
