"""The audit trail of a grading: what was graded, by which grader, and whether the verdict holds.

An official result (:mod:`multigpu.grading.official`) keeps the exact bytes it graded (a copy
next to the result, named by ``source_file``), their SHA-256 (``source_sha256``), the grader's
version (``grader_version``: the package's version and the course's git commit when it is a
checkout), the profile's settings and every measurement. :func:`regrade` grades the kept copy
again under the same settings and says whether the verdict holds (:mod:`multigpu.grading.regrade`).
The held-out set's secret seed is no part of the result (its SHA-256 is: ``holdout_seed_sha256``);
an official grading keeps it beside the result, readable by the grader's account only
(``<result stem>.holdout-seed``, :func:`keep_holdout_seed`), so that a regrade judges on the same
images (:func:`stored_holdout_seed`).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def sha256(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def git_commit(root: Path) -> str | None:
    """The commit checked out in ``root`` (read from ``.git`` without running git), None when
    ``root`` is no git checkout or the commit cannot be told."""
    git = root / ".git"
    try:
        if git.is_file():  # a worktree or submodule: "gitdir: <path>"
            text = git.read_text().strip()
            git = (root / text.partition("gitdir:")[2].strip()).resolve()
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head if _COMMIT.match(head) else None
        ref = head[5:].strip()
        common = git / "commondir"
        bases = [git] + ([(git / common.read_text().strip()).resolve()] if common.is_file() else [])
        for base in bases:
            if (base / ref).is_file():
                commit = (base / ref).read_text().strip()
                return commit if _COMMIT.match(commit) else None
            packed = base / "packed-refs"
            if packed.is_file():
                for line in packed.read_text().splitlines():
                    commit, _, name = line.partition(" ")
                    if name == ref and _COMMIT.match(commit):
                        return commit
    except OSError:
        return None
    return None


def grader_version() -> str:
    """``<package version>`` and, where the course is a git checkout, ``+g<commit>`` (12 digits)."""
    import multigpu
    from multigpu.core import layout

    commit = git_commit(layout.IMPORT_ROOT.parent)
    return multigpu.__version__ + (f"+g{commit[:12]}" if commit else "")


def identity(raw: bytes) -> dict[str, Any]:
    """What a result records about what graded what: ``source_sha256`` and ``grader_version``."""
    return {"source_sha256": sha256(raw), "grader_version": grader_version()}


def keep_source(script: Path, result_file: Path, expected_sha256: str) -> str:
    """Copy the graded ``script`` next to ``result_file`` (``<result stem>.train.py``) and return
    the copy's name; ValueError when its bytes are not the ones graded (``expected_sha256``)."""
    raw = Path(script).read_bytes()
    if sha256(raw) != expected_sha256:
        raise ValueError(f"{script} changed after it was graded (its SHA-256 is not the graded one)")
    copy = result_file.with_name(f"{result_file.stem}.train.py")
    copy.write_bytes(raw)
    return copy.name


def stored_source(result_file: Path, stored: dict[str, Any]) -> Path:
    """The kept copy of the graded source of the result in ``result_file``, checked against its hash."""
    name = stored.get("source_file")
    if not name or Path(name).name != name:
        raise ValueError(f"{result_file} keeps no copy of the graded source (no source_file): it cannot be regraded")
    copy = result_file.parent / name
    if not copy.is_file():
        raise ValueError(f"the graded source {copy} is missing")
    if sha256(copy.read_bytes()) != stored.get("source_sha256"):
        raise ValueError(f"{copy} is not the graded source: its SHA-256 differs from the result's source_sha256")
    return copy


def seed_digest(seed: int) -> str:
    """What a result records of its held-out seed: a SHA-256 that commits to it without telling it."""
    return sha256(f"multigpu-holdout-seed:{int(seed)}".encode())


def keep_holdout_seed(result_file: Path, seed: int) -> str:
    """Keep ``seed`` beside ``result_file`` (``<result stem>.holdout-seed``, mode 600: the grader's
    account only) and return the file's name."""
    path = result_file.with_name(f"{result_file.stem}.holdout-seed")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{int(seed)}\n")
    os.chmod(path, 0o600)
    return path.name


def stored_holdout_seed(result_file: Path, stored: dict[str, Any]) -> int | None:
    """The held-out seed kept beside the result in ``result_file``, checked against the result's
    ``holdout_seed_sha256``; None where none was kept (a regrade then draws a fresh one)."""
    path = result_file.with_name(f"{result_file.stem}.holdout-seed")
    if not stored.get("holdout_seed_sha256") or not path.is_file():
        return None
    try:
        seed = int(path.read_text().strip())
    except ValueError:
        raise ValueError(f"{path} holds no seed") from None
    if seed_digest(seed) != stored["holdout_seed_sha256"]:
        raise ValueError(f"{path} is not the graded held-out seed: its SHA-256 differs from the result's")
    return seed
