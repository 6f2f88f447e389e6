"""What the grader reads from a submission's text before and beside running it: whether it
compiles (:func:`check_source`, else nothing runs), whether it imports Horovod
(:func:`uses_horovod`, for the workers message) and what it suggests about its learning rate
(:func:`learning_rate_hints`, for the accuracy message). A reading of the source is a hint or a
precondition, never a verdict on the run."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path


def check_source(path: str | os.PathLike) -> str | None:
    """None when ``path`` exists and compiles; otherwise what is wrong (nothing is run)."""
    path = Path(path)
    if not path.is_file():
        return f"no submission: {path} does not exist (save your converted script as train.py next to the notebook)"
    try:
        compile(path.read_bytes(), str(path), "exec")
    except SyntaxError as e:
        return f"{path.name} does not compile: {e.msg} at line {e.lineno}: {(e.text or '').strip()}"
    except ValueError as e:  # e.g. NUL bytes
        return f"{path.name} does not compile: {e}"
    return None


def uses_horovod(source: str) -> bool:
    """The script imports Horovod (a line ``import horovod...`` or ``from horovod... import``)."""
    return re.search(r"^\s*(import|from)\s+horovod\b", source, re.MULTILINE) is not None


def learning_rate_hints(source: str) -> list[str]:
    """What the script's text suggests about its learning rate, for the accuracy message only
    (a reading of the source is a hint, never a verdict): no multiplication by ``hvd.size()`` (or
    a name bound to it), no warm-up anywhere in the text. Empty when nothing can be told."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []

    def is_size(node: ast.AST) -> bool:  # hvd.size(), size(), dist.get_world_size(), int(os.environ["HOROVOD_SIZE"])
        for x in ast.walk(node):
            if isinstance(x, ast.Call) and not x.args and (
                    (isinstance(x.func, ast.Attribute) and x.func.attr in ("size", "get_world_size"))
                    or (isinstance(x.func, ast.Name) and x.func.id in ("size", "get_world_size"))):
                return True
            if isinstance(x, ast.Constant) and x.value in ("HOROVOD_SIZE", "WORLD_SIZE"):
                return True
        return False

    sizes: set[str] = set()  # names bound to the number of workers: workers = hvd.size()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            pairs = [(node.targets[0], node.value)]
            if isinstance(node.targets[0], ast.Tuple) and isinstance(node.value, ast.Tuple):
                pairs = list(zip(node.targets[0].elts, node.value.elts))
            sizes |= {t.id for t, v in pairs if isinstance(t, ast.Name) and is_size(v)}
    scaled = any(isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)
                 and any(is_size(x) or (isinstance(x, ast.Name) and x.id in sizes) for x in (node.left, node.right))
                 for node in ast.walk(tree))
    hints: list[str] = []
    if not re.search(r"\bhvd\.|\bhorovod\.torch|\btorch\.distributed", source):  # unconverted: other messages first
        return hints
    if not scaled:
        hints.append("your script does not seem to multiply the learning rate by hvd.size(): hvd.size() workers "
                     "make the global batch hvd.size() times larger, so scale the rate with them")
    if not re.search(r"warm[\s_-]?up", source, re.IGNORECASE):
        hints.append("no warm-up found: ramp the rate from lr to lr x hvd.size() over the first epoch, since a "
                     "large rate from the first step can throw the model off (Goyal et al. 2017, Lab 1)")
    return hints
