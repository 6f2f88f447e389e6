"""Learner copies are generated from solutions/, committed, and committed clean."""

from __future__ import annotations

import json

import pytest

from conftest import REPO
from multigpu.course import hygiene, release


@pytest.mark.slow
def test_learner_copies_match_a_fresh_release():
    problems = release.differences(REPO)
    assert not problems, "learner copies drifted (run 'make release' and commit):\n" + "\n".join(problems)


def test_every_course_notebook_is_committed_clean():
    dirty = [str(p.relative_to(REPO)) for p in hygiene.course_notebooks(REPO)
             if hygiene.clean(p, check=True)]
    assert not dirty, f"run 'make clean-notebooks': {dirty}"


def test_learner_copies_hold_no_solutions_or_hidden_tests():
    for nb_path in hygiene.course_notebooks(REPO):
        if nb_path.parts[len(REPO.parts)] == "solutions":
            continue
        text = nb_path.read_text()
        for marker in ("BEGIN SOLUTION", "BEGIN HIDDEN TESTS"):
            assert marker not in text, f"{nb_path} contains '{marker}'"


def test_every_exercise_has_a_test_and_points(repo=REPO):
    for nb_path in (REPO / "solutions").rglob("*.ipynb"):
        cells = json.loads(nb_path.read_text())["cells"]
        meta = [c["metadata"].get("nbgrader", {}) for c in cells]
        tests = [m for m in meta if m.get("grade") and not m.get("solution")]
        solutions = [m for m in meta if m.get("solution")]
        if not solutions:
            continue
        assert tests, f"{nb_path.name}: exercises without graded test cells"
        assert all(m.get("points", 0) > 0 for m in tests), f"{nb_path.name}: a test cell without points"
        ids = [m["grade_id"] for m in meta if "grade_id" in m]
        assert len(ids) == len(set(ids)), f"{nb_path.name}: duplicate grade_ids"


def test_clean_strips_outputs_and_volatile_metadata(tmp_path):
    nb = {
        "cells": [{"cell_type": "code", "source": "1", "execution_count": 3, "id": "x",
                   "outputs": [{"output_type": "stream", "name": "stdout", "text": "1"}],
                   "metadata": {"nbgrader": {"grade": False}, "tags": ["parameters"], "execution": {"t": 1}}}],
        "metadata": {"kernelspec": {"name": "python3"}, "papermill": {"duration": 1}},
        "nbformat": 4, "nbformat_minor": 5,
    }
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(nb))
    assert hygiene.clean(path, check=True) is True
    assert json.loads(path.read_text()) == nb, "check mode must not change the file"
    assert hygiene.clean(path) is True
    cell = json.loads(path.read_text())["cells"][0]
    assert cell["outputs"] == [] and cell["execution_count"] is None
    assert cell["metadata"] == {"nbgrader": {"grade": False}, "tags": ["parameters"]}
    assert "papermill" not in json.loads(path.read_text())["metadata"]
    assert hygiene.clean(path, check=True) is False
