"""The review's rules about files, gradients and steps (part of :func:`multigpu.grading.review_rules.findings`):

- ``channel``: a file written outside the checkpoint folder (``args.checkpoint_dir``,
  ``$MULTIGPU_CHECKPOINT_DIR``) or a file of that folder read back: the one folder the contract
  writes to is the only one a conversion needs, and a file another rank reads is a channel
  between them (:meth:`multigpu.grading.review_flow.Flow.in_checkpoints` follows the paths);
- ``gradients``: gradients changed after Horovod's all-reduce (a ``.grad`` written, code
  registered on gradients, the DistributedOptimizer's ``synchronize``/``skip_synchronize``
  window), or part of what ``.backward()`` differentiates cut off from the graph (``.detach()``,
  ``.data``, ``.item()``, a forward under ``torch.no_grad()``): images counted as trained without
  their gradient;
- ``steps``: a step outside the DistributedOptimizer's: a ``torch.optim`` optimizer stepped
  without the wrapper, the model's parameters written, or its weights loaded, in the training
  loop (or a function a loop reaches).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from multigpu.grading.capabilities import GRADIENT_HOOKS, OPTIMIZERS, STEP_WINDOW, Names
from multigpu.grading.review_flow import Flow

Finding = tuple[str, ast.AST, str]

#: Methods of a path that write at the path (pathlib), and their counts of positional arguments
#: (``str.replace`` takes two: not a file).
PATH_WRITES = {"write_text": None, "write_bytes": None, "touch": None, "mkdir": None, "unlink": None, "rmdir": None,
               "chmod": None, "symlink_to": None, "hardlink_to": None, "rename": 1, "replace": 1}
PATH_READS = frozenset({"read_text", "read_bytes", "iterdir", "glob", "rglob"})
#: Calls that write at their first argument, or (``index``) another.
WRITES_AT = {"torch.save": 1, "os.remove": 0, "os.unlink": 0, "os.rmdir": 0, "os.removedirs": 0, "os.mkdir": 0,
             "os.makedirs": 0, "os.truncate": 0, "os.chmod": 0, "os.chown": 0, "os.lchown": 0, "os.utime": 0,
             "os.replace": 1, "os.rename": 1, "os.renames": 1, "os.link": 1, "os.symlink": 1, "shutil.copy": 1,
             "shutil.copy2": 1, "shutil.copyfile": 1, "shutil.copytree": 1, "shutil.move": 1, "shutil.rmtree": 0,
             "shutil.make_archive": 0, "shutil.copymode": 1, "shutil.copystat": 1, "numpy.save": 0, "numpy.savez": 0,
             "numpy.savez_compressed": 0, "numpy.savetxt": 0, "logging.FileHandler": 0,
             "logging.handlers.RotatingFileHandler": 0, "logging.handlers.TimedRotatingFileHandler": 0,
             "logging.handlers.WatchedFileHandler": 0}
OPENS = frozenset({"builtins.open", "io.open", "codecs.open", "os.open"})
#: What cuts a value off from autograd's graph.
DETACHING = frozenset({"detach", "detach_", "item", "tolist", "numpy"})
OUTSIDE = ("writes a file outside the checkpoint folder (MULTIGPU_CHECKPOINT_DIR): a channel between the ranks, or a "
           "record the grader did not ask for")


def findings(names: Names, flow: Flow) -> Iterator[Finding]:
    looping = flow.loop_reached()
    for node in ast.walk(names.tree):
        if isinstance(node, ast.Call):
            yield from files(names, flow, node)
            yield from gradient_calls(names, flow, node, looping)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            yield from written(flow, node, looping)


# ----------------------------------------------------------------------------- files


def _arg(call: ast.Call, index: int, *keywords: str) -> ast.AST | None:
    for k in call.keywords:
        if k.arg in keywords:
            return k.value
    return call.args[index] if len(call.args) > index else None


def _writes(mode: ast.AST | None, default: bool = False) -> bool:
    if mode is None:
        return default
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return any(c in mode.value for c in "wax+")
    return True  # a mode the source does not spell: taken as a write


def files(names: Names, flow: Flow, call: ast.Call) -> Iterator[Finding]:
    q = names.qualified(call.func)
    receiver = call.func.value if isinstance(call.func, ast.Attribute) else call.func
    method = call.func.attr if isinstance(call.func, ast.Attribute) and not q else ""
    if q in OPENS or method == "open":
        path = receiver if method else _arg(call, 0, "file", "path")
        flags = _arg(call, 1, "flags") if q == "os.open" else _arg(call, 0 if method else 1, "mode")
        write = q == "os.open" and any(w in ("O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC")
                                       for w in _attrs(flags)) or q != "os.open" and _writes(flags)
        yield from _file(flow, call, path, write)
    elif method in PATH_WRITES and PATH_WRITES[method] in (None, len(call.args)):
        yield from _file(flow, call, receiver, True)
        if PATH_WRITES[method]:
            yield from _file(flow, call, call.args[0], True)
    elif method in PATH_READS:
        yield from _file(flow, call, receiver, False)
    elif method in ("save", "tofile") and call.args:
        yield from _file(flow, call, call.args[0], True)
    elif q in WRITES_AT:
        yield from _file(flow, call, _arg(call, WRITES_AT[q], "f", "dst", "filename", "path"), True)
    elif q == "logging.basicConfig" and any(k.arg == "filename" for k in call.keywords):
        yield from _file(flow, call, _arg(call, 99, "filename"), True)
    elif q.startswith("tempfile."):
        yield "channel", call, f"{q}: {OUTSIDE}"


def _attrs(node: ast.AST | None) -> set[str]:
    return set() if node is None else {x.attr for x in ast.walk(node) if isinstance(x, ast.Attribute)} | \
        {x.id for x in ast.walk(node) if isinstance(x, ast.Name)}


def _file(flow: Flow, call: ast.Call, path: ast.AST | None, write: bool) -> Iterator[Finding]:
    inside = flow.in_checkpoints(path)
    if write and not inside:
        yield "channel", call, OUTSIDE
    elif not write and inside:
        yield "channel", call, ("reads back a file of the checkpoint folder: what one rank wrote there, another reads "
                                "(a channel between the ranks)")


# ----------------------------------------------------------------------------- gradients and steps


def _grad_like(flow: Flow, expr: ast.AST) -> bool:
    """``expr`` is a gradient (``p.grad``), a view of one, or a variable or container holding them."""
    return any(isinstance(x, ast.Attribute) and x.attr == "grad" and not flow.names.qualified(x)
               for x in flow.aliases(expr))


def model_state(flow: Flow, expr: ast.AST) -> bool:
    """``expr`` is the model's parameters, state or a layer's weight, a view of them, or a variable
    or container holding them (not a value computed from them)."""
    for x in flow.aliases(expr):
        if isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute) and x.func.attr in (
                "parameters", "named_parameters", "state_dict", "buffers", "named_buffers"):
            return True
        if isinstance(x, ast.Attribute) and x.attr in ("weight", "bias") and not flow.names.qualified(x):
            return True
    return False


#: In-place methods that change a tensor's flags, not its values.
FLAGS_ONLY = frozenset({"requires_grad_", "retain_grad", "share_memory_", "pin_memory_"})


def _in_place(name: str) -> bool:
    return name.endswith("_") and not name.startswith("_") and name not in FLAGS_ONLY


def gradient_calls(names: Names, flow: Flow, call: ast.Call, looping: set[int]) -> Iterator[Finding]:
    q = names.qualified(call.func)
    method = call.func.attr if isinstance(call.func, ast.Attribute) and not q else ""
    receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
    first = call.args[0] if call.args else None
    if method in STEP_WINDOW and not _own_method(flow, method, receiver):
        yield "gradients", call, (f".{method}(): the DistributedOptimizer's window between the all-reduce and the step: "
                                  "what the step uses may not be what was averaged")
    elif method in GRADIENT_HOOKS or q.rpartition(".")[2] in GRADIENT_HOOKS:
        yield "gradients", call, f"{method or q}: code run on gradients where the review cannot place it"
    elif receiver is not None and _in_place(method) and _grad_like(flow, receiver) or \
            q.startswith("torch.") and _in_place(q.rpartition(".")[2]) and first is not None and _grad_like(flow, first) \
            or any(k.arg == "out" and _grad_like(flow, k.value) for k in call.keywords):
        yield "gradients", call, "writes a gradient (.grad) in place: what the step uses is not what Horovod averaged"
    elif q == "builtins.setattr" and len(call.args) > 1 and isinstance(call.args[1], ast.Constant) \
            and call.args[1].value in ("grad", "data"):
        yield "gradients", call, f"sets .{call.args[1].value} by setattr: a gradient or a weight replaced"
    elif method == "backward" or q == "torch.autograd.backward":
        yield from detached(flow, call, receiver if method else first)
    elif method == "step" and receiver is not None and _local_optimizer(flow, receiver):
        yield "steps", call, ("steps a torch.optim optimizer that hvd.DistributedOptimizer does not wrap: a step with "
                              "this rank's own gradients")
    elif flow.in_loop(call, looping):
        yield from _loop_writes(flow, call, q, method, receiver, first)


def _loop_writes(flow: Flow, call: ast.Call, q: str, method: str, receiver: ast.AST | None,
                 first: ast.AST | None) -> Iterator[Finding]:
    if method == "load_state_dict" or q == "torch.nn.utils.vector_to_parameters":
        yield "steps", call, (f"{method or q} in the training loop (or a function a loop reaches): weights replaced "
                              "outside the DistributedOptimizer's step")
    elif receiver is not None and _in_place(method) and model_state(flow, receiver) or \
            q.startswith("torch.") and _in_place(q.rpartition(".")[2]) and first is not None and model_state(flow, first):
        yield "steps", call, ("writes the model's parameters in place in the training loop: a step outside the "
                              "DistributedOptimizer's")


def _own_method(flow: Flow, method: str, receiver: ast.AST | None) -> bool:
    """A class of the script defines ``method`` and ``receiver`` is no hvd.DistributedOptimizer as
    far as its bindings show (a metric's ``synchronize``, not the optimizer's)."""
    own = any(f for f in flow.functions.get(method, []) if isinstance(flow.names.up(f), ast.ClassDef))
    return own and receiver is not None and not any(
        isinstance(x, ast.Call) and flow.names.qualified(x.func) == "horovod.torch.DistributedOptimizer"
        for x in flow.aliases(receiver))


def _local_optimizer(flow: Flow, receiver: ast.AST) -> bool:
    """The stepped object was built by a torch.optim optimizer (or a subclass of the script's) and
    the bindings that reach the step never wrapped it in hvd.DistributedOptimizer."""
    key = flow.key(receiver)
    exprs = [b.expr for b in flow.reaching(key, receiver) if b.how == "value"] if key else [receiver]
    return any(_builds_optimizer(flow, e) for e in exprs)


def _builds_optimizer(flow: Flow, expr: ast.AST) -> bool:
    if not isinstance(expr, ast.Call):
        return False
    q = flow.names.qualified(expr.func)
    own = {c.name for c in ast.walk(flow.names.tree) if isinstance(c, ast.ClassDef)
           and any("Optimizer" in ast.unparse(b) for b in c.bases)}
    return q.startswith("torch.optim.") and q.rpartition(".")[2] in OPTIMIZERS or \
        isinstance(expr.func, ast.Name) and expr.func.id in own


def detached(flow: Flow, call: ast.Call, loss: ast.AST | None) -> Iterator[Finding]:
    """Part of what ``.backward()`` differentiates made from a detached value."""
    if loss is None:
        return
    step = flow.names.up(call)  # what the step computed: bindings in its loop (or its function)
    while step is not None and not isinstance(step, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef,
                                                      ast.AsyncFunctionDef, ast.Lambda, ast.Module)):
        step = flow.names.up(step)
    for expr, via in flow.origins(loss, within=step):
        if via is not None and via.no_grad:
            yield "gradients", call, (f"what .backward() differentiates is made from {via.name}, computed under "
                                      "torch.no_grad(): those images are counted without their gradient")
            return
        for x in ast.walk(expr):
            cut = x.func.attr if isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute) else \
                "data" if isinstance(x, ast.Attribute) and x.attr == "data" and not flow.names.qualified(x) else ""
            if cut in DETACHING or cut == "data":
                yield "gradients", call, (f"what .backward() differentiates is made from a value cut off from the graph "
                                          f"(.{cut}): those images are counted without their gradient")
                return


def written(flow: Flow, node: ast.AST, looping: set[int]) -> Iterator[Finding]:
    """Gradients assigned anywhere; the model's parameters assigned in the training loop."""
    targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]  # type: ignore[attr-defined]
    for target in targets:
        if isinstance(node, ast.Delete):
            continue
        inner = target.value if isinstance(target, (ast.Subscript, ast.Attribute)) else target
        if isinstance(target, ast.Attribute) and target.attr == "grad" or \
                (isinstance(target, ast.Subscript) or isinstance(node, ast.AugAssign) or
                 isinstance(target, ast.Attribute) and target.attr == "data") and _grad_like(flow, inner):
            yield "gradients", node, "assigns a gradient (.grad): what the step uses is not what Horovod averaged"
            return
        if not flow.in_loop(node, looping):
            continue
        if (isinstance(target, ast.Attribute) and target.attr == "data" or isinstance(target, ast.Subscript)
                or isinstance(node, ast.AugAssign)) and model_state(flow, inner):
            yield "steps", node, ("writes the model's parameters in the training loop: a step outside the "
                                  "DistributedOptimizer's")
            return
