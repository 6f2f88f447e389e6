"""Shared test setup: GPU tests skip without CUDA; everything runs in quick mode; only tests
marked ``slow`` may start a process (``make test-fast`` runs the others, in this one process)."""

from __future__ import annotations

import _posixsubprocess
import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent

# The notebooks, the grader and the workers all read this; `make test` sets it too.
os.environ.setdefault("MULTIGPU_QUICK", "1")
# One grading of the same bytes per session (multigpu.grading.reuse): the reference is graded once,
# by the nbgrader round trip's official grading, and the assessment notebook's check reads it.
os.environ.setdefault("MULTIGPU_GRADING_REUSE", tempfile.mkdtemp(prefix="multigpu-test-gradings-"))
atexit.register(shutil.rmtree, os.environ["MULTIGPU_GRADING_REUSE"], True)
os.environ["PATH"] = f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"

MARK_IT = "mark this test @pytest.mark.slow: it starts a process"

#: Every way Python starts a child: subprocess (fork_exec or posix_spawn), multiprocessing's
#: fork (os.fork) and its spawn and forkserver (_posixsubprocess.fork_exec), os.system and pty.
PROCESS_STARTERS: list[tuple[Any, str]] = [
    (subprocess, "_fork_exec"), (_posixsubprocess, "fork_exec"),
    (os, "fork"), (os, "forkpty"), (os, "posix_spawn"), (os, "posix_spawnp"), (os, "system"),
]
FAILURES = pytest.StashKey[list[str]]()
SLOW_RAN = pytest.StashKey[bool]()


class ProcessStart(RuntimeError):
    """A test not marked slow tried to start a process."""


@contextmanager
def no_process_starts(item: pytest.Item) -> Iterator[None]:
    """Make every process start fail with MARK_IT while the block runs, and remember each try on
    the item, so the test fails even where the code under test catches the exception."""
    tries = item.stash.setdefault(FAILURES, [])
    originals = [(owner, name, getattr(owner, name)) for owner, name in PROCESS_STARTERS if hasattr(owner, name)]

    def refuse(name: str) -> Callable[..., Any]:
        def refused(*args: Any, **kwargs: Any) -> Any:
            tries.append(f"{name}{args[:1] if name == 'system' else ''}")
            raise ProcessStart(f"{MARK_IT} ({name})")
        return refused

    for owner, name, _ in originals:
        setattr(owner, name, refuse(name))
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker("slow"):
        item.session.stash[SLOW_RAN] = True
        return (yield)
    with no_process_starts(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker("slow"):
        return (yield)
    with no_process_starts(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    # After a slow test has run, a teardown may close what that test's module or session
    # fixtures started (their finalizers run in whichever test comes last), so it is not guarded.
    if item.get_closest_marker("slow") or item.session.stash.get(SLOW_RAN, False):
        return (yield)
    with no_process_starts(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    report: pytest.TestReport = yield
    tries = item.stash.get(FAILURES, [])
    if tries and report.passed:  # the code under test caught the ProcessStart: fail it anyway
        report.outcome = "failed"
        report.longrepr = f"{MARK_IT}: it tried {', '.join(tries)} ({call.when})"
    item.stash[FAILURES] = []
    return report


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def sharding_runs():
    """Lab 5's comparisons on 4 Horovod workers, run once per session (``make bench``'s sharding
    section at the quick plan: one round): ``(zero.compare's ways, fully_sharded.compare's ways)``.
    test_zero, test_fully_sharded and test_bench assert on the same runs."""
    from multigpu.course.bench import sharding

    return sharding.measure_sharding(rounds=1)
