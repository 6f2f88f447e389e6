"""Review flags: what a person must look at before a pass becomes a certificate.

No check inside a run can prove that what a submission all-reduced were its gradients, or that
Horovod, not the submission, wrote Horovod's timeline. What the grader cannot verify it flags by
reading the submitted source (Python's :mod:`ast`; nothing is run), and a flagged pass is HELD
for review: no certificate until the instructor approves it (``multigpu review``).

=============  ====================================================================================
flag           what in the source
=============  ====================================================================================
``collective`` a Horovod collective on tensors that are not the optimizer's gradients as
               ``hvd.DistributedOptimizer`` all-reduces them: on tensors made like the model's
               (``zeros_like``, ``.grad``, ``.parameters()``, ``state_dict``, a loop over them),
               grouped collectives, or a broadcast of the weights while the model trains
``timeline``   the Horovod timeline (the grader's evidence) named, started, stopped or redirected
``framework``  another framework's collectives: ``torch.distributed`` (DDP), MPI for Python,
               sockets, multiprocessing, TensorFlow, JAX, Ray, DeepSpeed
``dynamic``    code that hides what it calls: ``exec``, ``eval``, ``compile``, ``__import__``,
               ``importlib``, ``getattr`` with a computed name, ``ctypes``
``stall``      a sleep, or a busy loop (``while``, or a loop that does nothing) in the training loop
``file``       a read outside the script's folder and the data set: an absolute, home or ``..``
               path, or one built from ``Path.home()``, ``expanduser`` or the environment
=============  ====================================================================================

The training loop is every loop that contains a ``.backward()`` call, with the functions it calls
(by name, transitively). The reference solution and the starter raise no flag (tested).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

#: flag kind -> what it means, in one line (the review listing shows it).
KINDS: dict[str, str] = {
    "collective": "a collective on tensors that are not the optimizer's gradients",
    "timeline": "Horovod's timeline (the grader's evidence) named or handled by the script",
    "framework": "another framework's collectives or processes",
    "dynamic": "code that hides what it calls",
    "stall": "a sleep or a busy loop in the training loop",
    "file": "a read outside the script's folder and the data set",
}
#: Horovod's collectives by name (``hvd.<name>``); DistributedOptimizer calls them inside Horovod.
COLLECTIVES = frozenset(
    f"{base}{suffix}" for base in ("allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "reducescatter",
                                   "grouped_reducescatter", "alltoall", "broadcast", "sparse_allreduce")
    for suffix in ("", "_", "_async", "_async_"))
#: Collectives that move the model's weights (legitimate once, before training starts).
WEIGHT_BROADCASTS = frozenset({"broadcast_parameters", "broadcast_optimizer_state", "broadcast_object"})
#: Names in a collective's argument (or in what its loop iterates over) that make a tensor like the model's.
MODEL_LIKE = frozenset({"grad", "parameters", "named_parameters", "state_dict", "zeros_like", "ones_like",
                        "empty_like", "full_like", "rand_like", "randn_like", "shape", "data", "weight", "bias",
                        "param_groups", "buffers"})
#: Modules whose import means another way to move tensors between workers (or to start processes).
FOREIGN = ("torch.distributed", "torch.nn.parallel", "torch.multiprocessing", "mpi4py", "socket", "multiprocessing",
           "tensorflow", "jax", "ray", "deepspeed", "subprocess", "ctypes", "importlib")
#: Words of the timeline in a string or a name.
TIMELINE_WORDS = ("timeline", "negotiate_allreduce", "start_time_since_epoch")
#: Calls that read a file or a folder (attribute or plain name).
READS = frozenset({"open", "read_text", "read_bytes", "load", "loads", "listdir", "scandir", "walk", "glob", "iglob",
                   "rglob", "iterdir", "fromfile", "memmap"})
#: Variables of the environment the contract names (the data set and the checkpoint folder).
CONTRACT_VARS = frozenset({"MULTIGPU_ASSESSMENT_DATA", "MULTIGPU_CHECKPOINT_DIR"})


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
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    lines = source.splitlines()
    _link_parents(tree)
    training = _training_nodes(tree)
    found: dict[tuple[str, int], Flag] = {}
    for kind, node, why in _findings(tree, training):
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


def summary(items: Iterable[dict[str, Any]]) -> str:
    """``line 12 (collective), line 40 (stall)``: where to look."""
    return ", ".join(f"line {f['line']} ({f['kind']})" for f in items)


def show(items: Iterable[dict[str, Any]]) -> str:
    """The flagged lines with why each was flagged, for the instructor."""
    return "\n".join(f"  line {f['line']:>4} [{f['kind']}] {f['code']}\n         {f['why']}" for f in items)


# ----------------------------------------------------------------------------- reading the tree


def _link_parents(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child.review_parent = node  # type: ignore[attr-defined]


def _parents(node: ast.AST) -> Iterator[ast.AST]:
    parent: ast.AST | None = node
    while (parent := getattr(parent, "review_parent", None)) is not None:
        yield parent


def _dotted(node: ast.AST) -> str:
    """``torch.distributed.all_reduce`` for that attribute chain ("" for anything else)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _callee(call: ast.Call) -> str:
    """The last name of what ``call`` calls (``allreduce`` for ``hvd.allreduce(...)``)."""
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _names(node: ast.AST) -> set[str]:
    """Every name and attribute that occurs in ``node``."""
    out = set()
    for x in ast.walk(node):
        if isinstance(x, ast.Name):
            out.add(x.id)
        elif isinstance(x, ast.Attribute):
            out.add(x.attr)
    return out


