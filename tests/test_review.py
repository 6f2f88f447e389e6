"""Review flags read from a submission's source, the hold on a flagged pass, the instructor's
decision, and the audit trail of an official result (grading/review.py, official.py, audit.py).

Nothing here runs a submission: the flags come from Python's ast; the real gradings of the
forgeries are in tests/test_grading.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from multigpu.grading import audit, grader, official, review, variants, vocabulary


def _flags(name: str, tmp_path: Path) -> list[review.Flag]:
    return review.flags(variants.write(name, grader.REFERENCE, tmp_path / f"{name}.py").read_text())


def test_the_reference_and_the_starter_are_never_flagged():
    assert review.flags(grader.REFERENCE.read_text()) == []
    assert review.flags(grader.STARTER.read_text()) == []


@pytest.mark.parametrize("name", sorted(variants.HONEST))
def test_honest_conversions_are_never_flagged(name, tmp_path):
    text = variants.write(name, grader.REFERENCE, tmp_path / f"{name}.py").read_text()
    compile(text, name, "exec")
    assert text.startswith('"""HONEST VARIANT') and text != grader.REFERENCE.read_text()
    assert review.flags(text) == [], [f.to_dict() for f in review.flags(text)]


def test_there_are_twenty_honest_conversions():
    assert len(variants.HONEST) >= 20
    assert not set(variants.HONEST) & set(variants.MUST_FAIL)


@pytest.mark.parametrize("name,kind,words", [
    # issue 31 (a): torch DDP, and rank 0 writes Horovod's timeline itself
    ("timeline_forger", "timeline", "HOROVOD_TIMELINE"),
    ("timeline_forger", "import", "torch.distributed"),
    # issue 31 (c): each rank trains alone; zero tensors shaped like the gradients all-reduced
    ("zero_allreduce", "collective", "zeros_like"),
    ("zero_allreduce", "collective", "broadcast_parameters"),
    ("never_averaged", "collective", "broadcast_parameters"),
    ("rank0_trains_alone", "collective", "broadcast_parameters"),
    ("ddp_under_horovodrun", "call", "DistributedDataParallel"),
    ("straggler", "call", "sleep"),
    ("hang", "stall", "while True"),
    # issue 40, kind 1: another framework reached by hidden names, a forged timeline
    ("hidden_ddp", "dynamic", "vars(torch)['distri' + 'buted']"),
    ("hidden_ddp", "dynamic", '"HORO" + "VOD_TIME" + "LINE"'),
    ("hidden_ddp_filestore", "dynamic", "getattr(torch, ''.join(['dis', 'trib', 'uted']))"),
    ("file_averaging", "call", "torch.load(o)"),
    ("file_averaging", "stall", "while not all"),
    # kind 2: less work than claimed, the rest of the files opened to look read
    ("short_epochs_touch", "call", "train_set.dataset.read(i)"),
    # kind 3: genuine all-reduces, local steps, rank 0's weights copied before each save
    ("local_steps", "call", "torch.autograd.grad"),
    ("local_steps", "call", "optimizer.synchronize()"),
    ("local_steps", "call", "optimizer.skip_synchronize()"),
    ("local_steps", "dynamic", "before_save['sync'](model.state_dict(), root_rank=0)"),
    ("local_steps_shadow", "collective", "hvd.broadcast_parameters(model.state_dict(), root_rank=0)"),
    ("local_steps_reload", "call", "model.load_state_dict(torch.load(first)['model'])"),
])
def test_the_forgeries_are_flagged_on_the_line_that_does_it(name, kind, words, tmp_path):
    found = [f for f in _flags(name, tmp_path) if f.kind == kind]
    assert any(words in f.code for f in found), [f.to_dict() for f in _flags(name, tmp_path)]
    assert all(f.line > 0 and f.why for f in found)


