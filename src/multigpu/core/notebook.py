"""Small helpers for notebook cells: run size, progress bars."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from tqdm import tqdm

T = TypeVar("T")


def quick() -> bool:
    """True when the notebooks should take their small, fast settings (``MULTIGPU_QUICK=1``).

    ``make test`` and the grader's smoke runs set it; a learner normally does not.
    """
    return os.environ.get("MULTIGPU_QUICK", "") not in ("", "0", "false", "False")


def in_jupyter() -> bool:
    """True inside a Jupyter kernel that can render widgets (not papermill/nbconvert logs)."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return False
    shell = get_ipython()
    if shell is None or type(shell).__name__ != "ZMQInteractiveShell":
        return False
    # papermill, nbclient and nbgrader execute headless: nobody sees a widget, so use text.
    if any(os.environ.get(flag) for flag in ("PAPERMILL_EXECUTION", "NBGRADER_EXECUTION", "MULTIGPU_PLAIN_PROGRESS")):
        return False
    # A kernel that a Jupyter server started for an open notebook (JupyterLab) has JPY_SESSION_NAME;
    # kernels started by papermill or nbclient do not, and their output ends up in logs.
    return bool(os.environ.get("JPY_SESSION_NAME"))


def progress(iterable: Iterable[T] | None = None, **kwargs) -> tqdm[T]:
    """A tqdm progress bar: a widget in JupyterLab, plain text (updated rarely) in logs.

    In logs the bar writes at most every ``mininterval`` seconds (default 10) so CI output and
    papermill notebooks do not fill with thousands of carriage returns.
    """
    if in_jupyter():
        from tqdm.auto import tqdm

        return tqdm(iterable, **kwargs)
    from tqdm import tqdm

    kwargs.setdefault("mininterval", 10.0)
    kwargs.setdefault("file", sys.stderr)
    kwargs.setdefault("ascii", True)
    return tqdm(iterable, **kwargs)