def _training_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes of the training loop: loops that call ``.backward()`` and, transitively,
    the bodies of the functions called from them by name."""
    functions: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.setdefault(node.name, []).append(node)
    roots = [n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.AsyncFor, ast.While))
             and any(isinstance(c, ast.Call) and _callee(c) == "backward" for c in ast.walk(n))]
    inside: set[int] = set()
    todo: list[ast.AST] = list(roots)
    done: set[int] = set()
    while todo:
        root = todo.pop()
        if id(root) in done:
            continue
        done.add(id(root))
        for x in ast.walk(root):
            inside.add(id(x))
            if isinstance(x, ast.Call) and isinstance(x.func, (ast.Name, ast.Attribute)):
                todo += functions.get(_callee(x), [])
    return inside


def _findings(tree: ast.AST, training: set[int]) -> Iterator[tuple[str, ast.AST, str]]:
    assigned = _assignments(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield from _foreign_import(node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if any(w in node.value.lower() for w in TIMELINE_WORDS):
                yield "timeline", node, "names Horovod's timeline, the grader's evidence that gradients were averaged"
        elif isinstance(node, (ast.Name, ast.Attribute)):
            yield from _foreign_name(node)
        elif isinstance(node, ast.While) and id(node) in training:
            yield "stall", node, "a while loop inside the training loop (a busy wait?)"
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)) and _does_nothing(node.body):
            yield "stall", node, "a loop that does nothing (a busy wait)"
        elif isinstance(node, ast.Call):
            yield from _call(node, training, assigned)


def _foreign_import(node: ast.Import | ast.ImportFrom) -> Iterator[tuple[str, ast.AST, str]]:
    modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
    if isinstance(node, ast.ImportFrom) and node.module:
        modules += [f"{node.module}.{a.name}" for a in node.names]
    for m in modules:
        hit = next((f for f in FOREIGN if m == f or m.startswith(f + ".")), None)
        if hit:
            kind = "dynamic" if hit in ("ctypes", "importlib") else "framework"
            yield kind, node, f"imports {m}: the grader certifies Horovod's collectives only"
            return
        if "DistributedDataParallel" in m or m.endswith(".DataParallel"):
            yield "framework", node, f"imports {m}: torch's data parallelism, not Horovod's"
            return


def _foreign_name(node: ast.Name | ast.Attribute) -> Iterator[tuple[str, ast.AST, str]]:
    dotted = _dotted(node) if isinstance(node, ast.Attribute) else node.id
    if isinstance(getattr(node, "review_parent", None), ast.Attribute):
        return  # judged once, as the whole chain
    if dotted.startswith("torch.distributed") or dotted.split(".")[-1] in ("DistributedDataParallel", "DataParallel",
                                                                           "init_process_group", "all_reduce"):
        yield "framework", node, f"uses {dotted}: another framework's collectives, not Horovod's"
    elif dotted.split(".")[-1] in ("start_timeline", "stop_timeline") or "TIMELINE" in dotted.upper():
        yield "timeline", node, f"uses {dotted}: Horovod's timeline is the grader's evidence"


def _does_nothing(body: list[ast.stmt]) -> bool:
    return all(isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
               for s in body)


def _call(call: ast.Call, training: set[int], assigned: dict[str, list[ast.AST]]) -> Iterator[tuple[str, ast.AST, str]]:
    name = _callee(call)
    if name in COLLECTIVES:
        why = _not_gradients(call, name)
        if why:
            yield "collective", call, why
    elif name in WEIGHT_BROADCASTS and id(call) in training:
        yield "collective", call, (f"{name} while the model trains: ranks that average their gradients agree already; "
                                   "a broadcast here hides ranks that trained apart")
    elif name == "sleep":
        yield "stall", call, "a sleep" + (" in the training loop" if id(call) in training else "")
    elif name == "import_module" or (name in ("exec", "eval", "compile", "__import__")
                                     and isinstance(call.func, ast.Name)):  # not model.eval(), re.compile()
        yield "dynamic", call, f"{name}(): the code it runs cannot be read before the run"
    elif name in ("getattr", "setattr") and len(call.args) >= 2 and not isinstance(call.args[1], ast.Constant):
        yield "dynamic", call, f"{name} with a computed name: what it reaches cannot be read before the run"
    elif name in ("home", "expanduser", "gettempdir"):
        yield "file", call, f"{name}(): a path outside the script's folder and the data set"
    elif name in READS:
        why = _outside_read(call, assigned)
        if why:
            yield "file", call, why


def _not_gradients(call: ast.Call, name: str) -> str:
    """Why a Horovod collective looks like it moves something other than averaged gradients ("" if not)."""
    if name.startswith("grouped_"):
        return f"{name}: a list of tensors all-reduced by hand, outside hvd.DistributedOptimizer"
    model_like = MODEL_LIKE & _names(ast.Tuple(elts=[*call.args, *(k.value for k in call.keywords)]))
    if model_like:
        return (f"{name} on tensors made like the model's ({', '.join(sorted(model_like))}) outside "
                "hvd.DistributedOptimizer: the grader cannot tell that they are the gradients it trains with")
    for parent in _parents(call):
        iters = [parent.iter] if isinstance(parent, (ast.For, ast.AsyncFor)) else \
            [g.iter for g in parent.generators] if isinstance(parent, (ast.ListComp, ast.SetComp, ast.DictComp,
                                                                       ast.GeneratorExp)) else []
        over = set().union(*(_names(i) for i in iters)) & MODEL_LIKE if iters else set()
        if over:
            return (f"{name} in a loop over the model's tensors ({', '.join(sorted(over))}) outside "
                    "hvd.DistributedOptimizer")
    return ""


def _assignments(tree: ast.AST) -> dict[str, list[ast.AST]]:
    """name -> the values assigned to it anywhere (to follow a path through a variable)."""
    out: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out.setdefault(t.id, []).append(node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out.setdefault(node.target.id, []).append(node.value)
    return out


def _outside_read(call: ast.Call, assigned: dict[str, list[ast.AST]]) -> str:
    """Why the path a read call reads lies outside the script's folder and the data set ("" if it does not)."""
    parts: list[ast.AST] = [*call.args, *(k.value for k in call.keywords)]
    if isinstance(call.func, ast.Attribute):
        parts.append(call.func.value)  # Path("/etc").read_text()
    seen: set[str] = set()
    while parts:
        node = parts.pop()
        for x in ast.walk(node):
            if isinstance(x, ast.Constant) and isinstance(x.value, str):
                v = x.value
                if v.startswith(("/", "~", "\\")) or ".." in v.split("/"):
                    return f"reads {v!r}: outside the script's folder and the data set"
                if v.isupper() and v not in CONTRACT_VARS and _reads_environment(x):
                    return f"reads a path from the environment ({v}): only the contract's variables name data"
            elif isinstance(x, ast.Attribute) and x.attr in ("home", "expanduser", "parents", "environ"):
                if x.attr != "environ" or not _contract_key(x):
                    return f"reads a path built with {x.attr}: outside the script's folder and the data set"
            elif isinstance(x, ast.Name) and x.id in assigned and x.id not in seen:
                seen.add(x.id)
                parts += assigned[x.id]
    return ""


def _reads_environment(constant: ast.Constant) -> bool:
    """``os.environ[KEY]``, ``os.environ.get(KEY)`` or ``os.getenv(KEY)`` for this KEY."""
    parent = getattr(constant, "review_parent", None)
    if isinstance(parent, ast.Subscript):
        return _dotted(parent.value).endswith("environ")
    if isinstance(parent, ast.Call):
        return _callee(parent) == "getenv" or _dotted(parent.func).endswith("environ.get")
    return False


def _contract_key(environ: ast.Attribute) -> bool:
    """``os.environ[...]`` / ``os.environ.get(...)`` with one of the contract's variables."""
    parent = getattr(environ, "review_parent", None)
    key = None
    if isinstance(parent, ast.Subscript) and isinstance(parent.slice, ast.Constant):
        key = parent.slice.value
    elif isinstance(parent, ast.Attribute):
        call = getattr(parent, "review_parent", None)
        if isinstance(call, ast.Call) and call.args and isinstance(call.args[0], ast.Constant):
            key = call.args[0].value
    return key in CONTRACT_VARS
