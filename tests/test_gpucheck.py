"""``make gpu-check``: the report, the GPU reference runs' selection by mode, and a rehearsal of
the checks on the CPU (the same code paths, CPU tensors, quick parameters)."""

from __future__ import annotations

import json

import pytest

from multigpu.core import devices
from multigpu.course import gpucheck
from multigpu.figures import reference


def test_without_a_gpu_it_says_so_and_checks_nothing(monkeypatch, capsys):
    monkeypatch.setenv(devices.FORCE_CPU, "1")
    assert gpucheck.main([]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_the_report_lists_each_path_its_result_and_time(tmp_path):
    report = gpucheck.Report(machine="16-core x86_64 CPU (1 x NVIDIA H100), torch 2.11", started="now", rehearsal=False)
    report.outcomes += [gpucheck.Outcome("horovod", "Horovod all-reduce", "passed", 3.2, "over NCCL"),
                        gpucheck.Outcome("grading", "gpu profile", "not run", 0.1, "needs 4 GPUs | has 1"),
                        gpucheck.Outcome("lab2", "Lab 2", "FAILED", 30, "RuntimeError: x\nmore")]
    md, js = gpucheck.save(report, tmp_path / "gpu-check")
    text = md.read_text()
    assert "NVIDIA H100" in text and "| horovod | Horovod all-reduce | passed | 3 s | over NCCL |" in text
    assert "needs 4 GPUs \\| has 1" in text and "RuntimeError: x<br>more" in text and "1 failed" in text
    assert json.loads(js.read_text())["outcomes"][2]["status"] == "FAILED"
    assert [o.name for o in report.failed] == ["lab2"]


def test_gpu_mode_prints_the_gpu_reference_where_one_was_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(reference, "_path", lambda notebook: tmp_path / f"{notebook}.json")
    common = dict(unit="img/s", what="images per second", date="2026-11-26", command="c")
    reference.record("nb", "rate", 100.0, machine="2-core CPU (no GPU)", **common)
    reference.record("nb", "other", 5.0, machine="2-core CPU (no GPU)", **common)
    path = reference.record("nb", "rate", 9000.0, machine="16-core CPU (1 x NVIDIA H100)", mode="gpu", **common)
    assert path == tmp_path / "gpu" / "nb.json"
    assert reference.load("nb", mode="cpu")["rate"].value == 100.0
    gpu = reference.load("nb", mode="gpu")
    assert gpu["rate"].value == 9000.0 and "H100" in gpu["rate"].machine
    assert gpu["other"].value == 5.0 and "no GPU" in gpu["other"].machine, "a figure no GPU run recorded stays the CPU one"


def test_shipped_gpu_reference_runs_name_a_gpu():
    folder = reference.gpu_path("x").parent
    for path in sorted(folder.glob("*.json")):
        raw = json.loads(path.read_text())
        assert "no GPU" not in raw["machine"], f"{path.name}: a GPU reference run must name its GPU"
        cpu = reference.load(path.stem, mode="cpu")
        assert set(raw["figures"]) <= set(cpu), f"{path.name}: figures the CPU run does not have"


@pytest.mark.slow
def test_a_rehearsal_on_the_cpu_runs_the_collective_checks(tmp_path):
    ctx = gpucheck.Context(devices.as_cpu(devices.detect()), rehearse=True, quick=True, record="")
    report = gpucheck.run_checks(ctx, ["machine", "horovod", "nccl", "grading"], echo=lambda s: None)
    status = {o.name: o.status for o in report.outcomes}
    assert status == {"machine": "passed", "horovod": "passed", "nccl": "passed", "grading": "not run"}, report.markdown()
    detail = {o.name: o.detail for o in report.outcomes}
    assert "sum of 2 ranks' cpu tensors correct" in detail["horovod"]
    assert "gpu profile needs 4 GPUs" in detail["grading"]
