"""The suite's guard: a test not marked slow that starts a process fails, and says how to fix it."""

from __future__ import annotations

import pytest

from conftest import MARK_IT, REPO

pytest_plugins = ["pytester"]

STARTERS = '''
import multiprocessing
import os
import subprocess

import pytest


def test_subprocess():
    subprocess.run(["true"])


def test_a_caught_start_still_fails():
    try:
        subprocess.run(["true"])
    except Exception:
        pass


def test_multiprocessing_fork():
    multiprocessing.get_context("fork").Process(target=print).start()


def test_multiprocessing_spawn():
    multiprocessing.get_context("spawn").Process(target=print).start()


def test_os_system():
    os.system("true")


@pytest.fixture(scope="module")
def server():
    return subprocess.Popen(["sleep", "1"])


def test_a_module_fixture_that_starts_a_process(server):
    pass


def test_no_process():
    assert sum(range(4)) == 6
'''


def test_a_test_not_marked_slow_cannot_start_a_process(pytester):
    pytester.makeconftest((REPO / "tests" / "conftest.py").read_text())
    pytester.makepyfile(test_starters=STARTERS)
    run = pytester.inline_run("-p", "no:cacheprovider")
    run.assertoutcome(passed=1, failed=6)  # the module fixture's error counts as its test's failure
    reports = [r for r in run.getreports("pytest_runtest_logreport") if r.failed]
    assert {r.nodeid.split("::")[1] for r in reports} == {
        "test_subprocess", "test_a_caught_start_still_fails", "test_multiprocessing_fork",
        "test_multiprocessing_spawn", "test_os_system", "test_a_module_fixture_that_starts_a_process"}
    for report in reports:
        assert MARK_IT in str(report.longrepr), report.longrepr


@pytest.mark.slow
def test_a_slow_test_may_start_a_process(pytester):
    pytester.makeconftest((REPO / "tests" / "conftest.py").read_text())
    pytester.makepyfile(test_slow='''
import multiprocessing
import subprocess

import pytest


@pytest.mark.slow
def test_subprocess():
    assert subprocess.run(["true"]).returncode == 0


@pytest.mark.slow
def test_multiprocessing_fork():
    child = multiprocessing.get_context("fork").Process(target=print)
    child.start()
    child.join()
    assert child.exitcode == 0
''')
    pytester.inline_run("-p", "no:cacheprovider").assertoutcome(passed=2)