def test_less_work_within_the_vocabulary_raises_no_source_flag(tmp_path):
    """short_epochs and its cached disguise use only what a conversion uses: what the grader saw
    read catches them (tests/test_grading.py), not the review of the source."""
    assert _flags("short_epochs", tmp_path) == [] and _flags("short_epochs_cached", tmp_path) == []


#: What the snippets of the tests below import, as a conversion does.
HEADER = "import os\nimport horovod.torch as hvd\nimport torch\nfrom pathlib import Path\n"


@pytest.mark.parametrize("line,kind", [
    ("grads = hvd.grouped_allreduce([p.grad for p in model.parameters()])", "collective"),
    ("for p in model.parameters():\n    hvd.allreduce_(p.data, name='x')", "collective"),
    ("for s in SHAPES:\n    hvd.allreduce(torch.zeros(s).shape, name='y')", "collective"),
    ("for x in batches:\n    hvd.broadcast_parameters(model.state_dict(), root_rank=0)", "collective"),
    ("def sync(m):\n    hvd.broadcast_parameters(m.state_dict(), root_rank=0)\nfor x in xs:\n    sync(model)",
     "collective"),
    ("later = lambda: hvd.broadcast_parameters(model.state_dict(), root_rank=0)", "collective"),
    ("hvd.start_timeline('/tmp/t.json')", "timeline"),
    ("os.environ['HOROVOD_TIMELINE'] = 'x'", "timeline"),
    # imports and calls outside the vocabulary
    ("from mpi4py import MPI", "import"),
    ("import socket", "import"),
    ("import torch.distributed as dist", "import"),
    ("grads = torch.autograd.grad(loss, list(model.parameters()))", "call"),
    ("optimizer.synchronize()", "call"),
    ("with optimizer.skip_synchronize():\n    optimizer.step()", "call"),
    ("m = importlib.import_module('torch.distributed')", "call"),
    ("time.sleep(0.5)", "call"),
    ("data = open('/etc/passwd').read()", "call"),
    ("secret = Path.home() / '.ssh'", "call"),
    ("raw = torch.load(os.environ['OTHER_RESULTS'])", "call"),
    ("text = Path(__file__).parents[2].joinpath('key').read_text()", "call"),
    ("class Saver:\n    def __exit__(self, *a):\n        pass", "call"),
    ("ddp = torch.nn.parallel.DistributedDataParallel(model)", "call"),
    # dynamic access, anywhere
    ("d = vars(torch)", "dynamic"),
    ("d = torch.__dict__['distributed']", "dynamic"),
    ("g = globals()['hvd']", "dynamic"),
    ("f = getattr(hvd, 'all' + 'reduce')", "dynamic"),
    ("setattr(optimizer, 'step', None)", "dynamic"),
    ("import sys\nd = sys.modules['torch.distributed']", "dynamic"),
    ("exec(open('x').read())", "dynamic"),
    ("hooks = {'a': print}\nhooks['a']('x')", "dynamic"),
    ("table = {'a': print}\ntable.get('a')('x')", "dynamic"),
    ("f = optimizer.synchronize\nf()", "dynamic"),
    ("for f in steps:\n    f()", "dynamic"),
    ("hvd.allreduce = print", "dynamic"),
    ("name = 'distri' + 'buted'", "dynamic"),
    ("name = ''.join(['distri', 'buted'])", "dynamic"),
    ("name = 'detubirtsid'[::-1]", "dynamic"),
    ("for _ in range(10**8):\n    pass", "stall"),
])
def test_each_kind_of_flag(line, kind):
    found = review.flags(HEADER + line + "\n")
    assert kind in {f.kind for f in found}, (line, [f.to_dict() for f in found])
    assert all(f.line > 4 for f in found if f.kind == kind)  # on the snippet's line, not the imports'


