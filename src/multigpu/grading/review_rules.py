"""The review's rules: what in a source is flagged, and why (:func:`findings`; the kinds are
:data:`multigpu.grading.review.KINDS`, the capabilities :mod:`multigpu.grading.capabilities`).

A rule flags a capability: something that could let a run's records differ from its work, or
reach outside the run. Style is never flagged: helpers, classes, logging, timing, the pure
standard library are a learner's own business.

1. **A name that reaches a capability** (``channel``, ``process``, ``native``, ``signal``,
   ``load``, ``dynamic``, ``environment``; ``import`` for a library outside the standard library
   and the course's environment), imported, called or handed on as a value.
2. **Dynamic access** (``dynamic``): ``getattr`` of a computed name, ``vars`` of anything but the
   parsed options, the interpreter's own attributes (``__dict__``, ``__globals__``, frames), a
   module held in a variable, a module's name assigned, a star import.
3. **Horovod outside its training API** (``horovod``), and a collective out of place
   (``collective``): on tensors made like the model's, grouped, handed on as a value, or a weight
   broadcast in a loop or in a function a loop reaches (ranks that trained apart made equal).
4. ``timeline`` (Horovod's timeline, the grader's evidence, named in a string, assembled pieces
   included, or a name) and ``holdout`` (the course's data generator called with a seed: how the
   grader makes its held-out set).
5. Files, gradients and steps (:mod:`multigpu.grading.review_training`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from multigpu.grading import review_training
from multigpu.grading.capabilities import (
    CAPABILITY_METHODS,
    COLLECTIVES,
    FRAME_ATTRIBUTES,
    GENERATORS,
    HOROVOD_API,
    MODEL_LIKE,
    OBJECT_BROADCASTS,
    SAFE_DUNDERS,
    TIMELINE_WORDS,
    WEIGHT_BROADCASTS,
    WHY,
    Names,
    capability,
    outside_environment,
)
from multigpu.grading.review_flow import Flow

Finding = tuple[str, ast.AST, str]

#: Builtins that reach an attribute by a name given as data.
BY_NAME = frozenset({"builtins.getattr", "builtins.setattr", "builtins.delattr", "builtins.hasattr"})


def findings(tree: ast.AST) -> Iterator[Finding]:
    """Every flag of the parsed source ``tree`` (see the module doc)."""
    tree = ast.fix_missing_locations(_LiteralGetattr().visit(tree))
    names = Names(tree)
    flow = Flow(names)
    yield from reached_names(names)
    yield from dynamic(names, flow)
    yield from out_of_place(names, flow)
    yield from timeline(names)
    yield from holdout(names)
    yield from review_training.findings(names, flow)


class _LiteralGetattr(ast.NodeTransformer):
    """``getattr(x, "name")`` read as ``x.name``: what it reaches is named, and judged as such."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "getattr" and 2 <= len(node.args) <= 3 \
                and not node.keywords and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) \
                and node.args[1].value.isidentifier():
            return ast.copy_location(ast.Attribute(value=node.args[0], attr=node.args[1].value, ctx=ast.Load()), node)
        return node


# ----------------------------------------------------------------------------- names that reach a capability


def reached_names(names: Names) -> Iterator[Finding]:
    for node in ast.walk(names.tree):
        if isinstance(node, ast.Attribute) and node.attr in CAPABILITY_METHODS and not names.qualified(node):
            kind = CAPABILITY_METHODS[node.attr]
            yield kind, node, f".{node.attr}: {WHY[kind]}"
    for use in names.uses():
        if use.kind == "import":
            yield from _imported(use.name, use.node)
            continue
        if isinstance(use.node, ast.Name) and use.node.id in names.modules:
            yield "dynamic", use.node, f"the module {use.name} held in a variable or handed on: what it reaches is not named"
            continue
        kind = capability(use.name)
        what = "calls" if use.kind == "call" else "uses"
        if kind and use.name != "builtins.vars":  # vars: dynamic() tells the parsed options from the rest
            yield kind, use.node, f"{what} {use.name}: {WHY[kind]}"
        elif use.name.startswith("horovod.") and f"{use.kind}:{use.name}" not in HOROVOD_API:
            if f"call:{use.name}" in HOROVOD_API:
                yield "collective", use.node, (f"{use.name} handed on as a value: where it is called, the review cannot "
                                               "see what it moves")
            else:
                yield "horovod", use.node, (f"{what} {use.name}: Horovod outside its training API (init, rank/size, "
                                            "DistributedOptimizer, the broadcasts of the initial state, metrics)")


