"""Review flags: what a person must look at before a pass becomes a certificate.

No check inside a run can prove that what a submission all-reduced were its gradients, or that
Horovod, not the submission, wrote Horovod's timeline. So the grader reads each submitted source
(Python's :mod:`ast`; nothing is run) against what it KNOWS a conversion does, and flags the rest
with the line and why; a flagged pass is HELD for review: no certificate until the instructor
approves it (``multigpu review``). What the grader saw from outside the run adds flags of its
own (:mod:`multigpu.grading.observations`, line 0: "the run").

==============  ===================================================================================
flag            what in the source (:mod:`multigpu.grading.review_rules`)
==============  ===================================================================================
``import``      an import no known conversion makes
``call``        a call, method, module member used as a value, or method defined in a class that is
                not in the vocabulary (:func:`multigpu.grading.vocabulary.known`: the starter, the
                reference, the honest variants, Horovod's documented training API, pure builtins)
``dynamic``     access that hides what it reaches, anywhere: ``vars``, ``globals``, ``getattr``/
                ``setattr`` of anything, ``__dict__`` and other dunder attributes, ``sys.modules``,
                a call through a subscript, a dict, a call's result, a lambda or a variable that
                holds a function, a function of the script used as a value, a module's attribute
                assigned, a name built from string pieces
``collective``  a known collective used where a conversion does not: on tensors that are not the
                optimizer's gradients (``zeros_like``, ``.grad``, ``.parameters()``, a loop over
                them), grouped, or a weight broadcast in a loop or in a function a loop reaches
``timeline``    the Horovod timeline (the grader's evidence) named in a string or a name
``stall``       a ``while`` loop in the training loop, or a loop that does nothing
``reads``       (the run) samples served from memory, or reads the grader could not watch
``network``     (the run) connections between ranks that Horovod did not open
==============  ===================================================================================

The reference solution, the starter and every honest variant raise no flag (tested).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

#: flag kind -> what it means, in one line (the review listing shows it).
KINDS: dict[str, str] = {
    "import": "an import no known conversion makes",
    "call": "a call outside the vocabulary of known conversions",
    "dynamic": "code that hides what it reaches",
    "collective": "a collective used where a conversion does not use one",
    "timeline": "Horovod's timeline (the grader's evidence) named or handled by the script",
    "stall": "a busy loop in the training loop",
    "reads": "(the run) training samples the grader did not see read in their epoch",
    "network": "(the run) connections between ranks that Horovod did not open",
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
    from multigpu.grading import review_rules, vocabulary

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    lines = source.splitlines()
    found: dict[tuple[str, int], Flag] = {}
    for kind, node, why in review_rules.findings(tree, vocabulary.known()):
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
