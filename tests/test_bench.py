"""multigpu.course.bench (`make bench`): figures with spreads, interleaving, tables with targets, the run."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from multigpu.core import data, devices
from multigpu.course import bench


def test_spread_is_median_and_range():
    s = bench.spread([5.0, 1.0, 3.0])
    assert (s.median, s.low, s.high, s.n) == (3.0, 1.0, 5.0, 3)
    assert bench.spread([1.0, 2.0, 10.0, 4.0]).median == 3.0  # even count: mean of the middle two
    with pytest.raises(ValueError):
        bench.spread([])


def test_interleave_alternates_variants_within_each_repeat():
    order = bench.interleave(["A", "B"], 3)
    assert order == [(0, "A"), (0, "B"), (1, "A"), (1, "B"), (2, "A"), (2, "B")]
    variants = [v for _, v in order]
    assert all(a != b for a, b in zip(variants, variants[1:])), "the same variant twice in a row is not interleaved"
    assert bench.interleave(["only"], 2) == [(0, "only"), (1, "only")]


def test_targets_are_compared_with_the_median():
    assert bench.Target("<", 900).met(899.9) and not bench.Target("<", 900).met(900)
    assert bench.Target(">=", 0.9).met(0.9) and not bench.Target(">=", 0.9).met(0.89)
    with pytest.raises(ValueError):
        bench.Target("==", 1.0)
    # median 0.95 meets >= 0.9 although one sample does not
    assert bench.Figure("ratio", "ratio", [0.5, 0.95, 0.97], bench.Target(">=", 0.9)).met is True
    assert bench.Figure("no target", "images/s", [1.0]).met is None
    assert bench.Figure("failed", "s", target=bench.Target("<", 1), error="boom").met is None


def test_table_rows_show_median_spread_target_and_verdict():
    met = bench.Figure("pipeline / bound", "ratio", [0.91, 0.95, 0.99], bench.Target(">=", 0.9))
    missed = bench.Figure("whole course end to end", "s", [1200.0], bench.Target("<", 900), note="quick parameters")
    plain = bench.Figure("Horovod, 2 worker(s)", "images/s", [1000.0, 1234.4, 1100.0])
    failed = bench.Figure("03-horovod.ipynb", "s", target=bench.Target("<", 360), error="CellExecutionError: x")
    assert bench.figure_row(met) == "| pipeline / bound | 0.95 | 0.91\u20130.99 | 3 | >= 0.90 | met |"
    assert bench.figure_row(missed) == (
        "| whole course end to end (quick parameters) | 20.0 min | 20.0\u201320.0 min | 1 | < 15.0 min | NOT met |")
    assert bench.figure_row(plain) == "| Horovod, 2 worker(s) | 1,100 images/s | 1,000\u20131,234 images/s | 3 |  |  |"
    assert "error: CellExecutionError: x" in bench.figure_row(failed) and "| < 6.0 min |" in bench.figure_row(failed)

    section = bench.Section("scaling", "Scaling", [met, plain], notes=["synthetic data"])
    text = bench.section_markdown(section)
    lines = text.splitlines()
    assert lines[0] == "### Scaling" and "- synthetic data" in lines
    header = next(i for i, line in enumerate(lines) if line.startswith("| figure"))
    assert lines[header + 1].startswith("|---") and lines[header + 2] == bench.figure_row(met)


def test_values_are_formatted_in_their_unit():
    assert bench.fmt(59.94, "s") == "59.9 s"
    assert bench.fmt(360, "s") == "6.0 min"
    assert bench.fmt(12.345, "ms") == "12.3 ms"
    assert bench.fmt(0.876, "ratio") == "0.88"


@pytest.mark.slow
def test_decode_bound_decodes_every_file_in_one_or_several_processes(tmp_path):
    root = data.ensure_dataset(tmp_path / "shapes", progress=False, classes=2, train_per_class=6,
                               val_per_class=1, image_size=64)
    paths = [p for p, _ in data.JPEGFolder(root, split="train").samples]
    assert bench.decode_files(paths) == len(paths) == 12
    for processes in (0, 2):
        with bench.DecodeBound(paths, processes) as bound:
            assert (bound.pool is None) == (processes == 0)
            rate = bound.images_per_s()
        assert math.isfinite(rate) and rate > 0


@pytest.mark.slow
def test_machine_header_names_mode_cores_and_versions():
    m = bench.machine()
    info = devices.detect()
    build = devices.horovod_build()
    assert (m["mode"], m["cores"], m["gpus"], m["torch"]) == (info.mode, info.cores, info.gpus, info.torch_version)
    assert m["horovod"] == (build["version"] if build["installed"] else "not installed")
    text = bench.machine_markdown(m)
    assert f"{info.mode.upper()} mode, {info.cores} CPU cores" in text
    assert f"torch {info.torch_version}" in text and f"Horovod {m['horovod']}" in text
    assert devices.describe(info=info) in text
    json.dumps(m, allow_nan=False)  # the header goes into results.json as it is


def test_course_lists_every_solution_notebook_labs_first(repo):
    names = [str(p.relative_to(repo / "solutions")) for p in bench.solution_notebooks(repo)]
    labs = sorted(f"notebooks/{p.name}" for p in (repo / "solutions" / "notebooks").glob("*.ipynb"))
    assessments = sorted(f"assessments/{p.name}" for p in (repo / "solutions" / "assessments").glob("*.ipynb"))
    assert names[0] == "notebooks/00-welcome.ipynb"
    assert names == labs + assessments, "every lab in order, then the assessment notebook(s)"


def _fake_sections(monkeypatch, crash: bool):
    def missed(plan, deadline):
        return bench.Section("pipeline", "Pipeline", [bench.Figure("pipeline / bound", "ratio", [0.5, 0.6],
                                                                   bench.Target(">=", 0.9))])

    def crashed(plan, deadline):
        raise RuntimeError("worker died")

    monkeypatch.setitem(bench.SECTIONS, "pipeline", missed)
    monkeypatch.setitem(bench.SECTIONS, "scaling", crashed if crash else missed)


@pytest.mark.slow
def test_a_missed_target_is_not_a_failure(monkeypatch, tmp_path):
    _fake_sections(monkeypatch, crash=False)
    assert bench.main(["--quick", "--only", "pipeline", "scaling", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "results.md").read_text()
    assert "NOT met" in md and "quick parameters (--quick)" in md


@pytest.mark.slow
def test_a_crashed_section_fails_the_run_but_keeps_the_other_figures(monkeypatch, tmp_path):
    _fake_sections(monkeypatch, crash=True)
    assert bench.main(["--only", "scaling", "pipeline", "--out", str(tmp_path)]) == 1
    results = json.loads((tmp_path / "results.json").read_text())
    sections = {s["name"]: s for s in results["sections"]}
    assert list(sections) == ["pipeline", "scaling"], "sections run in their fixed order"
    assert sections["scaling"]["status"] == "error" and "worker died" in sections["scaling"]["error"]
    assert sections["pipeline"]["figures"][0]["median"] == pytest.approx(0.55)
    assert "**error**: RuntimeError: worker died" in (tmp_path / "results.md").read_text()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_bench_measures_pipeline_and_scaling(repo, tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "multigpu"), "bench", "--quick", "--only", "pipeline", "scaling", "--out", str(out)],
        cwd=repo, capture_output=True, text=True, timeout=580,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "results.md").read_text().startswith("# Benchmark results")
    results = json.loads((out / "results.json").read_text())
    assert results["quick"] is True and results["machine"]["cores"] == devices.detect().cores
    sections = {s["name"]: s for s in results["sections"]}
    assert list(sections) == ["pipeline", "scaling"] and all(s["status"] == "ok" for s in sections.values())
    figures = {f["name"]: f for s in sections.values() for f in s["figures"]}
    for f in figures.values():
        assert f["n"] == len(f["samples"]) >= 1, f
        assert f["min"] <= f["median"] <= f["max"], f
    ratios = [f for f in figures.values() if f["unit"] == "ratio"]
    assert {"pipeline / bound", "Horovod efficiency, 2 workers", "Horovod / DDP images/s, 4 workers",
            "Horovod / raw MPI all-reduce time, 2 workers"} <= {f["name"] for f in ratios}
    for f in ratios:
        assert all(math.isfinite(x) and x > 0 for x in f["samples"]), f
    assert figures["pipeline / bound"]["target"] == {"op": ">=", "value": 0.9}
    assert figures["pipeline / bound"]["met"] == (figures["pipeline / bound"]["median"] >= 0.9)
    for n in (1, 2, 4):
        assert figures[f"Horovod, {n} worker(s)"]["median"] > 0 and figures[f"DDP, {n} worker(s)"]["median"] > 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_sharding_section_measures_zero_against_data_parallelism_side_by_side(sharding_runs):
    """Lab 5's section on 4 real Horovod workers (quick plan: one round; the session's sharding
    runs): the memory, bytes and time ratios, paired step by step; the memory and bytes targets met
    (counts, not timings)."""
    from multigpu.course.bench import sharding

    assert bench.SECTIONS["sharding"] is sharding.bench_sharding and bench.QUICK.scaling_repeats == 1
    section = sharding.bench_sharding(bench.QUICK, float("inf"), measured=sharding_runs)
    assert section.status == "ok" and "sharding" in bench.SECTION_NAMES
    figures = {f.name: f for f in section.figures}
    assert figures["optimizer state per rank, stage 2 / data parallel"].met is True
    assert figures["gradient held per rank at its peak, stage 2 / data parallel"].met is True
    assert figures["gradient held per rank at its peak, stage 1 (all-reduce) / data parallel"].samples == [1.0]
    assert figures["gradient held per rank at its peak, stage 1 (reduce-scatter) / data parallel"].samples == [1.25]
    assert figures["bytes per step, stage 2 / data parallel"].met is True
    assert figures["bytes per step, stage 3 / data parallel"].met is True
    assert figures["bytes per step, stage 1 (all-reduce + all-gather) / data parallel"].spread.median == pytest.approx(1.5, abs=0.05)
    steps = figures["step time, stage 2 / data parallel"]
    assert steps.target == bench.Target("<=", 1.3) and len(steps.samples) == 3  # 1 round of 3 steps, paired
    share = figures["forward and backward / the whole step, data parallel"].samples
    assert len(share) == 3 and all(0 < x < 1 for x in share)
    assert all(math.isfinite(x) and x > 0 for f in section.figures for x in f.samples)


@pytest.mark.slow
def test_the_warm_section_times_fresh_and_warm_jobs_side_by_side():
    """Each launcher's trivial job with fresh interpreters and with warm workers, interleaved, and
    their paired ratio against its target (a goal, not a test: this only checks it is measured)."""
    section = bench.SECTIONS["warm"](bench.QUICK, float("inf"))
    assert section.status == "ok" and "warm" in bench.SECTION_NAMES
    figures = {f.name: f for f in section.figures}
    for name, _, _ in bench.warmstart.JOBS:
        fresh, warm, ratio = (figures[f"{name}: {k}"] for k in ("fresh", "warm", "warm / fresh"))
        assert len(fresh.samples) == len(warm.samples) == len(ratio.samples) == 3
        assert all(x > 0 for x in fresh.samples + warm.samples)
        assert ratio.target == bench.Target("<=", 0.5) and ratio.met is not None