def _imported(name: str, node: ast.AST) -> Iterator[Finding]:
    if name.endswith(".*"):
        yield "dynamic", node, f"imports every name of {name[:-2]}: the names the script uses are not the review's to read"
    elif name.startswith("horovod.") and name != "horovod.torch" and not (
            f"call:{name}" in HOROVOD_API or f"value:{name}" in HOROVOD_API):
        yield "horovod", node, f"imports {name}: Horovod outside its training API"
    elif name.startswith("."):
        yield "import", node, f"imports {name}: a module beside the script, code the review does not read"
    elif capability(name):
        yield capability(name), node, f"imports {name}: {WHY[capability(name)]}"
    elif outside_environment(name):
        yield "import", node, (f"imports {name}: neither the standard library nor the course's environment (torch, "
                               "horovod.torch, numpy, Pillow, multigpu.core, tqdm): code the review does not read")


# ----------------------------------------------------------------------------- dynamic access


def dynamic(names: Names, flow: Flow) -> Iterator[Finding]:
    for node in ast.walk(names.tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("__") and node.attr.endswith("__") \
                and node.attr not in SAFE_DUNDERS:
            yield "dynamic", node, f"{node.attr}: the interpreter's own attribute, a way around the names the review reads"
        elif isinstance(node, ast.Attribute) and node.attr in FRAME_ATTRIBUTES:
            yield "dynamic", node, f"{node.attr}: a frame's variables, any function's"
        elif isinstance(node, ast.Name) and node.id in ("__builtins__", "__loader__", "__spec__"):
            yield "dynamic", node, f"{node.id}: the interpreter's own names, a way around the names the review reads"
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)) and names.qualified(node) \
                and not _setting(names, node):
            yield "dynamic", node, f"assigns {names.qualified(node)}: changes what a module's name reaches"
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)) \
                and names.qualified(node.value) == "os.environ":
            yield "environment", node, f"writes os.environ: {WHY['environment']}"
        elif isinstance(node, ast.Call):
            yield from _by_name(names, flow, node)


def _setting(names: Names, target: ast.Attribute) -> bool:
    """A module's setting given a literal (``torch.backends.cudnn.benchmark = True``): no name of it changes."""
    up = names.up(target)
    return isinstance(up, ast.Assign) and isinstance(up.value, ast.Constant)


def _by_name(names: Names, flow: Flow, call: ast.Call) -> Iterator[Finding]:
    q = names.qualified(call.func)
    if q in BY_NAME:
        name = call.args[1] if len(call.args) > 1 else None
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            yield "dynamic", call, f"{q[9:]} of a name given as data: what it reaches is not named"
        elif q == "builtins.setattr" and call.args and names.qualified(call.args[0]):
            yield "dynamic", call, f"setattr on {names.qualified(call.args[0])}: changes what a module's name reaches"
    elif q == "builtins.vars" and not (call.args and _parsed_options(flow, call.args[0])):
        yield "dynamic", call, "vars of something other than the parsed options: every attribute of it, by name as data"


def _parsed_options(flow: Flow, expr: ast.AST) -> bool:
    """``expr`` is argparse's result (``parse_args()``, ``parse_known_args()[0]``, a Namespace), as far
    as its bindings show."""
    for x, _ in flow.origins(expr):
        if isinstance(x, ast.Call):
            q = flow.names.qualified(x.func)
            name = x.func.attr if isinstance(x.func, ast.Attribute) else getattr(x.func, "id", "")
            return q == "argparse.Namespace" or name in ("parse_args", "parse_known_args", "parse_intermixed_args")
        if not isinstance(x, (ast.Name, ast.Attribute, ast.Subscript, ast.Tuple)):
            return False
    return False


# ----------------------------------------------------------------------------- collectives out of place


def out_of_place(names: Names, flow: Flow) -> Iterator[Finding]:
    looping = flow.loop_reached()
    for node in ast.walk(names.tree):
        if not isinstance(node, ast.Call):
            continue
        q = names.qualified(node.func)
        name = q.rpartition(".")[2] if q.startswith("horovod.") else ""
        moves_weights = name in WEIGHT_BROADCASTS or (name in OBJECT_BROADCASTS and _model_like(flow, node))
        if moves_weights and flow.in_loop(node, looping):
            yield "collective", node, (f"{name} of the model's state in a loop, or in a function a loop reaches: ranks "
                                       "that average their gradients agree already; a broadcast there hides ranks that "
                                       "trained apart")
        elif name in COLLECTIVES and name not in OBJECT_BROADCASTS:
            why = _not_gradients(names, node, name)
            if why:
                yield "collective", node, why


