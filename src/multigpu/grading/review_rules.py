"""The review's rules: what in a source is flagged, and why (:func:`findings`; the kinds are
:data:`multigpu.grading.review.KINDS`).

1. **Outside the vocabulary** (``import``, ``call``): every use of a name the known conversions
   never make (:mod:`multigpu.grading.vocabulary`).
2. **Dynamic access** (``dynamic``), anywhere in the source: what hides from (1) the name it
   reaches or the function it calls.
3. **A known call out of place** (``collective``): Horovod's collectives are in the vocabulary
   for the uses a conversion makes of them (a metric averaged, the initial state broadcast); on
   tensors made like the model's, grouped, or a weight broadcast in a loop or in a function a
   loop reaches (the ranks' weights made equal after they trained apart), they are flagged.
4. ``timeline`` (a name or string of Horovod's timeline, the grader's evidence) and ``stall`` (a
   ``while`` loop in the training loop, a loop that does nothing).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from multigpu.grading.vocabulary import Names, Use

Finding = tuple[str, ast.AST, str]

#: Builtins that reach a name, a module or code given as data.
DYNAMIC_BUILTINS = frozenset({"vars", "globals", "locals", "getattr", "setattr", "delattr", "hasattr", "__import__",
                              "exec", "eval", "compile", "breakpoint", "__build_class__"})
#: Horovod's collectives by name (``hvd.<name>``); DistributedOptimizer calls them inside Horovod.
COLLECTIVES = frozenset(
    f"{base}{suffix}" for base in ("allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "reducescatter",
                                   "grouped_reducescatter", "alltoall", "broadcast", "sparse_allreduce")
    for suffix in ("", "_", "_async", "_async_"))
#: Collectives that move the model's weights (a conversion calls them once, before training).
WEIGHT_BROADCASTS = frozenset({"broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "broadcast",
                               "broadcast_", "broadcast_async", "broadcast_async_"})
#: Names in a collective's argument (or in what its loop iterates over) that make a tensor like the model's.
MODEL_LIKE = frozenset({"grad", "parameters", "named_parameters", "state_dict", "zeros_like", "ones_like",
                        "empty_like", "full_like", "rand_like", "randn_like", "shape", "data", "weight", "bias",
                        "param_groups", "buffers"})
#: Words of the timeline in a string or a name.
TIMELINE_WORDS = ("timeline", "negotiate_allreduce", "start_time_since_epoch")
LOOPS = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def findings(tree: ast.AST, known: frozenset[str]) -> Iterator[Finding]:
    """Every flag of the parsed source ``tree`` against the vocabulary ``known``."""
    names = Names(tree)
    for use in names.uses():
        if use.key not in known:
            yield unknown(use)
    yield from dynamic(names)
    yield from out_of_place(names)
    yield from timeline_and_stalls(names)


def unknown(use: Use) -> Finding:
    """The flag of a use outside the vocabulary."""
    known_by = "the calls the starter, the reference, the honest conversions and Horovod's training API make"
    if use.kind == "import":
        return "import", use.node, f"imports {use.name}: no known conversion imports it"
    if use.kind == "method":
        return "call", use.node, f".{use.name}(): a method outside {known_by}"
    if use.kind == "define":
        return "call", use.node, (f"defines the method {use.name}: outside the methods a known conversion defines "
                                  "(Python calls some by itself: what runs there is not where the review reads it)")
    what = "calls" if use.kind == "call" else "uses as a value"
    return "call", use.node, f"{what} {use.name}: outside {known_by}"


# ----------------------------------------------------------------------------- dynamic access


def dynamic(names: Names) -> Iterator[Finding]:
    for node in ast.walk(names.tree):
        if isinstance(node, ast.Name) and node.id in DYNAMIC_BUILTINS and node.id not in names.variables \
                and node.id not in names.defined:
            yield "dynamic", node, f"{node.id}: reaches a name or code given as data, which the review cannot read"
        elif isinstance(node, ast.Attribute) and node.attr.startswith("__") and node.attr.endswith("__"):
            yield "dynamic", node, f"{node.attr}: the interpreter's own attribute, a way around the names the review reads"
        elif isinstance(node, ast.Attribute) and names.qualified(node).startswith("sys.modules"):
            yield "dynamic", node, "sys.modules: modules reached by a string"
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and names.qualified(node):
            yield "dynamic", node, f"assigns {names.qualified(node)}: changes what a module's name calls"
        elif _string_built(node):
            yield "dynamic", node, "a string built from pieces: a name hidden from the review"
        elif isinstance(node, ast.Call):
            yield from _indirect_call(names, node)


def _called(names: Names, node: ast.AST) -> bool:
    up = names.parent.get(id(node))
    return isinstance(up, ast.Call) and up.func is node


def _indirect_call(names: Names, call: ast.Call) -> Iterator[Finding]:
    f = call.func
    if isinstance(f, ast.Subscript):
        yield "dynamic", call, "a call through a subscript (a dict or a list of functions): what it calls is data"
    elif isinstance(f, ast.Call):
        yield "dynamic", call, "calls what another call returned: what it calls is not named"
    elif isinstance(f, ast.Name) and f.id in names.variables:
        held = _held_by(names, f.id)
        if held:
            yield "dynamic", call, f"calls {f.id}, which holds {held}: what it calls is not named"


def _held_by(names: Names, variable: str) -> str:
    """What a variable is bound to that makes calling it opaque ("" when every binding is an
    object built by a call, or a parameter)."""
    for node in ast.walk(names.tree):
        for target, value in _bindings(node):
            if any(isinstance(t, ast.Name) and t.id == variable for t in ast.walk(target)):
                if value is None:
                    return "the items of a loop"
                if not isinstance(value, ast.Call):
                    return f"a {type(value).__name__.lower()} (not an object a call built)"
    return ""


def _bindings(node: ast.AST) -> list[tuple[ast.AST, ast.AST | None]]:
    """``(target, value)`` pairs ``node`` binds; value None for a loop's items."""
    if isinstance(node, ast.Assign):
        return [(t, node.value) for t in node.targets]
    if isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and node.value is not None:
        return [(node.target, node.value)]
    if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        return [(node.target, None)]
    return []