@pytest.mark.parametrize("line", [
    "counts = hvd.allreduce(torch.tensor([correct, total]), op=hvd.Sum, name='val_counts')",
    "root = os.environ.get('MULTIGPU_ASSESSMENT_DATA')",
    "Path(args.checkpoint_dir).mkdir(parents=True, exist_ok=True)",
    "model.eval()\nwith torch.no_grad():\n    out = model(images.to(device))",
    "hvd.broadcast_parameters(model.state_dict(), root_rank=0)\nfor x in xs:\n    optimizer.step()",
    "optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), op=hvd.Average)",
    "first = hvd.broadcast_object(1, root_rank=0, name='first_epoch')",
    "scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda i: rate(i))",
    "if torch.cuda.is_available():\n    torch.cuda.set_device(hvd.local_rank())",
    "raise ValueError('no data')",
    "print(f'{len(xs)} of {max(xs)}: ' + 'done')",
])
def test_what_the_known_conversions_do_is_not_flagged(line):
    assert review.flags(HEADER + line + "\n") == []


def test_the_vocabulary_is_learned_from_the_known_conversions_and_holds_no_cheat():
    known = vocabulary.known()
    learned = vocabulary.learn([grader.STARTER.read_text(), grader.REFERENCE.read_text()])
    assert learned <= known and vocabulary.HOROVOD_API <= known
    for cheat in ("call:torch.autograd.grad", "method:synchronize", "method:skip_synchronize", "call:torch.load",
                  "method:load_state_dict", "import:torch.distributed", "call:builtins.open", "call:builtins.getattr",
                  "call:builtins.vars", "call:builtins.exec", "call:horovod.torch.start_timeline",
                  "call:horovod.torch.grouped_allreduce", "method:register_hook", "method:copy_", "call:time.sleep",
                  "import:sys", "import:importlib", "import:subprocess", "import:socket", "define:__exit__"):
        assert cheat not in known, cheat
    # it grows by a reviewed honest conversion, and only by what that conversion does
    assert "call:torch.optim.lr_scheduler.LambdaLR" in known and "call:torch.cuda.set_device" in known


def test_a_flagged_pass_is_held_and_a_flagged_fail_is_not():
    flag = review.Flag("stall", 3, "time.sleep(1)", "a sleep")
    held = review.record([flag], passed=True)
    assert held["held"] and held["decision"] is None and review.awaits_decision(held) and not review.released(held)
    assert not review.record([flag], passed=False)["held"]
    assert not review.record([], passed=True)["held"] and review.released(review.record([], True))
    assert review.released({**held, "decision": {"approved": True}})
    assert not review.released({**held, "decision": {"approved": False}})
    assert review.record([], True) == grader.GradeResult("x", grader.rules.QUICK, {}).review


def _official(tmp_path: Path, passed: bool, flags: list[dict]) -> Path:
    """An official result of 'alice' as grade_submissions writes it (its kept source beside it)."""
    results = tmp_path / "grading" / "results"
    results.mkdir(parents=True)
    source = grader.REFERENCE.read_bytes()
    (results / "alice.train.py").write_bytes(source)
    result = {"script": "alice/assessments/train.py", "passed": passed, "sandboxed": True,
              "settings": grader.rules.QUICK.to_dict(), "criteria": {}, "measurements": {},
              "source_sha256": audit.sha256(source), "source_file": "alice.train.py",
              "grader_version": audit.grader_version(), "review": review.record(flags, passed)}
    (results / "alice.json").write_text(json.dumps(result))
    return tmp_path / "grading"


