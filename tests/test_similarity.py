"""Similarity across a cohort (grading/similarity.py): a disguised copy is listed, an independent
conversion of the same starter is not, and the starter's own lines never count."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from multigpu.grading import grader, similarity


def _disguised(source: str) -> str:
    """A copy with its comments dropped and its names changed."""
    source = re.sub(r"#.*", "", source)
    for old, new in (("trained_on", "seen"), ("optimizer", "opt"), ("sampler", "smp"), ("learning_rate", "rate_at")):
        source = source.replace(old, new)
    return source


def _independent(starter: str) -> str:
    """A short conversion of the starter written another way than the reference."""
    edits = {
        "import torch\n": "import horovod.torch as hvd\nimport torch\n",
        "    device = devices.worker_device(0)\n    torch.set_num_threads(args.threads or devices.threads_per_worker(1))\n":
            "    hvd.init()\n    device = devices.worker_device(hvd.local_rank())\n    torch.set_num_threads(1)\n",
        "    train_loader = data.make_loader(train_set, args.batch_size, shuffle=True)\n":
            "    from torch.utils.data.distributed import DistributedSampler\n"
            "    shard = DistributedSampler(train_set, hvd.size(), hvd.rank())\n"
            "    train_loader = data.make_loader(train_set, args.batch_size, sampler=shard)\n",
        "    loss_fn = torch.nn.CrossEntropyLoss()\n":
            "    optimizer = hvd.DistributedOptimizer(optimizer, model.named_parameters())\n"
            "    hvd.broadcast_parameters(model.state_dict(), 0)\n    loss_fn = torch.nn.CrossEntropyLoss()\n",
        "save_checkpoint(args.checkpoint_dir, model, epoch, 0, trained_on)":
            "save_checkpoint(args.checkpoint_dir, model, epoch, hvd.rank(), trained_on)",
        "        for images, labels, index in train_loader:\n":
            "        shard.set_epoch(epoch)\n        for images, labels, index in train_loader:\n",
    }
    for old, new in edits.items():
        assert starter.count(old) == 1, old
        starter = starter.replace(old, new)
    return starter


def test_a_disguised_copy_is_listed_and_an_independent_conversion_is_not():
    starter = grader.STARTER.read_text()
    reference = grader.REFERENCE.read_text()
    sources = {"alice": reference, "bob": _disguised(reference), "carol": _independent(starter), "dave": starter}
    everything = {(p.a, p.b): p for p in similarity.pairs(sources, starter, threshold=0.0)}
    copy = everything[("alice", "bob")]
    assert copy.similarity_a > 0.95 and copy.similarity_b > 0.95, copy
    assert everything[("alice", "carol")].similarity < 0.4, everything[("alice", "carol")]  # measured: 0.28
    assert not [k for k in everything if "dave" in k]  # the unmodified starter shares nothing beyond the starter
    listed = similarity.pairs(sources, starter)
    assert [(p.a, p.b) for p in listed] == [("alice", "bob")]


@pytest.mark.slow
def test_the_instructor_gets_the_pairs_of_the_collected_cohort(tmp_path):
    grading = tmp_path / "grading"
    reference = grader.REFERENCE.read_text()
    for student, text in (("alice", reference), ("bob", _disguised(reference)),
                          ("carol", _independent(grader.STARTER.read_text()))):
        (grading / "submitted" / student / "assessments").mkdir(parents=True)
        (grading / "submitted" / student / "assessments" / "train.py").write_text(text)
    out = subprocess.run([sys.executable, "-m", "multigpu.cli", "similarity", "--grading", str(grading)],
                         capture_output=True, text=True, check=False, timeout=300)
    assert out.returncode == 0 and "alice" in out.stdout and "1 pair(s)" in out.stdout, out
    saved = json.loads((grading / "results" / "similarity.json").read_text())
    assert [(p["a"], p["b"]) for p in saved["pairs"]] == [("alice", "bob")]
    assert saved["threshold"] == similarity.THRESHOLD
