"""multigpu.labs.lab3.backward_passes: accumulation on real workers, all-reduces counted from Horovod's timeline."""

from __future__ import annotations

import json

import pytest

from multigpu.labs.lab3 import backward_passes
from multigpu.running import launch


def write_timeline(path, allreduces_per_tensor: dict[str, int]) -> None:
    """A timeline as Horovod's coordinator writes it: per tensor a negotiation, then each all-reduce
    with its library's phase nested inside, left without the closing bracket."""
    events, t = [], 0
    for pid, (name, count) in enumerate(allreduces_per_tensor.items(), start=1):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}})
        for _ in range(count):
            events += [{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": t, "pid": pid}, {"ph": "E", "ts": t + 5, "pid": pid},
                       {"ph": "B", "name": "ALLREDUCE", "ts": t + 6, "pid": pid},
                       {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": t + 7, "pid": pid}, {"ph": "E", "ts": t + 8, "pid": pid},
                       {"ph": "E", "ts": t + 9, "pid": pid}]
            t += 10
    path.write_text("[\n" + ",\n".join(json.dumps(e) for e in events) + ",")


def test_count_allreduces_counts_each_tensors_top_level_phase(tmp_path):
    write_timeline(tmp_path / "0.json", {"allreduce.fc.weight": 3, "allreduce.fc.bias": 3, "broadcast.fc.weight": 1})
    assert backward_passes.count_allreduces(tmp_path / "0.json") == 6  # the broadcast's tensor is not a gradient


def test_rounds_per_step_and_the_table(tmp_path):
    result = {"k": 4, "steps": 2, "parameters": 2, "difference": {w: 1e-8 for w in backward_passes.WAYS}}
    for i, count in enumerate((2, 2, 8)):
        write_timeline(tmp_path / f"{i}.json", {"allreduce.a": count, "allreduce.b": count})
    rounds = backward_passes.rounds_per_step(result, tmp_path)
    assert list(rounds.values()) == [1.0, 1.0, 4.0]
    text = backward_passes.table(result, rounds)
    assert "backward_passes_per_step=4" in text and "4 micro-batches, all-reduce each" in text and "4.00" in text


@pytest.mark.slow
def test_on_two_workers_backward_passes_per_step_all_reduces_once_per_step_and_matches_the_large_batch(tmp_path):
    result = launch.run_horovod(backward_passes.experiment, 2, args=(str(tmp_path), 3, 2, 2),
                                env=backward_passes.TIMELINE_ENV, timeout=300, echo=False)[0]
    rounds = backward_passes.rounds_per_step(result, tmp_path)
    large, once, each = (rounds[w] for w in backward_passes.WAYS)
    assert (large, once, each) == (1.0, 1.0, 3.0), rounds
    assert all(d < 1e-5 for d in result["difference"].values()), result["difference"]
    assert "backward_passes_per_step" in result["refused"]
