"""The nbgrader round trip in a scratch course with a fresh gradebook.

generate_assignment -> a student who submits the solutions gets full marks; a student who
submits the blank learner copies of Lab 0 and of the assessment gets zero, and grading them does
not crash. (Every exercise's blank stub scores zero against its own test cell, hidden tests
included, in tests/test_exercise_tests.py; the blank copies of Labs 1-5 graded end to end are
``make test-matrix``'s, below.) The assessment is graded as ``make autograde`` does it: nbgrader
with the official-grading flag, then the sandboxed official grading of each train.py, whose result
replaces the notebook's points. The blank student's notebook carries an added cell that fakes the
grader in its kernel. The reference's official grading is then regraded from the copy it kept
(``multigpu regrade``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import REPO

SOLUTION, BLANK = "solution-student", "blank-student"

# the module's fixture autogrades every lab notebook for two students and runs two official
# gradings (about 11 minutes on the quiet 2-core machine, docs/performance.md): on a busy machine,
# more than the suite's default per-test timeout
pytestmark = pytest.mark.timeout(3600)

#: What a learner could add to the assessment notebook: a cell that fakes a passing grader in
#: the kernel and writes a forged result file next to the notebook.
FAKE_GRADER_CELL = """\
from multigpu.grading import grader, official
official.official_run = lambda: False
def _fake(*args, **kwargs):
    result = grader.deferred(SETTINGS, "faked")
    for criterion in result.criteria.values():
        criterion.passed, criterion.message = True, "faked by the learner"
    return result