def _words(node: ast.AST) -> set[str]:
    """Every name and attribute in ``node``."""
    return {x.id if isinstance(x, ast.Name) else x.attr for x in ast.walk(node) if isinstance(x, (ast.Name, ast.Attribute))}


def _model_like(flow: Flow, call: ast.Call) -> bool:
    """What the call moves is (a container or view of) the model's tensors."""
    moved = [*call.args[:1], *(k.value for k in call.keywords if k.arg in ("obj", "tensor", "params"))]
    return any(review_training.model_state(flow, arg) for arg in moved)


def _not_gradients(names: Names, call: ast.Call, name: str) -> str:
    """Why a Horovod collective looks like it moves something other than averaged gradients ("" if not)."""
    if name.startswith("grouped_"):
        return f"{name}: a list of tensors all-reduced by hand, outside hvd.DistributedOptimizer"
    model_like = MODEL_LIKE & _words(ast.Tuple(elts=[*call.args, *(k.value for k in call.keywords)]))
    if model_like:
        return (f"{name} on tensors made like the model's ({', '.join(sorted(model_like))}) outside "
                "hvd.DistributedOptimizer: the grader cannot tell that they are the gradients it trains with")
    parent = names.up(call)
    while parent is not None:
        iters = [parent.iter] if isinstance(parent, (ast.For, ast.AsyncFor)) else \
            [g.iter for g in parent.generators] if isinstance(parent, (ast.ListComp, ast.SetComp, ast.DictComp,
                                                                       ast.GeneratorExp)) else []
        over = set().union(*(_words(i) for i in iters)) & MODEL_LIKE if iters else set()
        if over:
            return f"{name} in a loop over the model's tensors ({', '.join(sorted(over))}) outside hvd.DistributedOptimizer"
        parent = names.up(parent)
    return ""


# ----------------------------------------------------------------------------- the timeline, the held-out set


def timeline(names: Names) -> Iterator[Finding]:
    why = "names Horovod's timeline, the grader's evidence that gradients were averaged"
    for node in ast.walk(names.tree):
        text = _literal_text(node)
        if text is not None and not _inside_literal(names, node) and any(w in text.lower() for w in TIMELINE_WORDS):
            yield "timeline", node, why
        elif isinstance(node, (ast.Name, ast.Attribute)) and "timeline" in (
                node.id if isinstance(node, ast.Name) else node.attr).lower():
            yield "timeline", node, why


def _literal_text(node: ast.AST) -> str | None:
    """The text of a string literal, or of one assembled from literal pieces (``"HORO" + "VOD"``,
    ``"".join([...])``, ``"txet"[::-1]``, ``"%s" % "x"``); None for anything else."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        left, right = _literal_text(node.left), _literal_text(node.right)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join" \
            and _literal_text(node.func.value) is not None and node.args and isinstance(node.args[0], (ast.List, ast.Tuple)):
        parts = [_literal_text(e) for e in node.args[0].elts]
        return None if any(p is None for p in parts) else "".join(p or "" for p in parts)
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
        text = _literal_text(node.value)
        return None if text is None else text[::-1] + text
    return None


def _inside_literal(names: Names, node: ast.AST) -> bool:
    """Part of a larger assembled literal (judged once, as the whole)."""
    up = names.up(node)
    return up is not None and _literal_text(up) is not None


def holdout(names: Names) -> Iterator[Finding]:
    for node in ast.walk(names.tree):
        if not isinstance(node, (ast.Name, ast.Attribute)) or names.inner(node):
            continue
        q = names.qualified(node)
        if not q.startswith("multigpu.core.data") or q.rpartition(".")[2] not in GENERATORS:
            continue
        up = names.up(node)
        call = up if isinstance(up, ast.Call) and up.func is node else None
        seeded = call is None or q.endswith(("image_rng", "render_image")) or any(
            k.arg in ("seed", None) for k in call.keywords)
        if seeded:
            yield "holdout", node, (f"{q} with a seed of the script's own (or handed on): the grader makes its held-out "
                                    "set with this generator and a secret seed; a submission has no use for another set")
