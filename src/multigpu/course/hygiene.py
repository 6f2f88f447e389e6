"""Notebook hygiene: committed notebooks carry no outputs and no volatile metadata.

Kept per cell: ``nbgrader`` (grading metadata), ``tags`` (papermill's ``parameters``),
``editable``/``deletable``. Kept per notebook: the kernel spec and the language name.
"""

from __future__ import annotations

import json
from pathlib import Path

from multigpu.core import layout

KEEP_CELL_METADATA = ("nbgrader", "tags", "editable", "deletable")
COURSE_FOLDERS = (layout.SOLUTIONS, *layout.ASSIGNMENTS)


def course_notebooks(root: Path) -> list[Path]:
    """Every notebook of the course under ``root`` (sources and learner copies)."""
    found: list[Path] = []
    for folder in COURSE_FOLDERS:
        found += sorted(p for p in (root / folder).rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    return found


def cleaned(nb: dict) -> dict:
    """A copy of notebook JSON without outputs, execution counts or volatile metadata."""
    nb = json.loads(json.dumps(nb))
    for cell in nb.get("cells", []):
        cell["metadata"] = {k: v for k, v in cell.get("metadata", {}).items() if k in KEEP_CELL_METADATA}
        cell.pop("id", None)
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    meta = nb.get("metadata", {})
    kept = {}
    if "kernelspec" in meta:
        kept["kernelspec"] = meta["kernelspec"]
    kept["language_info"] = {"name": meta.get("language_info", {}).get("name", "python")}
    nb["metadata"] = kept
    nb["nbformat"], nb["nbformat_minor"] = 4, 4  # minor 4: cells without ids, stable diffs
    return nb


def clean(path: Path, check: bool = False) -> bool:
    """Clean ``path`` in place (or only compare, with ``check``). True when it was not clean."""
    text = Path(path).read_text()
    new = json.dumps(cleaned(json.loads(text)), indent=1, ensure_ascii=False) + "\n"
    if new == text:
        return False
    if not check:
        Path(path).write_text(new)
    return True
