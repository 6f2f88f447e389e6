"""The grading's first stage (grading/preparation.py): the held-out set's secret seed, drawn for
each grading, kept out of the result and out of the sandbox, and used again by a regrade
(issue 48, item 3: the fixed public seed let anyone rebuild the held-out set byte for byte)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from multigpu.core import data
from multigpu.grading import audit, grader, preparation, regrade, review, rules

#: The seed the grader used before issue 48: public, in the source a learner reads.
PUBLIC_SEED = 7919
#: A small held-out set (a few images per class): what holds for it holds for the profiles' sizes.
SMALL = rules.QUICK.replace(holdout_per_class=4)


def _digests(root: Path) -> set[str]:
    return {hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((root / "val").rglob("*.jpg"))}


def test_each_grading_draws_its_own_secret_seed():
    seeds = {preparation.holdout_seed() for _ in range(20)}
    assert len(seeds) == 20 and all(0 <= s < 2 ** rules.HOLDOUT_SEED_BITS for s in seeds)
    assert max(seeds).bit_length() > 64  # far beyond guessing
    assert not hasattr(rules, "HOLDOUT_SEED")  # no seed in the readable source


def test_the_held_out_set_rebuilt_with_the_public_seed_shares_no_image_with_a_gradings(tmp_path):
    """What the learner of issue 48 did, inside the sandbox or out: the course's own generator with
    the seed the source used to name. A grading's held-out set has none of those images, and two
    gradings share none either; the same seed (a regrade's) gives the same set byte for byte."""
    rebuilt = data.ensure_dataset(tmp_path / "rebuilt", train_per_class=0, val_per_class=SMALL.holdout_per_class,
                                  seed=PUBLIC_SEED, progress=False)
    seed = preparation.holdout_seed()
    first = preparation.make_holdout(tmp_path / "a", SMALL, seed)
    second = preparation.make_holdout(tmp_path / "b", SMALL, preparation.holdout_seed())
    again = preparation.make_holdout(tmp_path / "c", SMALL, seed)
    assert len(_digests(first)) == 4 * len(data.find_classes(first / "val")[0])
    assert not _digests(rebuilt) & _digests(first) and not _digests(first) & _digests(second)
    assert _digests(again) == _digests(first)


def test_the_result_commits_to_the_seed_without_telling_it_and_the_official_copy_keeps_it_private(tmp_path):
    seed = preparation.holdout_seed()
    result = grader.GradeResult("train.py", rules.QUICK, {}, holdout_seed=seed,
                                holdout_seed_sha256=audit.seed_digest(seed))
    saved = json.dumps(result.to_dict())
    assert str(seed) not in saved and "holdout_seed\"" not in saved
    assert result.to_dict()["holdout_seed_sha256"] == audit.seed_digest(seed) != audit.seed_digest(seed + 1)
    result_file = tmp_path / "alice.json"
    name = audit.keep_holdout_seed(result_file, seed)
    assert (tmp_path / name).stat().st_mode & 0o777 == 0o600
    assert audit.stored_holdout_seed(result_file, result.to_dict()) == seed
    assert audit.stored_holdout_seed(result_file, {"holdout_seed_sha256": ""}) is None  # an older result
    with pytest.raises(ValueError, match="not the graded held-out seed"):
        audit.stored_holdout_seed(result_file, {"holdout_seed_sha256": audit.seed_digest(seed + 1)})


def test_a_regrade_judges_on_the_recorded_seed(tmp_path, monkeypatch):
    seed = preparation.holdout_seed()
    source = tmp_path / "alice.train.py"
    source.write_bytes(grader.REFERENCE.read_bytes())
    stored = {"script": "alice/assessments/train.py", "passed": True, "sandboxed": False,
              "settings": rules.QUICK.to_dict(), "criteria": {}, "measurements": {},
              "source_sha256": audit.sha256(source.read_bytes()), "source_file": source.name,
              "holdout_seed_sha256": audit.seed_digest(seed)}
    result_file = tmp_path / "alice.json"
    result_file.write_text(json.dumps(stored))
    audit.keep_holdout_seed(result_file, seed)
    asked = []

    def graded(script, settings, **kwargs):
        asked.append(kwargs["holdout_seed"])
        return grader.GradeResult(str(script), settings, {})

    monkeypatch.setattr(grader, "grade", graded)
    regrade.regrade(result_file)
    assert asked == [seed]
def test_the_review_flags_a_call_of_the_data_generator_with_a_seed():
    source = ("from multigpu.core import data\n"
              f"held_out = data.ensure_dataset('/tmp/h', train_per_class=0, val_per_class=100, seed={PUBLIC_SEED})\n")
    found = [f for f in review.flags(source) if f.kind == "holdout"]
    assert found and found[0].line == 2, [f.to_dict() for f in review.flags(source)]
    assert not [f for f in review.flags("from multigpu.core import data\nroot = data.ensure_dataset(progress=True)\n")
                if f.kind == "holdout"]


