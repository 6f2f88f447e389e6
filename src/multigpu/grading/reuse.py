"""One grading of the same bytes, reused within a session that asks for it.

Where ``MULTIGPU_GRADING_REUSE`` names a folder, every grading is kept there, and a grading that
may reuse one (``sandbox`` "auto" or "off": a learner's own check, never an official grading or a
regrade, which run ``sandbox="required"``) takes an earlier result of the same source bytes, the
same settings, arguments and grader version, sandboxed as it would be, instead of running again.
The test suite sets it: it grades the reference solution once (the official grading of the nbgrader
round trip), and the assessment notebook's check reads that verdict. Learners never set it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from multigpu.grading import audit
from multigpu.grading.result import GradeResult, result_from_dict
from multigpu.grading.rules import Settings

ENV = "MULTIGPU_GRADING_REUSE"


def _path(raw: bytes, settings: Settings, args: Sequence[str], sandboxed: bool) -> Path | None:
    folder = os.environ.get(ENV)
    if not folder:
        return None
    key = json.dumps([audit.sha256(raw), settings.to_dict(), list(map(str, args)), audit.grader_version(), sandboxed],
                     sort_keys=True)
    return Path(folder) / f"grading-{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def earlier(raw: bytes, settings: Settings, args: Sequence[str], sandboxed: bool) -> GradeResult | None:
    """An earlier grading of these bytes like this one, where the session keeps them; else None."""
    path = _path(raw, settings, args, sandboxed)
    if path is None or not path.is_file():
        return None
    return result_from_dict(json.loads(path.read_text()))


def keep(result: GradeResult, raw: bytes, settings: Settings, args: Sequence[str]) -> None:
    """Keep ``result`` for the rest of the session (nothing where the session keeps none)."""
    path = _path(raw, settings, args, result.sandboxed)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result.to_dict()))
        os.replace(tmp, path)
