"""Review flags read from a submission's source, the hold on a flagged pass, the instructor's
decision, and the audit trail of an official result (grading/review.py, review_rules.py,
review_training.py, review_flow.py, capabilities.py, official.py, audit.py).

Nothing here runs a submission: the flags come from Python's ast; the real gradings of the
forgeries are in tests/test_grading.py, of a sample of the honest corpus in tests/test_corpus.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from multigpu.grading import audit, capabilities, grader, official, review, variants

CORPUS = Path(__file__).parent / "fixtures" / "corpus"


def _flags(name: str, tmp_path: Path) -> list[review.Flag]:
    return review.flags(variants.write(name, grader.REFERENCE, tmp_path / f"{name}.py").read_text())


def test_the_reference_is_never_flagged_and_the_starter_only_for_its_local_step():
    assert review.flags(grader.REFERENCE.read_text()) == []
    assert [(f.kind, f.code) for f in review.flags(grader.STARTER.read_text())] == [("steps", "optimizer.step()")]


def _corpus() -> list[Path]:
    return sorted(CORPUS.glob("*/*/train.py"))


def test_the_honest_corpus_holds_forty_conversions_written_independently():
    """Issue 49, point 2: two writers, each given only the starter and the assessment's text
    (their INDEX.md says what each conversion does); docs/calibration.md lists them."""
    assert len(_corpus()) >= 40
    for writer in {p.parents[1] for p in _corpus()}:
        index = (writer / "INDEX.md").read_text()
        assert all(p.parent.name in index for p in _corpus() if p.parents[1] == writer)


@pytest.mark.parametrize("path", _corpus(), ids=lambda p: f"{p.parents[1].name}/{p.parent.name}")
def test_no_conversion_of_the_honest_corpus_is_flagged(path):
    """A review by capability, not by familiarity: helper classes, logging, dataclasses, manual
    sharding, other optimizers and schedulers, accumulation, early exits, comments in other
    languages raise no flag (issue 49: 0 of >= 40 fail review, <= 5% held; here none is held)."""
    text = path.read_text()
    compile(text, str(path), "exec")
    assert review.flags(text) == [], [f.to_dict() for f in review.flags(text)]


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
    ("timeline_forger", "channel", "import torch.distributed"),
    ("timeline_forger", "channel", 'open(os.environ["HOROVOD_TIMELINE"], "w")'),
    # issue 31 (c): each rank trains alone; zero tensors shaped like the gradients all-reduced
    ("zero_allreduce", "collective", "zeros_like"),
    ("zero_allreduce", "collective", "broadcast_parameters"),
    ("never_averaged", "collective", "broadcast_parameters"),
    ("rank0_trains_alone", "collective", "broadcast_parameters"),
    ("ddp_under_horovodrun", "channel", "DistributedDataParallel"),
    ("ddp_under_horovodrun", "steps", "optimizer.step()"),
    ("fake_metrics", "channel", 'open("metrics.json", "w")'),
    # issue 40, kind 1: another framework reached by hidden names, a forged timeline
    ("hidden_ddp", "dynamic", "vars(torch)['distri' + 'buted']"),
    ("hidden_ddp", "timeline", '"HORO" + "VOD_TIME" + "LINE"'),
    ("hidden_ddp", "dynamic", 'vars(torch)["__builtins__"]'),
    ("hidden_ddp_filestore", "dynamic", "getattr(torch, ''.join(['dis', 'trib', 'uted']))"),
    ("file_averaging", "load", "torch.load(o)"),
    ("file_averaging", "channel", "torch.save([p.grad for p in model.parameters()]"),
    ("file_averaging", "gradients", "p.grad.copy_("),
    # kind 3: genuine all-reduces, local steps, rank 0's weights copied before each save
    ("local_steps", "gradients", "p.grad.copy_(g)"),
    ("local_steps", "gradients", "optimizer.synchronize()"),
    ("local_steps", "gradients", "optimizer.skip_synchronize()"),
    ("local_steps", "collective", "before_save = {'sync': hvd.broadcast_parameters}"),
    ("local_steps_shadow", "collective", "hvd.broadcast_parameters(model.state_dict(), root_rank=0)"),
    ("local_steps_shadow", "steps", "own.step()"),
    ("local_steps_reload", "load", "torch.load(first)"),
    ("local_steps_reload", "steps", "model.load_state_dict("),
    # issue 49: half of each batch's loss detached
    ("half_detached", "gradients", "loss.backward()"),
])
def test_the_forgeries_are_flagged_on_the_line_that_does_it(name, kind, words, tmp_path):
    found = [f for f in _flags(name, tmp_path) if f.kind == kind]
    assert any(words in f.code for f in found), [f.to_dict() for f in _flags(name, tmp_path)]
    assert all(f.line > 0 and f.why for f in found)


@pytest.mark.parametrize("name", ["short_epochs", "short_epochs_cached", "short_epochs_touch", "every_third_forward_only",
                                  "batch_48"])
def test_less_work_within_what_a_conversion_does_raises_no_source_flag(name, tmp_path):
    """These use only what an honest conversion uses: what the grader saw of the run catches the
    cheats (the reads, the work per round: tests/test_grading.py), not the review of the source."""
    assert _flags(name, tmp_path) == []


#: What the snippets of the tests below import, as a conversion does.
HEADER = "import os\nimport horovod.torch as hvd\nimport torch\nfrom pathlib import Path\n"


@pytest.mark.parametrize("line,kind", [
    # other channels between processes
    ("import socket", "channel"),
    ("from mpi4py import MPI", "channel"),
    ("import torch.distributed as dist", "channel"),
    ("from multiprocessing import shared_memory", "channel"),
    ("import mmap", "channel"),
    ("t = torch.from_file('/dev/shm/x', shared=True, size=10)", "channel"),
    ("ddp = torch.nn.parallel.DistributedDataParallel(model)", "channel"),
    ("r, w = os.pipe()", "channel"),
    ("grads.share_memory_()", "channel"),
    ("with open('/tmp/g.txt', 'w') as f:\n    f.write('x')", "channel"),
    ("Path('/dev/shm/g').write_bytes(b'x')", "channel"),
    ("torch.save(model.state_dict(), 'mine.pt')", "channel"),
    ("torch.save(x, Path(args.checkpoint_dir) / '..' / 'x.pt')", "channel"),
    ("torch.save(x, Path(args.checkpoint_dir).parent / 'x.pt')", "channel"),
    ("import tempfile\nd = tempfile.mkdtemp()", "channel"),
    ("import logging\nlogging.basicConfig(filename='train.log')", "channel"),
    ("text = (Path(args.checkpoint_dir) / 'rank-0-epoch-1.pt').read_bytes()", "channel"),
    # processes and threads
    ("import subprocess", "process"),
    ("import threading", "process"),
    ("from concurrent.futures import ThreadPoolExecutor", "process"),
    ("pid = os.fork()", "process"),
    ("os.system('true')", "process"),
    ("from multigpu.running import launch", "process"),
    # dynamic access
    ("d = vars(torch)", "dynamic"),
    ("d = vars(model)", "dynamic"),
    ("d = torch.__dict__['distributed']", "dynamic"),
    ("g = globals()['hvd']", "dynamic"),
    ("name = 'all' + 'reduce'\nf = getattr(hvd, name)", "dynamic"),
    ("setattr(optimizer, name, None)", "dynamic"),
    ("import sys\nd = sys.modules['torch.distributed']", "dynamic"),
    ("import importlib\nm = importlib.import_module('torch.distributed')", "dynamic"),
    ("exec('x = 1')", "dynamic"),
    ("f = eval('print')", "dynamic"),
    ("c = compile('x', 'f', 'exec')", "dynamic"),
    ("import inspect\ng = inspect.currentframe().f_back.f_globals", "dynamic"),
    ("h = hvd\nh.broadcast_parameters(model.state_dict(), root_rank=0)", "dynamic"),
    ("hvd.allreduce = print", "dynamic"),
    ("from horovod.torch import *", "dynamic"),
    ("s = model.__class__.__subclasses__()", "dynamic"),
    # native code, signals, the environment
    ("import ctypes", "native"),
    ("import signal", "signal"),
    ("os.kill(1, 9)", "signal"),
    ("os.environ['HOROVOD_FUSION_THRESHOLD'] = '0'", "environment"),
    ("os.environ.update(HOROVOD_CYCLE_TIME='1')", "environment"),
    ("os.chdir('/tmp')", "environment"),
    # code loaded from files
    ("raw = torch.load(os.environ['OTHER_RESULTS'])", "load"),
    ("import pickle", "load"),
    ("import sys\nsys.path.insert(0, '/tmp')", "load"),
    ("import helper_beside_me", "import"),
    ("from . import helper", "import"),
    ("import requests", "import"),
    ("from multigpu.grading import rules", "import"),
    # Horovod outside its training API, collectives out of place
    ("hvd.start_timeline('/tmp/t.json')", "horovod"),
    ("from horovod.torch.mpi_ops import allreduce_async", "horovod"),
    ("import horovod.torch.elastic", "horovod"),
    ("grads = hvd.grouped_allreduce([p.grad for p in model.parameters()])", "collective"),
    ("for p in model.parameters():\n    hvd.allreduce_(p.data, name='x')", "collective"),
    ("for s in SHAPES:\n    hvd.allreduce(torch.zeros(s).shape, name='y')", "collective"),
    ("for x in batches:\n    hvd.broadcast_parameters(model.state_dict(), root_rank=0)", "collective"),
    ("for x in batches:\n    model.load_state_dict(hvd.broadcast_object(model.state_dict(), root_rank=0))", "collective"),
    ("def sync(m):\n    hvd.broadcast_parameters(m.state_dict(), root_rank=0)\nfor x in xs:\n    sync(model)",
     "collective"),
    ("later = lambda: hvd.broadcast_parameters(model.state_dict(), root_rank=0)", "collective"),
    ("hooks = {'a': hvd.broadcast_parameters}", "collective"),
    # gradients changed after the all-reduce, or cut off before it
    ("optimizer.synchronize()", "gradients"),
    ("with optimizer.skip_synchronize():\n    optimizer.step()", "gradients"),
    ("for p in model.parameters():\n    p.grad = torch.zeros_like(p)", "gradients"),
    ("grads = [p.grad for p in model.parameters()]\nfor g in grads:\n    g.mul_(0)", "gradients"),
    ("setattr(p, 'grad', None)", "gradients"),
    ("p.register_hook(lambda g: g * 0)", "gradients"),
    ("loss = loss_fn(out[:16], y[:16]) + loss_fn(out[16:], y[16:]).detach()\nloss.backward()", "gradients"),
    ("with torch.no_grad():\n    rest = loss_fn(model(x2), y2)\n(loss_fn(model(x1), y1) + rest).backward()", "gradients"),
    # steps outside the DistributedOptimizer's
    ("own = torch.optim.SGD(model.parameters(), lr=0.1)\nown.step()", "steps"),
    ("for x in xs:\n    with torch.no_grad():\n        for p in model.parameters():\n            p -= 0.1 * p.grad", "steps"),
    ("for x in xs:\n    for p in model.parameters():\n        p.data.add_(p.grad, alpha=-0.1)", "steps"),
    ("for x in xs:\n    model.load_state_dict(best)", "steps"),
    ("for x in xs:\n    model.apply(init)\ndef init(m):\n    m.weight.data.fill_(0)", "steps"),
    # the timeline, the held-out set
    ("os.environ['HOROVOD_TIMELINE'] = 'x'", "timeline"),
    ("where = os.environ.get('HOROVOD_TIME' + 'LINE')", "timeline"),
    ("from multigpu.core import data\nh = data.ensure_dataset('/tmp/h', val_per_class=100, seed=7919)", "holdout"),
])
def test_each_kind_of_flag(line, kind):
    found = review.flags(HEADER + line + "\n")
    assert kind in {f.kind for f in found}, (line, [f.to_dict() for f in found])
    assert all(f.line > 4 for f in found if f.kind == kind)  # on the snippet's line, not the imports'


#: Issue 49's honest code that the familiarity review held: the reference's step in a small
#: dataclass with logging instead of print; manual sharding as Horovod's docs show it.
STEP_IN_A_DATACLASS = """
import logging
from dataclasses import dataclass
log = logging.getLogger(__name__)

