"""The reference run's figures: every shipped file loads, and a figure is printed beside the learner's."""

import json

import pytest

from multigpu.figures import reference


def test_every_shipped_reference_file_names_its_machine_date_and_figures():
    folder = reference._path("x").parent
    files = sorted(folder.glob("*.json"))
    for path in files:
        figures = reference.load(path.stem)
        assert figures, f"{path.name} holds no figure"
        for key, fig in figures.items():
            assert fig.machine and fig.date and fig.what, f"{path.name}:{key} lacks its machine, date or meaning"


def test_beside_states_both_figures_and_their_ratio(tmp_path, monkeypatch):
    monkeypatch.setattr(reference, "_path", lambda notebook: tmp_path / f"{notebook}.json")
    reference.record("nb", "eff", 0.89, unit="x ideal", what="2 workers against the ideal",
                     machine="2-core CPU", date="2026-11-25", command="make course", folder=tmp_path)
    text = reference.beside("nb", "eff", 0.84)
    assert "your run 0.84 x ideal" in text
    assert "the reference run (2-core CPU, 2026-11-25) 0.89 x ideal" in text
    assert "yours is 0.94 x the reference" in text
    assert json.loads((tmp_path / "nb.json").read_text())["figures"]["eff"]["value"] == 0.89


def test_a_missing_figure_names_the_ones_that_exist(tmp_path, monkeypatch):
    monkeypatch.setattr(reference, "_path", lambda notebook: tmp_path / f"{notebook}.json")
    reference.record("nb", "a", 1.0, unit="", what="a", machine="m", date="d", command="c", folder=tmp_path)
    with pytest.raises(KeyError, match=r"has \['a'\]"):
        reference.figure("nb", "b")
    with pytest.raises(FileNotFoundError, match="no reference run"):
        reference.load("other")
