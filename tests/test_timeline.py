"""multigpu.running.timeline: parsing a Horovod timeline (as rank 0 writes it) and drawing it."""

from __future__ import annotations

import json

import matplotlib
import pytest

matplotlib.use("Agg")

from multigpu.running import timeline


def _events() -> list[dict]:
    """Two tensors of one step, in Horovod's format: metadata, begin/end pairs, ready marks."""
    ev = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": 1}}]
    for pid, name, t0 in ((1, "allreduce.fc.weight", 1_000_000), (2, "allreduce.conv.weight", 1_200_000)):
        ev += [
            {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}},
            {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": t0, "pid": pid},
            {"ph": "X", "name": "0", "ts": t0, "pid": pid, "dur": 0},
            {"ph": "X", "name": "1", "ts": t0 + 50_000, "pid": pid, "dur": 0},
            {"ph": "E", "ts": t0 + 50_000, "pid": pid},
            {"ph": "B", "name": "ALLREDUCE", "ts": t0 + 50_100, "pid": pid},
            {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": t0 + 50_200, "pid": pid},
            {"ph": "E", "ts": t0 + 60_200, "pid": pid},
            {"ph": "E", "ts": t0 + 60_300, "pid": pid, "args": {"dtype": "float32", "shape": "[10]"}},
        ]
    return ev


def test_load_tolerates_an_unterminated_file(tmp_path):
    path = tmp_path / "t.json"
    text = "[\n" + ",\n".join(json.dumps(e) for e in _events()) + ","  # as Horovod leaves it
    path.write_text(text)
    assert timeline.load(path) == _events()
    path.write_text(text + '{"ph": "B", "na')  # killed mid-event
    assert timeline.load(path) == _events()


def test_spans_pair_phases_per_tensor_with_nesting():
    spans = timeline.spans(_events())
    fc = [s for s in spans if s.tensor == "allreduce.fc.weight"]
    assert [s.phase for s in fc] == ["NEGOTIATE_ALLREDUCE", "ALLREDUCE", "GLOO_ALLREDUCE"]
    neg, allreduce, gloo = fc
    assert neg.duration == pytest.approx(0.05)
    assert allreduce.depth == 0 and gloo.depth == 1
    assert allreduce.start <= gloo.start and gloo.end <= allreduce.end
    assert spans == sorted(spans, key=lambda s: s.start)


def test_summary_ready_marks_and_steps():
    events = _events()
    spans = timeline.spans(events)
    totals = timeline.summary(spans)
    assert totals["NEGOTIATE_ALLREDUCE"] == pytest.approx(0.1)
    assert totals["GLOO_ALLREDUCE"] == pytest.approx(0.02)
    marks = timeline.ready_marks(events)
    assert ("allreduce.fc.weight", 1, pytest.approx(1.05)) in marks
    assert len(marks) == 4
    # the two tensors are 0.2 s apart: one burst with a large gap, two with a small one
    assert len(timeline.steps(spans, gap_s=0.5)) == 1
    assert len(timeline.steps(spans, gap_s=0.01)) == 2


def test_plot_draws_one_row_per_tensor_in_ready_order():
    events = _events()
    ax = timeline.plot(timeline.spans(events), marks=timeline.ready_marks(events))
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["fc.weight", "conv.weight"]  # the first gradient ready is on top
    assert len(ax.collections) == 6  # 3 phases x 2 tensors
    with pytest.raises(ValueError, match="no timeline events"):
        timeline.plot(timeline.spans(events), window=(100.0, 101.0))


def test_load_of_someone_elses_file_is_bounded_and_refuses_what_is_not_a_timeline(tmp_path):
    """``max_bytes``: the grader reading the timeline a submission's run left in its own folder."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_events()))
    assert timeline.load(path, max_bytes=10**6) == _events()
    with pytest.raises(ValueError, match="larger than"):
        timeline.load(path, max_bytes=100)
    link = tmp_path / "link.json"
    link.symlink_to(path)
    assert timeline.load(link) == _events()  # a learner's own file: as before
    with pytest.raises(ValueError, match="cannot be opened"):
        timeline.load(link, max_bytes=10**6)
    for text in ('[{"ph": "E"}, 3]', "[1, 2]"):
        path.write_text(text)
        with pytest.raises(ValueError, match="not a list of timeline events"):
            timeline.load(path, max_bytes=10**6)
    for junk in ("7", '{"ph": "E"}', "}" * 100_000):  # the last: many places to cut, a few tries only
        path.write_text(junk)
        with pytest.raises(ValueError):
            timeline.load(path, max_bytes=10**6)