@dataclass
class Step:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: torch.nn.Module

    def __call__(self, images, labels) -> float:
        self.optimizer.zero_grad()
        loss = self.loss_fn(self.model(images), labels)
        loss.backward()
        self.optimizer.step()
        return loss.item()

optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
step = Step(model, optimizer, torch.nn.CrossEntropyLoss())
for images, labels in loader:
    log.info("loss %.3f", step(images, labels))
"""
MANUAL_SHARDS = """
import time, sys
from torch.utils.data import Subset
g = torch.Generator()
g.manual_seed(epoch)
order = torch.randperm(len(train_set), generator=g).tolist()
shard = Subset(train_set, order[hvd.rank()::hvd.size()])
started = time.perf_counter()
with open(os.path.join(args.checkpoint_dir, "log.txt"), "a") as f:
    print("took", time.perf_counter() - started, file=f)
print("done", file=sys.stderr)
"""


@pytest.mark.parametrize("line", [
    "counts = hvd.allreduce(torch.tensor([correct, total]), op=hvd.Sum, name='val_counts')",
    "root = os.environ.get('MULTIGPU_ASSESSMENT_DATA')",
    "Path(args.checkpoint_dir).mkdir(parents=True, exist_ok=True)",
    "model.eval()\nwith torch.no_grad():\n    out = model(images.to(device))",
    "hvd.broadcast_parameters(model.state_dict(), root_rank=0)\nfor x in xs:\n    optimizer.step()",
    "optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), op=hvd.Average)",
    "first = hvd.broadcast_object(1, root_rank=0, name='first_epoch')",
    "for e in epochs:\n    stop = hvd.broadcast_object(acc > 0.9, root_rank=0, name='stop')",
    "scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda i: rate(i))",
    "if torch.cuda.is_available():\n    torch.cuda.set_device(hvd.local_rank())",
    "torch.cuda.synchronize()",
    "raise ValueError('no data')",
    "print(f'{len(xs)} of {max(xs)}: ' + 'done')",
    "name = 'distri' + 'buted'",
    "cfg = Config(**vars(parser.parse_args(argv)))",
    "args = argparse.Namespace(**hvd.broadcast_object(vars(parse_args(argv)), root_rank=0))",
    "lr = getattr(args, 'lr', 0.01)",
    "import math, itertools, functools, collections, typing, json, random, statistics, argparse, warnings, contextlib",
    "for x in xs:\n    loss = loss_fn(model(x), y)\n    (loss / 2).backward()\n    running += loss.item()",
    "for g in optimizer.param_groups:\n    g['lr'] = 0.1",
    "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
    "from torch.utils.data import DataLoader, Subset, SubsetRandomSampler\nfrom torch.utils.data.distributed import DistributedSampler",
    "from tqdm import tqdm\nfor x in tqdm(loader, disable=hvd.rank() != 0):\n    pass",
    "def init(m):\n    if isinstance(m, torch.nn.Conv2d):\n        torch.nn.init.kaiming_normal_(m.weight)\nmodel.apply(init)",
    "for p in model.features.parameters():\n    p.requires_grad_(False)",
    "torch.backends.cudnn.benchmark = True",
    STEP_IN_A_DATACLASS,
    MANUAL_SHARDS,
])
def test_what_honest_conversions_do_is_not_flagged(line):
    assert review.flags(HEADER + line + "\n") == [], [f.to_dict() for f in review.flags(HEADER + line + "\n")]


def test_each_capability_is_named_and_the_pure_standard_library_is_none():
    for q in ("socket.socket", "torch.distributed.all_reduce", "subprocess.run", "ctypes.CDLL", "signal.signal",
              "pickle.load", "torch.load", "importlib.import_module", "os.fork", "os.putenv", "sys.modules"):
        assert capabilities.capability(q) in capabilities.WHY, q
    for q in ("logging.getLogger", "dataclasses.dataclass", "math.sqrt", "time.perf_counter", "itertools.count",
              "functools.partial", "collections.deque", "json.dumps", "random.Random", "statistics.mean",
              "argparse.ArgumentParser", "torch.optim.SGD", "torch.randperm", "torch.utils.data.Subset", "os.path.join",
              "os.environ.get", "sys.exit", "os.sched_getaffinity"):
        assert capabilities.capability(q) == "", q
    assert set(review.KINDS) >= set(capabilities.WHY)


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
