"""multigpu.core.layout: one answer to "where is the course", from the package, the environment or the cwd."""

from __future__ import annotations

import pytest

from conftest import REPO
from multigpu.core import layout


def test_the_checkout_is_the_course_root(monkeypatch):
    monkeypatch.delenv("MULTIGPU_COURSE_ROOT", raising=False)
    assert layout.course_root() == REPO
    assert layout.reference_solution() == REPO / "solutions" / "assessments" / "train.py"
    assert (layout.IMPORT_ROOT / "multigpu" / "__init__.py").is_file()


def test_the_environment_names_another_course(monkeypatch, tmp_path):
    (tmp_path / "solutions").mkdir()
    (tmp_path / "nbgrader_config.py").write_text("")
    monkeypatch.setenv("MULTIGPU_COURSE_ROOT", str(tmp_path))
    assert layout.course_root() == tmp_path.resolve()
    assert layout.reference_solution() == tmp_path.resolve() / "solutions" / "assessments" / "train.py"


def test_a_folder_that_is_not_a_course_is_refused_with_what_to_do(monkeypatch, tmp_path):
    (tmp_path / "solutions").mkdir()  # no nbgrader_config.py
    assert not layout.is_course(tmp_path)
    monkeypatch.setenv("MULTIGPU_COURSE_ROOT", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="not a course root"):
        layout.course_root()
