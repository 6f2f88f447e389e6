"""Where a value in a submission comes from, read from its source (:class:`Flow`): what a
variable was last bound to before a line, whether a path lies in the checkpoint folder
(:meth:`Flow.in_checkpoints`), which functions a loop reaches (:meth:`Flow.loop_reached`).
The review's rules that follow values use it (:mod:`multigpu.grading.review_rules`,
:mod:`multigpu.grading.review_training`). Nothing is run: it is Python's :mod:`ast`, so a value
that flows where the source does not say (through a container, a function's result) is not
followed, and a rule that needs it says what it could not follow by flagging."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from multigpu.grading.capabilities import Names

SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module, ast.ClassDef)
LOOPS = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
#: Calls that make a path from their first argument (or their receiver), inside it.
PATH_CALLS = frozenset({"pathlib.Path", "pathlib.PurePath", "pathlib.PosixPath", "builtins.str", "os.fspath",
                        "os.path.join", "os.path.abspath", "os.path.normpath", "os.path.realpath", "os.path.expanduser"})
PATH_METHODS = frozenset({"joinpath", "with_suffix", "with_name", "with_stem", "resolve", "absolute", "expanduser"})
#: Calls whose result is (a container of) their arguments, and methods whose result is (a view or
#: copy of) their object: what :meth:`Flow.aliases` follows.
SAME_CALLS = frozenset({"builtins.list", "builtins.tuple", "builtins.dict", "builtins.zip", "builtins.enumerate",
                        "builtins.reversed", "builtins.sorted", "builtins.iter", "builtins.next", "copy.copy",
                        "copy.deepcopy", "itertools.chain", "itertools.islice"})
SAME_METHODS = frozenset({"values", "items", "keys", "detach", "view", "view_as", "reshape", "flatten", "contiguous",
                          "clone", "cpu", "to", "float", "half", "double", "chunk", "split", "unbind", "copy", "get",
                          "pop", "__iter__"})
#: The checkpoint folder by name: the contract's option and the variable the grader sets.
CHECKPOINT_NAMES = frozenset({"checkpoint_dir", "MULTIGPU_CHECKPOINT_DIR"})
#: Attributes that leave a path (its parent's parent, its root) or keep only a piece of it.
LEAVE = frozenset({"parents", "anchor", "root", "drive", "home", "cwd", "name", "stem", "suffix", "parts"})


@dataclass(frozen=True)
class Binding:
    """One binding of a name: ``how`` is ``value`` (``expr`` the value), ``iter`` (the items of
    ``expr``), ``with`` (what ``expr`` entered) or ``param`` (``expr`` the function)."""

    name: str
    how: str
    expr: ast.AST
    line: int
    scope: ast.AST
    #: bound inside a ``with torch.no_grad()`` (or inference mode) block
    no_grad: bool = False
    #: the statement (or function) that binds it
    node: ast.AST | None = None


class Flow:
    """The bindings of one parsed source and what follows from them (see the module doc)."""

    def __init__(self, names: Names):
        self.names = names
        self.bindings: dict[str, list[Binding]] = {}
        self.functions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        for node in ast.walk(names.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions.setdefault(node.name, []).append(node)
            for key, how, expr in _binds(node):
                line = getattr(node, "lineno", 0)
                scope = expr if how == "param" else self.scope(node)  # a parameter is bound in its function
                b = Binding(key, how, expr, line, scope, self.in_no_grad(node), node)
                self.bindings.setdefault(key, []).append(b)

    # ------------------------------------------------------------------ scopes and bindings

    def scope(self, node: ast.AST) -> ast.AST:
        """The function (or lambda, class, module) ``node`` runs in."""
        up = self.names.up(node)
        while up is not None and not isinstance(up, SCOPES):
            up = self.names.up(up)
        return up if up is not None else self.names.tree

    def in_no_grad(self, node: ast.AST) -> bool:
        up = self.names.up(node)
        while up is not None and not isinstance(up, SCOPES):
            if isinstance(up, (ast.With, ast.AsyncWith)) and any(self.no_grad_context(i.context_expr) for i in up.items):
                return True
            up = self.names.up(up)
        return False

    def no_grad_context(self, expr: ast.AST) -> bool:
        q = self.names.qualified(expr.func) if isinstance(expr, ast.Call) else ""
        if q in ("torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad", "torch.autograd.inference_mode"):
            return True
        return q in ("torch.set_grad_enabled", "torch.autograd.set_grad_enabled") and isinstance(expr, ast.Call) \
            and bool(expr.args) and isinstance(expr.args[0], ast.Constant) and expr.args[0].value is False

    def reaching(self, key: str, at: ast.AST) -> list[Binding]:
        """The bindings of ``key`` (a variable, or ``.attr`` for an attribute of ``self``) that
        reach ``at``: the last one before it in its own function; else the last one of the nearest
        enclosing function that binds it (a closure sees its final value); else every one (an
        attribute set in another method, a loop's next round)."""
        found = self.bindings.get(key, [])
        line, scope = getattr(at, "lineno", 0), self.scope(at)
        here = [b for b in found if b.scope is scope and b.line < line]
        while not here and scope is not self.names.tree:
            scope = self.scope(scope)
            here = [b for b in found if b.scope is scope]
        if here:
            last = max(b.line for b in here)
            return [b for b in here if b.line == last]
        return found

    def key(self, node: ast.AST) -> str:
        """The binding key of a Name (``x``) or of an attribute of ``self`` (``.x``); "" otherwise."""
        if isinstance(node, ast.Name) and node.id in self.names.variables:
            return node.id
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            return "." + node.attr
        return ""

    def origins(self, node: ast.AST, within: ast.AST | None = None) -> Iterator[tuple[ast.AST, Binding | None]]:
        """``node`` and every expression it was computed from through bindings (each once), with
        the binding that led there; with ``within``, only bindings made inside that node (the
        loop of a training step)."""
        seen: set[int] = set()
        todo: list[tuple[ast.AST, Binding | None]] = [(node, None)]
        while todo:
            expr, via = todo.pop()
            if id(expr) in seen or len(seen) > 400:
                continue
            seen.add(id(expr))
            yield expr, via
            for x in ast.walk(expr):
                k = self.key(x) if isinstance(x, (ast.Name, ast.Attribute)) and isinstance(x.ctx, ast.Load) else ""
                for b in self.reaching(k, x) if k else []:
                    if b.how in ("value", "iter") and (within is None or self.descends(b.node, within)):
                        todo.append((b.expr, b))

    def descends(self, node: ast.AST | None, ancestor: ast.AST) -> bool:
        while node is not None:
            if node is ancestor:
                return True
            node = self.names.up(node)
        return False

    def aliases(self, node: ast.AST) -> Iterator[ast.AST]:
        """``node`` and what it is the same object as, or a container or view of: variables
        followed to their values and loops to what they iterate, attributes and items to their
        object, displays and comprehensions to their elements, views and copies to their source
        (``.detach()``, ``.view()``, ``list()``, ``deepcopy``). Arithmetic and other calls make a
        new value: not followed."""
        seen: set[int] = set()
        todo = [node]
        while todo:
            expr = todo.pop()
            if id(expr) in seen or len(seen) > 400:
                continue
            seen.add(id(expr))
            yield expr
            todo += self._same_as(expr)

    def _same_as(self, expr: ast.AST) -> list[ast.AST]:
        key = self.key(expr) if isinstance(expr, (ast.Name, ast.Attribute)) else ""
        if key:
            return [b.expr for b in self.reaching(key, expr) if b.how in ("value", "iter")]
        if isinstance(expr, (ast.Attribute, ast.Subscript, ast.Starred)):
            return [expr.value]
        if isinstance(expr, (ast.Tuple, ast.List, ast.Set)):
            return list(expr.elts)
        if isinstance(expr, ast.Dict):
            return [v for v in expr.values if v is not None]
        if isinstance(expr, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            return [expr.elt, *(g.iter for g in expr.generators)]
        if isinstance(expr, ast.DictComp):
            return [expr.value, *(g.iter for g in expr.generators)]
        if isinstance(expr, ast.IfExp):
            return [expr.body, expr.orelse]
        if isinstance(expr, ast.BoolOp):
            return list(expr.values)
        if isinstance(expr, ast.NamedExpr):
            return [expr.value]
        if isinstance(expr, ast.Call):
            q = self.names.qualified(expr.func)
            if q in SAME_CALLS:
                return list(expr.args)
            if isinstance(expr.func, ast.Attribute) and not q and expr.func.attr in SAME_METHODS:
                return [expr.func.value]
        return []

    # ------------------------------------------------------------------ paths

    def in_checkpoints(self, expr: ast.AST | None, seen: frozenset[str] = frozenset()) -> bool:
        """Whether the path ``expr`` lies in the checkpoint folder (``args.checkpoint_dir``,
        ``$MULTIGPU_CHECKPOINT_DIR``), as far as the source shows: made from it by joins that do not
        climb out (no ``..``, no absolute piece, at most the parent of a file inside it)."""
        if expr is None or _escapes(expr):
            return False
        if isinstance(expr, ast.Constant):
            return expr.value in CHECKPOINT_NAMES
        if isinstance(expr, (ast.Name, ast.Attribute)) and (getattr(expr, "id", None) or getattr(expr, "attr", "")) \
                in CHECKPOINT_NAMES:
            return True
        if isinstance(expr, ast.Attribute) and expr.attr == "parent":
            return self.is_join(expr.value) and self.in_checkpoints(expr.value, seen)
        if isinstance(expr, ast.Attribute) and expr.attr in LEAVE:
            return False
        key = self.key(expr)
        if key:
            return self._bound_in_checkpoints(key, expr, seen)
        return self._made_in_checkpoints(expr, seen)

    def _made_in_checkpoints(self, expr: ast.AST, seen: frozenset[str]) -> bool:
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div):
            return self.in_checkpoints(expr.left, seen)
        if isinstance(expr, ast.JoinedStr) and expr.values and isinstance(expr.values[0], ast.FormattedValue):
            return self.in_checkpoints(expr.values[0].value, seen)
        if isinstance(expr, ast.BoolOp):
            return all(self.in_checkpoints(v, seen) or (isinstance(v, ast.Constant) and "/" not in str(v.value))
                       for v in expr.values)
        if isinstance(expr, ast.IfExp):
            return self.in_checkpoints(expr.body, seen) and self.in_checkpoints(expr.orelse, seen)
        if isinstance(expr, ast.Subscript):  # os.environ["MULTIGPU_CHECKPOINT_DIR"]
            return self.names.qualified(expr.value) == "os.environ" and self.in_checkpoints(expr.slice, seen)
        if isinstance(expr, ast.Call):
            q = self.names.qualified(expr.func)
            if q in ("os.environ.get", "os.getenv") and expr.args:
                return self.in_checkpoints(expr.args[0], seen)
            if q in PATH_CALLS and expr.args:
                return self.in_checkpoints(expr.args[0], seen)
            if isinstance(expr.func, ast.Attribute) and expr.func.attr in PATH_METHODS and not q:
                return self.in_checkpoints(expr.func.value, seen)
        return False

    def _bound_in_checkpoints(self, key: str, at: ast.AST, seen: frozenset[str]) -> bool:
        if key in seen:
            return False
        seen = seen | {key}
        found = self.reaching(key, at)
        return bool(found) and all(self._binding_in_checkpoints(b, seen) for b in found)

    def _binding_in_checkpoints(self, b: Binding, seen: frozenset[str]) -> bool:
        if b.how == "value":
            return self.in_checkpoints(b.expr, seen)
        if b.how != "param" or not isinstance(b.expr, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        passed = self.arguments(b.expr, b.name)
        return bool(passed) and all(a is not None and self.in_checkpoints(a, seen) for a in passed)

    def is_join(self, expr: ast.AST) -> bool:
        """A path joined below another (``a / "b"``, ``a.joinpath(b)``, ``os.path.join(a, b)``,
        ``f"{a}/b"``), directly or as a variable's value: its parent is at most ``a``."""
        for x, _ in self.origins(expr):
            if isinstance(x, ast.BinOp) and isinstance(x.op, ast.Div):
                return True
            if isinstance(x, ast.JoinedStr) and len(x.values) > 1:
                return True
            if isinstance(x, ast.Call) and (self.names.qualified(x.func) == "os.path.join" and len(x.args) > 1 or
                                            isinstance(x.func, ast.Attribute) and x.func.attr == "joinpath"):
                return True
            if not isinstance(x, (ast.Name, ast.Attribute, ast.Call)):
                return False
        return False

    # ------------------------------------------------------------------ calls of the script's functions

    def arguments(self, function: ast.FunctionDef | ast.AsyncFunctionDef, param: str) -> list[ast.AST | None]:
        """What every call of ``function`` by its name passes as ``param`` (None where it passes
        nothing or cannot be told); [] when the function is handed on as a value (its callers
        cannot be read) or never called."""
        args = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
        method = isinstance(self.names.up(function), ast.ClassDef)
        passed: list[ast.AST | None] = []
        for node in ast.walk(self.names.tree):
            named = isinstance(node, ast.Name) and node.id == function.name or \
                isinstance(node, ast.Attribute) and node.attr == function.name
            if not named or not isinstance(getattr(node, "ctx", None), ast.Load):
                continue
            call = self.names.up(node)
            if not isinstance(call, ast.Call) or call.func is not node:
                return []
            passed.append(_argument(call, args, param, skip=1 if method and isinstance(node, ast.Attribute) else 0))
        return passed

    # ------------------------------------------------------------------ loops

    def loop_reached(self) -> set[int]:
        """ids of the functions a loop runs: called by name from a loop (transitively), methods
        called from one, methods Python calls by itself (``__call__``, ``__getitem__``, ...), a
        class's ``__init__`` where the class is made in a loop, and every function handed on as a
        value or lambda (whoever gets it calls it, anywhere)."""
        methods = {id(f) for fs in self.functions.values() for f in fs if isinstance(self.names.up(f), ast.ClassDef)}
        implicit = [f for fs in self.functions.values() for f in fs if id(f) in methods and f.name.startswith("__")
                    and f.name not in ("__init__", "__post_init__", "__new__")]
        as_values = [f for x in ast.walk(self.names.tree) if isinstance(x, (ast.Name, ast.Attribute))
                     and isinstance(x.ctx, ast.Load) and not self.names.called(x) and not self._applied(x)
                     and not self.names.qualified(x)
                     for f in self.functions.get(x.id if isinstance(x, ast.Name) else x.attr, [])]
        lambdas = [x for x in ast.walk(self.names.tree) if isinstance(x, ast.Lambda)]
        roots: list[ast.AST] = [*implicit, *as_values, *lambdas]
        reached = {id(f) for f in roots}
        todo: list[ast.AST] = [n for n in ast.walk(self.names.tree) if isinstance(n, LOOPS)] + roots
        classes = {c.name: c for c in ast.walk(self.names.tree) if isinstance(c, ast.ClassDef)}
        while todo:
            for x in ast.walk(todo.pop()):
                if not isinstance(x, ast.Call):
                    continue
                name = _callee_name(x)
                found = list(self.functions.get(name, []))
                if name in classes:  # made here: its __init__ runs here
                    found += [f for f in classes[name].body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                              and f.name in ("__init__", "__post_init__", "__new__")]
                for f in found:
                    if id(f) not in reached:
                        reached.add(id(f))
                        todo.append(f)
        return reached

    def _applied(self, value: ast.AST) -> bool:
        """``value`` is handed to a module's ``.apply`` (run once on every layer, there and then),
        outside any loop: weights initialised before training."""
        call = self.names.up(value)
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "apply"
                and value in call.args):
            return False
        up = self.names.up(call)
        while up is not None and not isinstance(up, LOOPS):
            up = self.names.up(up)
        return up is None

    def in_loop(self, node: ast.AST, reached: set[int]) -> bool:
        """``node`` runs in a loop, or in a function a loop reaches (:meth:`loop_reached`)."""
        up = self.names.up(node)
        while up is not None:
            if isinstance(up, LOOPS) or id(up) in reached:
                return True
            up = self.names.up(up)
        return False


def _callee_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _argument(call: ast.Call, params: list[str], param: str, skip: int) -> ast.AST | None:
    for k in call.keywords:
        if k.arg == param:
            return k.value
    if any(isinstance(a, ast.Starred) for a in call.args) or param not in params:
        return None
    i = params.index(param) - skip
    return call.args[i] if 0 <= i < len(call.args) else None


def _escapes(expr: ast.AST) -> bool:
    """A literal piece that climbs out of a folder or starts again at the root."""
    for x in ast.walk(expr):
        if isinstance(x, ast.Constant) and isinstance(x.value, str) and (".." in x.value or x.value.startswith("/")
                                                                          or x.value.startswith("~")):
            return True
    return False


def _binds(node: ast.AST) -> Iterator[tuple[str, str, ast.AST]]:
    """``(key, how, expr)`` of each name (or ``.attr`` of self) ``node`` binds (see :class:`Binding`)."""
    pairs: list[tuple[ast.AST, str, ast.AST]] = []
    if isinstance(node, ast.Assign):
        pairs = [(t, "value", node.value) for t in node.targets]
    elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
        pairs = [(node.target, "value", node.value)]
    elif isinstance(node, ast.AugAssign):
        pairs = [(node.target, "value", ast.BinOp(left=node.target, op=node.op, right=node.value))]
    elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        pairs = [(node.target, "iter", node.iter)]
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        pairs = [(i.optional_vars, "with", i.context_expr) for i in node.items if i.optional_vars is not None]
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs):
            yield a.arg, "param", node
        return
    for target, how, expr in pairs:
        for t in ast.walk(target):
            if isinstance(t, ast.Name):
                yield t.id, how, expr
            elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                yield "." + t.attr, how, expr
