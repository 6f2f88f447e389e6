"""The reference run's figures: every shipped file loads, and a figure is printed beside the learner's."""

import json
import re

import pytest

from conftest import REPO
from multigpu.figures import reference


def test_every_shipped_reference_file_names_its_machine_date_and_figures():
    folder = reference._path("x").parent
    files = sorted(folder.glob("*.json"))
    assert files, f"no reference run is shipped in {folder}"
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


def shown_figures() -> list[tuple[str, str, bool]]:
    """Every ``reference.show("<notebook>", <key>, ...)`` (or ``beside``) of the solution notebooks:
    (notebook, key, whether the key is an f-string whose ``{...}`` parts are filled in at run time)."""
    shown = []
    for nb in sorted((REPO / "solutions").glob("*/*.ipynb")):
        source = "".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"])
        shown += [(notebook, key, bool(f)) for notebook, f, key in
                  re.findall(r'reference\.(?:show|beside)\(\s*"([^"]+)",\s*(f?)"([^"]+)"', source)]
    return shown


def test_every_figure_a_notebook_shows_has_a_reference():
    """Each figure a solution notebook prints beside the reference run's names a shipped figure: a literal
    key exactly, an f-string key (``f"horovod_efficiency_{n}"``) at least one key its pattern matches."""
    shown = shown_figures()
    assert len(shown) >= 10, f"the notebooks show only {len(shown)} reference figures: is the pattern stale?"
    missing = []
    for nb, key, templated in shown:
        keys = reference.load(nb)
        if templated:
            pattern = re.compile("".join(".+" if part.startswith("{") else re.escape(part)
                                         for part in re.split(r"(\{[^}]*\})", key) if part))
            found = any(pattern.fullmatch(k) for k in keys)
        else:
            found = key in keys
        if not found:
            missing.append(f"{nb}:{key}")
    assert not missing, f"figures the notebooks print with no reference value: {missing}"


def test_a_reference_run_records_what_it_shows(tmp_path, monkeypatch):
    monkeypatch.setattr(reference, "_path", lambda notebook: tmp_path / f"{notebook}.json")
    reference.record("nb", "eff", 0.89, unit="x ideal", what="2 workers against the ideal",
                     machine="old box", date="2026-01-01", command="c", folder=tmp_path)
    monkeypatch.setenv(reference.RECORD_ENV, "multigpu bench --only course --record-reference")
    reference.show("nb", "eff", 0.5)
    raw = json.loads((tmp_path / "nb.json").read_text())
    assert raw["figures"]["eff"] == {"value": 0.5, "unit": "x ideal", "what": "2 workers against the ideal"}
    assert raw["command"].startswith("multigpu bench") and raw["machine"] == reference.this_machine()
    monkeypatch.delenv(reference.RECORD_ENV)
    reference.show("nb", "eff", 0.7)  # an ordinary run compares and changes nothing
    assert json.loads((tmp_path / "nb.json").read_text())["figures"]["eff"]["value"] == 0.5