grader.grade = _fake
open("grading-result.json", "w").write('{"passed": true, "sandboxed": true, "score": 10, "max_score": 10}')
"""


def add_fake_grader_cell(notebook):
    nb = json.loads(notebook.read_text())
    at = next(i for i, c in enumerate(nb["cells"]) if c["metadata"].get("nbgrader", {}).get("grade_id") == "pass_rule")
    nb["cells"].insert(at + 1, {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                                "source": FAKE_GRADER_CELL})
    notebook.write_text(json.dumps(nb))


def nbgrader(course, *args, timeout=3600):
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}", MULTIGPU_OFFICIAL_GRADING="1")
    proc = subprocess.run([os.path.join(bindir, "nbgrader"), *args], cwd=course, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout + proc.stderr


#: The blank student's labs in make test: Lab 0 end to end (the others' blank stubs are graded one
#: by one in tests/test_exercise_tests.py, and end to end by make test-matrix)
BLANK_LABS = ("00-welcome.ipynb",)


def round_trip(course, assignments, blank_labs, *, solution: bool = True, official_grading: bool = True) -> dict:
    """Release, submit and autograde ``assignments`` in ``course``: the solutions (with ``solution``),
    the blank copies of the labs ``blank_labs`` and of the assessment; with ``official_grading``,
    then grade each train.py officially."""
    from multigpu.course.release import install_starter

    shutil.copytree(REPO / "solutions", course / "solutions",
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    shutil.copy(REPO / "nbgrader_config.py", course / "nbgrader_config.py")
    (course / "grading").mkdir()
    logs = {}
    clock = time.monotonic()

    def step(what: str) -> None:  # where the round trip's minutes go (`pytest -s` shows it)
        nonlocal clock
        print(f"[nbgrader round trip] {what}: {time.monotonic() - clock:.0f} s", file=sys.stderr, flush=True)
        clock = time.monotonic()

    for assignment in assignments:
        nbgrader(course, "generate_assignment", assignment, "--force")
        if assignment == "assessments":
            install_starter(course / assignment)  # what make release gives learners
        if solution:
            shutil.copytree(course / "solutions" / assignment, course / "grading/submitted" / SOLUTION / assignment)
        blank = course / "grading/submitted" / BLANK / assignment
        shutil.copytree(course / assignment, blank)
        if assignment == "assessments":
            add_fake_grader_cell(blank / "assessment.ipynb")
        else:
            for notebook in blank.glob("*.ipynb"):
                if notebook.name not in blank_labs:
                    notebook.unlink()  # not submitted: nbgrader grades what is there
        step(f"generate_assignment {assignment}")
        logs[assignment] = nbgrader(course, "autograde", assignment)
        step(f"autograde {assignment}")
    if official_grading and "assessments" in assignments:  # what make autograde runs next
        from multigpu.grading import official, rules

        graded = official.grade_submissions(course / "grading", rules.QUICK)
        step("official grading of both train.py")
        logs["assessments"] += "\n".join(g.result.report() for g in graded)
        logs["official"] = {g.student: g.result for g in graded}
        logs["official_results"] = {g.student: g.path for g in graded}
    return logs


@pytest.fixture(scope="module")
def graded_course(tmp_path_factory):
    from multigpu.course.release import present_assignments

    course = tmp_path_factory.mktemp("course")
    assignments = present_assignments(REPO)
    return course, assignments, round_trip(course, assignments, BLANK_LABS)


def auto_scores(course, assignment, student):
    """The points the notebook's own cells earned in the learner's kernel (before the official grading)."""
    from nbgrader.api import Gradebook

    with Gradebook("sqlite:///" + str(course / "grading" / "gradebook.db"), "multigpu") as gb:
        nb = gb.find_submission_notebook("assessment", assignment, student)
        return sum(g.auto_score or 0 for g in nb.grades)


def scores(course, assignment, student):
    from nbgrader.api import Gradebook

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
def test_every_solution_notebook_ran_every_cell_without_an_error(graded_course):
    """The one execution of each lab notebook in `make test`: autograde ran every code cell of the
    solutions and none raised. (The assessment notebook leaves its verdict to the official grading
    under autograde, so its test cells fail there by design; tests/test_notebooks.py runs it.)"""
    course, assignments, _ = graded_course
    labs = sorted((course / "grading/autograded" / SOLUTION / "notebooks").glob("*.ipynb"))
    assert len(labs) == len(list((REPO / "solutions/notebooks").glob("*.ipynb"))), "a lab was not autograded"
    for path in labs:
        nb = json.loads(path.read_text())
        code = [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
        unrun = [i for i, c in enumerate(code) if c.get("execution_count") is None]
        assert not unrun, f"{path.name}: code cells {unrun} never ran"
        errors = [(o.get("ename"), o.get("evalue", "")[:300]) for c in code for o in c.get("outputs", [])
                  if o.get("output_type") == "error"]
        assert not errors, f"{path.name} raised: {errors}"


@pytest.mark.slow
def test_the_blank_learner_copy_scores_zero(graded_course):
    course, assignments, _ = graded_course
    for assignment in assignments:
        got = scores(course, assignment, BLANK)
        earned = {name: s for name, s in got.items() if s[0] != 0}
        assert not earned, f"{assignment}: blank copies earned points {earned}"
    graded = course / "grading/autograded" / BLANK
    assert {p.name for p in (graded / "notebooks").glob("*.ipynb")} == set(BLANK_LABS)
    assert (graded / "assessments" / "assessment.ipynb").exists()


@pytest.mark.slow
@pytest.mark.matrix
def test_the_blank_copies_of_labs_1_to_5_score_zero_end_to_end(tmp_path):
    """The blank copy of every lab but Lab 0, autograded as a learner would submit it: nothing
    crashes or hangs, and it scores zero (make test grades each blank stub against its test cell)."""
    labs = tuple(sorted(p.name for p in (REPO / "solutions/notebooks").glob("*.ipynb") if p.name not in BLANK_LABS))
    logs = round_trip(tmp_path, ["notebooks"], labs, solution=False, official_grading=False)
    got = scores(tmp_path, "notebooks", BLANK)
    assert {f"{name.removesuffix('.ipynb')}" for name in labs} <= set(got), got
    earned = {name: s for name, s in got.items() if s[0] != 0}
    assert not earned, f"blank copies earned points {earned}\n{logs['notebooks'][-3000:]}"
    graded = {p.name for p in (tmp_path / "grading/autograded" / BLANK / "notebooks").glob("*.ipynb")}
    assert graded == set(labs), f"not autograded: {set(labs) - graded}"


@pytest.mark.slow
def test_autograde_keeps_the_learners_training_script(graded_course):
    course, assignments, _ = graded_course
    assert "assessments" in assignments and (course / "solutions/assessments/train.py").exists()
    submitted = course / "grading/submitted" / BLANK / "assessments" / "train.py"
    autograded = course / "grading/autograded" / BLANK / "assessments" / "train.py"
    assert autograded.read_bytes() == submitted.read_bytes()


@pytest.mark.slow
def test_a_cell_that_fakes_the_grader_earns_nothing_and_no_certificate(graded_course, tmp_path):
    from multigpu.credential import certificates
    from multigpu.grading import rules, variants

    course, assignments, logs = graded_course
    assert "assessments" in assignments, "the course has no assessment notebook"
    # the fake worked in the learner's kernel (its cells passed there) ...
    assert auto_scores(course, "assessments", BLANK) == 10, "the fake grader cell did not run: the test proves nothing"
    # ... and the official grading of the unconverted train.py replaced those points
    assert scores(course, "assessments", BLANK)["assessment"][0] == 0, logs["assessments"][-3000:]
    # the unconverted starter (4 copies that all save as rank 0) was stopped early by the grader's
    # rule (rank 0's first checkpoint a grace period old and no other rank's beside it) or crashed on
    # their shared file names, not run for most of the time budget (about 260 s of 300 without the
    # rule). The rule's clock is that first checkpoint's own time, so this holds on a busy machine.
    blank = logs["official"][BLANK]
    assert (course / "grading/submitted" / BLANK / "assessments" / "train.py").read_text() == \
        variants.SOURCES["unconverted"].read_text(), "the blank student no longer submits the unconverted starter"
    workers = blank.criteria["workers"]
    assert variants.MUST_FAIL["unconverted"] == "workers" and not workers.passed
    # never imported Horovod: told to call hvd.init(), not that it has Lab 3's rank-0-only habit
    assert "no checkpoint from rank" in workers.message and "hvd.init()" in workers.message, workers.message
    assert "Lab 3" not in workers.message, workers.message
    assert "stopped early" in workers.message or "exit code" in workers.message, workers.message
    assert "time budget" not in workers.message, workers.message
    assert blank.measurements["run_s"] < rules.QUICK.time_budget_s, workers.message
    # and no baseline was measured after it: a run stopped early has no throughput to compare
    assert len(blank.measurements["baselines"]) == (rules.QUICK.baseline_repeats + 1) // 2, blank.measurements
    assert (course / "grading/autograded" / BLANK / "assessments" / "grading-result.json").exists()
    key = certificates.load_private_key(certificates.keygen(tmp_path / "key")[0])
    decisions = {d.student: d for d in certificates.certify(
        "sqlite:///" + str(course / "grading" / "gradebook.db"), course / "grading", tmp_path / "certs", key=key)}
    assert not decisions[BLANK].certified and "not passed" in decisions[BLANK].reason, decisions[BLANK].reason
    # the solution passed the official grading, on the quick profile, which never certifies
    assert not decisions[SOLUTION].certified and "quick" in decisions[SOLUTION].reason, decisions[SOLUTION].reason


@pytest.mark.slow
def test_the_reference_passes_the_official_grading_and_its_result_certifies(graded_course, tmp_path):
    """The reference conversion, graded for real: 4 workers, its defaults, the baselines, sandboxed."""
    from multigpu.credential import certificates
    from multigpu.grading import sandbox

    course, assignments, logs = graded_course
    assert "assessments" in assignments, "the course has no assessment notebook"
    result = logs["official"][SOLUTION]
    assert result.passed, "the reference solution must pass the quick profile:\n" + result.report()
    assert result.sandboxed or sandbox.unavailable(), "the grader did not use the sandbox where it starts"
    m = result.measurements
    assert m["baselines"] and m["efficiency"] > 0 and len(m["accuracy_per_epoch"]) == m["epochs"] >= 2
    # what the grader saw from outside the run: every claimed sample read in its epoch, no connection
    # between ranks that Horovod did not open, so no review flag of the run either
    assert result.review["flags"] == [] and not result.held, result.review
    assert all(r["confirmed"] == r["claimed"] and not r["never"] for r in m["reads_per_epoch"]), m["reads_per_epoch"]
    assert m["foreign_connections"] == [] and m["time_to_accuracy_s"] > 0
    private, public = certificates.keygen(tmp_path / "key")
    record = certificates.make_record("Ada Lovelace", "ada", result.to_dict())
    _, cert = certificates.issue(record, certificates.load_private_key(private), tmp_path / "certs")
    verified = certificates.verify(cert, public)
    assert verified.record["assessment"]["score"] == result.score == 10
    assert verified.record["assessment"]["efficiency"] == m["efficiency"]
    assert verified.record["assessment"]["time_to_accuracy_s"] == m["time_to_accuracy_s"]
    assert "time to accuracy" in verified.summary()


@pytest.mark.slow
def test_regrade_reproduces_the_verdict_of_the_references_stored_result(graded_course, tmp_path):
    """The audit trail, for real: the official grading of the reference above keeps its source, hash,
    grader version, profile and measurements, and ``multigpu regrade`` reproduces its verdict."""
    from multigpu.grading import audit, grader, official, regrade, rules

    course, assignments, logs = graded_course
    assert "assessments" in assignments, "the course has no assessment notebook"
    grading = tmp_path / "grading"  # a copy: the other tests read the course as it was graded
    shutil.copytree(course / "grading", grading)
    path = grading / logs["official_results"][SOLUTION].relative_to(course / "grading")
    stored = json.loads(path.read_text())
    assert stored["passed"] and not stored["review"]["held"] and stored["review"]["flags"] == [], stored
    assert stored["source_sha256"] == audit.sha256(grader.REFERENCE.read_bytes())
    assert (path.parent / stored["source_file"]).read_bytes() == grader.REFERENCE.read_bytes()
    assert stored["grader_version"] == audit.grader_version() and stored["settings"] == rules.QUICK.to_dict()
    assert {"accuracy_held", "efficiency", "baselines", "run_s", "horovod_gradient_rounds_per_epoch"} \
        <= set(stored["measurements"])
    submitted = grading / "submitted" / SOLUTION / official.ASSIGNMENT / "train.py"
    submitted.write_text("print('the submission changed after grading')\n")  # the kept copy is what counts
    again = regrade.regrade(path, log=print)
    print(again.report())
    assert again.result.source_sha256 == stored["source_sha256"]
    if again.noisy:  # seen beside other test suites: baselines 65.7, 43.7, 116.5 images/s, none within 25%
        assert "NOT REPRODUCED" in again.report() and not again.result.ok("throughput"), again.report()
        assert all(again.result.ok(c) for c in again.result.criteria if c != "throughput"), again.report()
    else:
        assert again.holds and "the verdict HOLDS" in again.report() and again.result.passed, again.report()
