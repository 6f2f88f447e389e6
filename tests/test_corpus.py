"""A sample of the honest corpus graded for real (tests/fixtures/corpus: conversions written from
the starter alone by two writers; tests/test_review.py reviews all of them in `make test-fast`).

Each is graded as a submission is, on the quick profile, sandboxed where the sandbox starts: what
the grader sees of an honest run (reads, connections, the batches that reached a backward pass)
and the review of its source must hold none of them, and the checks of the conversion itself
(workers, identical weights, sharded data) must pass. Accuracy and throughput depend on the
hyperparameters each writer chose for the cpu profile: reported, asserted only for what a
conversion cannot choose. `make test-matrix` runs them (about 4-8 minutes each on 2 cores);
docs/calibration.md has their measured verdicts.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from multigpu.grading import grader, rules

CORPUS = Path(__file__).parent / "fixtures" / "corpus"
#: Eight of the forty, one of each way of writing the conversion the issue names: a trainer class
#: and OneCycleLR; accumulation with manual sharding; an early exit with a dataclass; fp16
#: compression with accumulation; randperm shards and Nesterov (held before the capability review);
#: an early exit decided by rank 0 and broadcast; a callable runner with a SubsetRandomSampler; a
#: sampler class of the writer's own at a batch of 48.
SAMPLE = ("A/03-trainer-class-onecycle", "A/07-accumulate-adamw-onecycle-manual-shard", "A/10-early-stopper-adam-german",
          "A/16-accumulate-fp16-slicing-french", "B/01-randperm-nesterov-warmup", "B/05-early-exit-broadcast-object",
          "B/12-callable-runner-subsetrandomsampler-json", "B/18-own-shard-sampler-class")


@pytest.mark.slow
@pytest.mark.matrix
@pytest.mark.parametrize("name", SAMPLE)
def test_an_honest_conversion_is_graded_without_a_hold(name, tmp_path):
    script = tmp_path / "train.py"
    script.write_bytes((CORPUS / name / "train.py").read_bytes())
    t = time.monotonic()
    result = grader.grade(script, rules.QUICK)
    print(f"{name}: {time.monotonic() - t:.0f} s\n{result.report()}\nwork {result.measurements.get('work')}")
    for criterion in ("workers", "identical", "sharded"):
        assert result.ok(criterion), result.message(criterion)
    assert result.review["flags"] == [], result.review
    assert not result.held
    work = result.measurements["work"]
    assert work["trained"] >= work["claimed"], work
