"""multigpu.running.run_records: reading the scripts' run records into scaling rows (Lab 3, make bench)."""

from __future__ import annotations

import json
import math

import pytest

from multigpu.running import run_records


def _records(rate: float, n: int, tta=None) -> list[dict]:
    return [{"history": {"images_per_s": [rate * 0.5, rate, rate * 1.1], "time_to_accuracy_s": tta,
                         "val_acc": [0.5], "steps": 10}, "args": {"batch_size": 64}, "cpu_s": 1.0}
            for _ in range(n)]


def test_scaling_rows_efficiency_against_min_workers_cores():
    runs = {("horovod", 1): _records(100, 1), ("horovod", 2): _records(150, 2, 3.0), ("horovod", 4): _records(180, 4)}
    rows = {r["workers"]: r for r in run_records.scaling_rows(runs, cores=2)}
    assert run_records.throughput(runs[("horovod", 2)]) == 150  # median over epochs
    assert rows[2]["speedup"] == pytest.approx(1.5) and rows[2]["ideal"] == 2
    assert rows[2]["efficiency"] == pytest.approx(0.75)
    assert rows[4]["ideal"] == 2 and rows[4]["efficiency"] == pytest.approx(0.9)
    assert rows[2]["time_to_accuracy_s"] == 3.0
    assert math.isclose(rows[1]["cpu_s_per_image"], 1.0 / 640)
    table = run_records.format_rows(list(rows.values()))
    assert "75%" in table and "3.0 s" in table


def test_each_rank_reads_its_own_record(tmp_path):
    clock = run_records.RunClock()
    run_records.write_record(tmp_path, 0, {"size": 2}, clock)
    with pytest.raises(FileNotFoundError, match="every rank writes its own record"):
        run_records.read_records(tmp_path, 2)  # a rank-0-only habit leaves rank 1 without one
    run_records.record_path(tmp_path, 1).write_text(json.dumps(run_records.make_record(0, {"size": 2}, clock)))
    with pytest.raises(ValueError, match="not rank 1"):
        run_records.read_records(tmp_path, 2)  # rank 0's facts under rank 1's name
    run_records.write_record(tmp_path, 1, {"size": 2}, clock)
    assert [r["rank"] for r in run_records.read_records(tmp_path, 2)] == [0, 1]