def _string_built(node: ast.AST) -> bool:
    """``"tor" + "ch"``, ``"".join(["a", "b"])``, ``"txet"[::-1]``: a string made of literal pieces."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        return _literal_text(node.left) and _literal_text(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join" \
            and _literal_text(node.func.value) and node.args \
            and isinstance(node.args[0], (ast.List, ast.Tuple)) and all(_literal_text(e) for e in node.args[0].elts):
        return True
    return isinstance(node, ast.Subscript) and _literal_text(node.value)


def _literal_text(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    return isinstance(node, ast.BinOp) and _string_built(node)


# ----------------------------------------------------------------------------- known calls out of place


def out_of_place(names: Names) -> Iterator[Finding]:
    looping = _loop_reached(names)
    for node in ast.walk(names.tree):
        if not isinstance(node, ast.Call):
            continue
        q = names.qualified(node.func)
        name = q.rpartition(".")[2] if q.startswith("horovod.") else ""
        if name in WEIGHT_BROADCASTS and _in_loop(names, node, looping):
            yield "collective", node, (f"{name} in a loop, or in a function a loop reaches: ranks that average their "
                                       "gradients agree already; a broadcast there hides ranks that trained apart")
        elif name in COLLECTIVES:
            why = _not_gradients(names, node, name)
            if why:
                yield "collective", node, why


def _functions(names: Names) -> dict[str, list[ast.AST]]:
    found: dict[str, list[ast.AST]] = {}
    for node in ast.walk(names.tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.setdefault(node.name, []).append(node)
    return found


def _callee_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _loop_reached(names: Names) -> set[int]:
    """ids of the functions a loop calls (by name, transitively), of every method of a class (a data
    set's ``__getitem__`` runs in the loop that iterates over it), of every function used as a value
    and every lambda (whoever they are handed to calls them, anywhere)."""
    functions = _functions(names)
    as_values = [f for x in ast.walk(names.tree) if isinstance(x, ast.Name) and isinstance(x.ctx, ast.Load)
                 and not _called(names, x) for f in functions.get(x.id, [])]
    lambdas: list[ast.AST] = [x for x in ast.walk(names.tree) if isinstance(x, ast.Lambda)]
    methods = [f for fs in functions.values() for f in fs if isinstance(names.parent.get(id(f)), ast.ClassDef)]
    todo: list[ast.AST] = [n for n in ast.walk(names.tree) if isinstance(n, LOOPS)] + methods + as_values + lambdas
    reached: set[int] = {id(f) for f in methods + as_values + lambdas}
    while todo:
        root = todo.pop()
        for x in ast.walk(root):
            if isinstance(x, ast.Call):
                for f in functions.get(_callee_name(x), []):
                    if id(f) not in reached:
                        reached.add(id(f))
                        todo.append(f)
    return reached


def _in_loop(names: Names, node: ast.AST, looping: set[int]) -> bool:
    parent = names.parent.get(id(node))
    while parent is not None:
        if isinstance(parent, LOOPS) or id(parent) in looping:
            return True
        parent = names.parent.get(id(parent))
    return False


def _words(node: ast.AST) -> set[str]:
    """Every name and attribute in ``node``."""
    return {x.id if isinstance(x, ast.Name) else x.attr for x in ast.walk(node) if isinstance(x, (ast.Name, ast.Attribute))}


def _not_gradients(names: Names, call: ast.Call, name: str) -> str:
    """Why a Horovod collective looks like it moves something other than averaged gradients ("" if not)."""
    if name.startswith("grouped_"):
        return f"{name}: a list of tensors all-reduced by hand, outside hvd.DistributedOptimizer"
    model_like = MODEL_LIKE & _words(ast.Tuple(elts=[*call.args, *(k.value for k in call.keywords)]))
    if model_like:
        return (f"{name} on tensors made like the model's ({', '.join(sorted(model_like))}) outside "
                "hvd.DistributedOptimizer: the grader cannot tell that they are the gradients it trains with")
    parent = names.parent.get(id(call))
    while parent is not None:
        iters = [parent.iter] if isinstance(parent, (ast.For, ast.AsyncFor)) else \
            [g.iter for g in parent.generators] if isinstance(parent, (ast.ListComp, ast.SetComp, ast.DictComp,
                                                                       ast.GeneratorExp)) else []
        over = set().union(*(_words(i) for i in iters)) & MODEL_LIKE if iters else set()
        if over:
            return f"{name} in a loop over the model's tensors ({', '.join(sorted(over))}) outside hvd.DistributedOptimizer"
        parent = names.parent.get(id(parent))
    return ""


# ----------------------------------------------------------------------------- the timeline, stalls


def timeline_and_stalls(names: Names) -> Iterator[Finding]:
    training = _training(names)
    for node in ast.walk(names.tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                any(w in node.value.lower() for w in TIMELINE_WORDS):
            yield "timeline", node, "names Horovod's timeline, the grader's evidence that gradients were averaged"
        elif isinstance(node, (ast.Name, ast.Attribute)) and any(
                w in (node.id if isinstance(node, ast.Name) else node.attr).lower() for w in ("timeline",)):
            yield "timeline", node, "names Horovod's timeline, the grader's evidence that gradients were averaged"
        elif isinstance(node, ast.While) and id(node) in training:
            yield "stall", node, "a while loop inside the training loop (a busy wait?)"
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)) and _does_nothing(node.body):
            yield "stall", node, "a loop that does nothing (a busy wait)"


def _training(names: Names) -> set[int]:
    """ids of the nodes of the training loop: loops that call ``.backward()`` and, transitively,
    the bodies of the functions called from them by name."""
    functions = _functions(names)
    todo: list[ast.AST] = [n for n in ast.walk(names.tree) if isinstance(n, (ast.For, ast.AsyncFor, ast.While))
                           and any(isinstance(c, ast.Call) and _callee_name(c) == "backward" for c in ast.walk(n))]
    inside: set[int] = set()
    done: set[int] = set()
    while todo:
        root = todo.pop()
        if id(root) in done:
            continue
        done.add(id(root))
        for x in ast.walk(root):
            inside.add(id(x))
            if isinstance(x, ast.Call):
                todo += functions.get(_callee_name(x), [])
    return inside


def _does_nothing(body: list[ast.stmt]) -> bool:
    return all(isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
               for s in body)