def test_a_held_pass_reads_as_not_passed_until_approved_and_the_decision_is_recorded(tmp_path):
    flag = review.Flag("collective", 12, "hvd.allreduce(torch.zeros_like(p))", "zeros").to_dict()
    grading = _official(tmp_path, passed=True, flags=[flag])
    assert official.load_result(grading, "alice")["passed"] is False
    assert "held for review" in official.load_result(grading, "alice")["withheld"]
    assert [s for s, _ in official.held(grading)] == ["alice"]
    with pytest.raises(ValueError, match="reason"):
        official.decide(grading, "alice", approve=True, reason=" ")
    official.decide(grading, "alice", approve=False, reason="zeros all-reduced, gradients never averaged", by="ta")
    assert "rejected on review by ta" in official.load_result(grading, "alice")["withheld"]
    d = official.decide(grading, "alice", approve=True, reason="checked: metric tensors", by="prof")
    result = official.load_result(grading, "alice")
    assert result["passed"] is True and "withheld" not in result and result["review"]["decision"] == d
    log = [json.loads(x) for x in (grading / "results" / "review-log.jsonl").read_text().splitlines()]
    assert [(x["by"], x["approved"]) for x in log] == [("ta", False), ("prof", True)]
    assert all(x["source_sha256"] == result["source_sha256"] for x in log)
    with pytest.raises(ValueError, match="no official result"):
        official.decide(grading, "bob", approve=True, reason="x")


def test_an_unflagged_pass_is_not_held(tmp_path):
    grading = _official(tmp_path, passed=True, flags=[])
    assert official.load_result(grading, "alice")["passed"] is True and official.held(grading) == []
    with pytest.raises(ValueError, match="not held"):
        official.decide(grading, "alice", approve=True, reason="x")


@pytest.mark.slow
def test_review_command_lists_shows_and_decides(tmp_path):
    flag = review.Flag("timeline", 7, "open(os.environ['HOROVOD_TIMELINE'], 'w')", "names the timeline").to_dict()
    grading = _official(tmp_path, passed=True, flags=[flag])

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "multigpu.cli", "review", "--grading", str(grading), *args],
                              capture_output=True, text=True, check=False, timeout=120)

    listed = cli()
    assert listed.returncode == 0 and "alice" in listed.stdout and "AWAITS A DECISION" in listed.stdout, listed
    shown = cli("alice")
    assert "line 7 [timeline]" in shown.stdout and "HOROVOD_TIMELINE" in shown.stdout, shown.stdout
    decided = cli("alice", "--reject", "writes the timeline itself")
    assert decided.returncode == 0 and "REJECTED" in decided.stdout, decided
    assert "rejected" in cli().stdout


@pytest.mark.slow
def test_the_kept_source_is_checked_against_its_hash(tmp_path):
    grading = _official(tmp_path, passed=True, flags=[])
    result_file = grading / "results" / "alice.json"
    stored = json.loads(result_file.read_text())
    assert audit.stored_source(result_file, stored) == grading / "results" / "alice.train.py"
    (grading / "results" / "alice.train.py").write_text("print('another script')\n")
    with pytest.raises(ValueError, match="not the graded source"):
        audit.stored_source(result_file, stored)
    with pytest.raises(ValueError, match="keeps no copy"):
        audit.stored_source(result_file, {**stored, "source_file": "../../elsewhere.py"})
    out = subprocess.run([sys.executable, "-m", "multigpu.cli", "regrade", str(result_file)],
                         capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 2 and "not the graded source" in out.stderr, out


def test_keep_source_refuses_a_file_that_changed_after_grading(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("x = 1\n")
    graded = audit.sha256(script.read_bytes())
    assert audit.keep_source(script, tmp_path / "alice.json", graded) == "alice.train.py"
    assert (tmp_path / "alice.train.py").read_bytes() == script.read_bytes()
    script.write_text("x = 2\n")
    with pytest.raises(ValueError, match="changed after it was graded"):
        audit.keep_source(script, tmp_path / "alice.json", graded)


@pytest.mark.slow
def test_the_grader_version_names_the_package_and_the_commit(repo):
    import multigpu

    version = audit.grader_version()
    assert version.startswith(multigpu.__version__)
    commit = audit.git_commit(repo)
    if (repo / ".git").exists():
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
        assert commit == head.stdout.strip() and version.endswith(f"+g{commit[:12]}")
    assert audit.git_commit(Path("/")) is None
