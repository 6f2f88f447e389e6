"""Review flags: what a person must look at before a pass becomes a certificate.

No check inside a run can prove that what a submission all-reduced were its gradients, or that
Horovod, not the submission, wrote Horovod's timeline. So the grader reads each submitted source
(Python's :mod:`ast`; nothing is run) for CAPABILITIES: what could let the run's records differ from
its work, or reach outside the run (:mod:`multigpu.grading.review_rules`,
:mod:`multigpu.grading.capabilities`). A flagged pass is HELD for review: no certificate until the
instructor approves it (``multigpu review``). Style is never flagged: helper functions and classes,
logging, timing, type hints, the pure standard library are a learner's own business. What the
grader saw from outside the run adds flags of its own (:mod:`multigpu.grading.observations`, line 0:
"the run").

The kinds (:data:`KINDS`; docs/calibration.md has the rules behind each, and the honest corpus
they were checked against):

===============  ==================================================================================
flag             what in the source
===============  ==================================================================================
``channel``      another channel between processes: sockets, shared memory, pipes, ``multiprocessing``,
                 ``torch.distributed``, a file written outside the checkpoint folder, or read back from it
``process``      a process or thread started
``dynamic``      access that hides what it reaches: ``getattr`` of a computed name, ``vars`` (but of
                 the parsed options), ``__dict__`` and the interpreter's other own attributes,
                 ``importlib``, ``exec``, ``eval``, ``compile``, frames, a module held in a variable
``native``       ``ctypes`` and other native code
``signal``       signals
``environment``  the process's environment changed (``os.environ`` written, ``chdir``, ...)
``load``         code or objects loaded from files (``torch.load``, ``pickle``, ``sys.path``)
``import``       a module outside the standard library and the course's environment
``horovod``      Horovod outside its training API
``collective``   a collective out of place: on tensors made like the model's, grouped, handed on,
                 or a weight broadcast in a loop or in a function a loop reaches
``gradients``    gradients changed after the all-reduce (``.grad`` written, gradient hooks, the
                 ``synchronize`` window), or part of the loss cut off from the graph
``steps``        a step outside the DistributedOptimizer's: an unwrapped optimizer stepped, the
                 model's parameters written or its weights loaded in the training loop
``timeline``     Horovod's timeline (the grader's evidence) named in a string or a name
``holdout``      the course's data generator called with a seed (how the held-out set is made)
``reads``        (the run) samples served from memory, or reads the grader could not watch
``network``      (the run) connections between ranks that Horovod did not open
``work``         (the run) images claimed as trained that the grader saw no backward pass for
===============  ==================================================================================

The reference solution, the starter, every honest variant and every conversion of the honest
corpus (``tests/fixtures/corpus``) raise no flag (tested).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

#: flag kind -> what it means, in one line (the review listing shows it).
KINDS: dict[str, str] = {
    "channel": "another channel between processes (network, shared memory, files outside the checkpoint folder)",
    "process": "a process or thread started",
    "dynamic": "code that hides what it reaches",
    "native": "native code the review cannot read",
    "signal": "signals",
    "environment": "the process's environment changed",
    "load": "code or objects loaded from files",
    "import": "a module outside the standard library and the course's environment",
    "horovod": "Horovod outside its training API",
    "collective": "a collective used where a conversion does not use one",
    "gradients": "gradients changed after the all-reduce, or cut off before it",
    "steps": "a step outside the DistributedOptimizer's",
    "timeline": "Horovod's timeline (the grader's evidence) named or handled by the script",
    "holdout": "the course's data generator called with a seed of the script's own",
    "reads": "(the run) training samples the grader did not see read in their epoch",
    "network": "(the run) connections between ranks that Horovod did not open",
    "work": "(the run) images claimed as trained that reached no backward pass",
}


@dataclass(frozen=True)
class Flag:
    kind: str
    line: int
    code: str  # the flagged line of the source, stripped
    why: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def flags(source: str) -> list[Flag]:
    """The review flags of ``source``, by line (empty for a script that does not parse: it fails anyway)."""
    from multigpu.grading import review_rules

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    lines = source.splitlines()
    found: dict[tuple[str, int], Flag] = {}
    for kind, node, why in review_rules.findings(tree):
        line = getattr(node, "lineno", 0)
        code = lines[line - 1].strip()[:200] if 0 < line <= len(lines) else ""
        found.setdefault((kind, line), Flag(kind, line, code, why))
    return sorted(found.values(), key=lambda f: (f.line, f.kind))


def record(found: Iterable[Flag | dict], passed: bool) -> dict[str, Any]:
    """A result's ``review``: its flags, whether the pass is held (a pass with flags), no decision yet."""
    items = [f.to_dict() if isinstance(f, Flag) else dict(f) for f in found]
    return {"flags": items, "held": bool(passed and items), "decision": None}


def awaits_decision(review: dict[str, Any] | None) -> bool:
    """A held pass nobody has decided on yet (no certificate while it waits)."""
    return bool(review and review.get("held") and not review.get("decision"))


def released(review: dict[str, Any] | None) -> bool:
    """Whether a result's review lets a pass be certified: not held, or approved by a person."""
    if not review or not review.get("held"):
        return True
    return bool((review.get("decision") or {}).get("approved"))


def _where(flag: dict[str, Any]) -> str:
    """``line 12``, or ``the run`` for what the grader saw of the run (line 0)."""
    return f"line {flag['line']}" if flag["line"] else "the run"


def summary(items: Iterable[dict[str, Any]]) -> str:
    """``line 12 (call), the run (reads)``: where to look."""
    return ", ".join(f"{_where(f)} ({f['kind']})" for f in items)


def show(items: Iterable[dict[str, Any]]) -> str:
    """The flagged lines (and what the grader saw of the run) with why each was flagged, for the instructor."""
    return "\n".join(f"  {_where(f):>9} [{f['kind']}] {f['code']}\n            {f['why']}" for f in items)
