from __future__ import annotations

import subprocess

import pytest

from conftest import VENV_BIN
from multigpu import cli


def test_help_lists_the_commands(capsys):
    import pytest

    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for command in ("info", "data", "clean-notebooks", "release", "bench", "grade", "calibrate"):
        assert command in out


@pytest.mark.slow
def test_info_reports_mode_and_horovod():
    out = subprocess.run([str(VENV_BIN / "multigpu"), "info"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "mode" in out.stdout and "Horovod 0.28.1" in out.stdout and "gloo" in out.stdout


def test_release_and_bench_are_verbs_of_the_one_command(capsys):
    """The Makefile calls `multigpu release ...` and `multigpu bench ...`: the module's own options pass through."""
    assert cli.main(["release", "--assignments"]) == 0
    assert capsys.readouterr().out.split() == ["notebooks", "assessments"]
    import pytest

    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    assert "--only" in capsys.readouterr().out
