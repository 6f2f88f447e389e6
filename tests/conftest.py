"""Shared test setup: GPU tests skip without CUDA; everything runs in quick mode."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent

# The notebooks, the grader and the workers all read this; `make test` sets it too.
os.environ.setdefault("MULTIGPU_QUICK", "1")
os.environ["PATH"] = f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"


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
