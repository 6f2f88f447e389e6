"""multigpu.core.exercises: an answer that is, or calls, the course's own version is not the learner's."""

from __future__ import annotations

import textwrap
import types

from multigpu.core import exercises
from multigpu.labs.lab5 import memory, pipeline, tensor_parallel


def learner(source: str) -> types.ModuleType:
    """The names a cell defines, as a learner's kernel holds them (functions of a module of their own)."""
    module = types.ModuleType("learner_cells")
    exec(textwrap.dedent(source), module.__dict__)
    return module


def test_an_answer_of_its_own_passes_and_so_does_a_blank_one():
    cells = learner("""
        from multigpu.labs.lab5 import memory

        def bytes_per_device(parameters, stage, workers, optimizer="mixed adam"):
            w, g, k = memory.OPTIMIZER_BYTES[optimizer]
            return parameters * {0: w + g + k, 1: w + g + k / workers, 2: w + (g + k) / workers, 3: (w + g + k) / workers}[stage]

        def blank(parameters, stage, workers, optimizer="mixed adam"):
            raise NotImplementedError()
    """)
    assert exercises.borrowed(cells.bytes_per_device, memory.zero_bytes) == ""
    assert exercises.borrowed(cells.blank, memory.zero_bytes) == ""


def test_a_call_of_the_course_answer_is_found_however_it_is_named():
    cases = {
        "module attribute": "from multigpu.labs.lab5 import memory\ndef f(p, s, n): return memory.zero_bytes(p, s, n)",
        "imported under another name": "from multigpu.labs.lab5.memory import zero_bytes as z\ndef f(p, s, n): return z(p, s, n)",
        "module alias": "import multigpu.labs.lab5.memory as m\ndef f(p, s, n): return m.zero_bytes(p, s, n)",
        "full path": "import multigpu.labs.lab5.memory\ndef f(p, s, n): return multigpu.labs.lab5.memory.zero_bytes(p, s, n)",
        "a global alias": "from multigpu.labs.lab5 import memory\nzb = memory.zero_bytes\ndef f(p, s, n): return zb(p, s, n)",
        "a default argument": "from multigpu.labs.lab5 import memory\ndef f(p, s, n, impl=memory.zero_bytes): return impl(p, s, n)",
        "a helper of the learner's": ("from multigpu.labs.lab5 import memory\ndef helper(*a): return memory.zero_bytes(*a)\n"
                                      "def f(p, s, n): return helper(p, s, n)"),
        "an inner function": ("from multigpu.labs.lab5 import memory\n"
                              "def f(p, s, n):\n    def inner(): return memory.zero_bytes(p, s, n)\n    return inner()"),
        "a partial": "import functools\nfrom multigpu.labs.lab5 import memory\nf = functools.partial(memory.zero_bytes)",
    }
    for case, source in cases.items():
        got = exercises.borrowed(learner(source).f, memory.zero_bytes, memory.zero_bytes_per_parameter)
        assert got.startswith("write f yourself: it uses memory.zero_bytes") or (
            case == "a partial" and got.startswith("write your answer yourself: it uses memory.zero_bytes")), (case, got)


def test_the_answer_itself_a_lambda_a_container_and_a_subclass():
    assert exercises.borrowed(tensor_parallel.parallel_mlp, tensor_parallel.parallel_mlp).startswith(
        "write parallel_mlp yourself: it is tensor_parallel.parallel_mlp")
    cells = learner("""
        from multigpu.labs.lab5 import memory, pipeline, tensor_parallel

        bytes_per_device = lambda *args: memory.zero_bytes(*args)

        def one_f_one_b(stage, stages, micro_batches):
            return pipeline.ORDERS["1F1B"](stage, stages, micro_batches)

        class CopyToParallel(tensor_parallel.CopyToParallel):
            pass

        def parallel_mlp(x, w1, b1, w2, b2):
            return CopyToParallel.apply(x)
    """)
    assert exercises.borrowed(cells.bytes_per_device, memory.zero_bytes).startswith("write your answer yourself")
    assert exercises.borrowed(cells.one_f_one_b, pipeline.one_f_one_b_order).startswith(
        "write one_f_one_b yourself: it uses pipeline.one_f_one_b_order")
    versions = (tensor_parallel.parallel_mlp, tensor_parallel.CopyToParallel, tensor_parallel.ReduceFromParallel)
    assert "tensor_parallel.CopyToParallel" in exercises.borrowed(cells.parallel_mlp, *versions)


def test_the_helpers_an_exercise_gives_stay_allowed():
    cells = learner("""
        from multigpu.labs.lab5 import pipeline

        def one_f_one_b(stage, stages, micro_batches):
            return pipeline.gpipe_order(stage, stages, micro_batches)  # wrong, but its own
    """)
    assert exercises.borrowed(cells.one_f_one_b, pipeline.one_f_one_b_order) == ""
