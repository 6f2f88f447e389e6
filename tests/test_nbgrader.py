"""The nbgrader round trip in a scratch course with a fresh gradebook.

generate_assignment -> a student who submits the solutions gets full marks; a student who
submits the blank learner copies gets zero on every exercise, and grading them does not crash.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

SOLUTION, BLANK = "solution-student", "blank-student"


def nbgrader(course, *args, timeout=3600):
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run([os.path.join(bindir, "nbgrader"), *args], cwd=course, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def graded_course(tmp_path_factory):
    from multigpu.release import install_starter, present_assignments

    course = tmp_path_factory.mktemp("course")
    shutil.copytree(REPO / "solutions", course / "solutions",
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    shutil.copy(REPO / "nbgrader_config.py", course / "nbgrader_config.py")
    (course / "grading").mkdir()
    assignments = present_assignments(REPO)
    logs = {}
    for assignment in assignments:
        nbgrader(course, "generate_assignment", assignment, "--force")
        if assignment == "assessments":
            install_starter(course / assignment)  # what make release gives learners
        shutil.copytree(course / "solutions" / assignment, course / "grading/submitted" / SOLUTION / assignment)
        shutil.copytree(course / assignment, course / "grading/submitted" / BLANK / assignment)
        logs[assignment] = nbgrader(course, "autograde", assignment)
    return course, assignments, logs


def scores(course, assignment, student):
    from nbgrader.api import Gradebook

    from multigpu.release import REPO as _  # noqa: F401 - imports the package the same way graders do

    url = "sqlite:///" + str(course / "grading" / "gradebook.db")
    with Gradebook(url, "multigpu") as gb:
        sub = gb.find_submission(assignment, student)
        return {nb.name: (nb.score, nb.max_score) for nb in sub.notebooks}


@pytest.mark.slow
def test_the_solution_gets_full_marks(graded_course):
    course, assignments, logs = graded_course
    for assignment in assignments:
        got = scores(course, assignment, SOLUTION)
        assert got, f"no notebooks graded in {assignment}"
        short = {name: s for name, s in got.items() if s[0] != s[1]}
        assert not short, f"{assignment}: the solution lost points {short}\n{logs[assignment][-4000:]}"
        assert all(mx > 0 for _, mx in got.values()), f"{assignment}: a notebook has no graded cells: {got}"


@pytest.mark.slow
def test_the_blank_learner_copy_scores_zero(graded_course):
    course, assignments, _ = graded_course
    for assignment in assignments:
        got = scores(course, assignment, BLANK)
        earned = {name: s for name, s in got.items() if s[0] != 0}
        assert not earned, f"{assignment}: blank copies earned points {earned}"


@pytest.mark.slow
def test_autograde_keeps_the_learners_training_script(graded_course):
    course, assignments, _ = graded_course
    if "assessments" not in assignments or not (course / "solutions/assessments/train.py").exists():
        pytest.skip("the assessment has no training script yet")
    submitted = course / "grading/submitted" / BLANK / "assessments" / "train.py"
    autograded = course / "grading/autograded" / BLANK / "assessments" / "train.py"
    assert autograded.read_bytes() == submitted.read_bytes()
