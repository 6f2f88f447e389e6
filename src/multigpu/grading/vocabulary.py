"""What a conversion is known to call: the review's allowlist (:mod:`multigpu.grading.review`).

A source's names are read with Python's :mod:`ast` (nothing is run) and resolved through its
imports (:class:`Names`): each import, each call of a module's member by its full name
(``torch.optim.SGD``, ``horovod.torch.DistributedOptimizer``, ``builtins.len``), each method
called on an object by its name (``.step``, ``.backward``: the object's type is not known before
the run), each module member used as a value (``horovod.torch.Sum``) and each method a class
defines (``__getitem__``) is one :class:`Use`.

:func:`known` is every use of the conversions the course knows to be honest: the starter, the
reference solution and the honest variants (:data:`multigpu.grading.variants.HONEST`), plus
Horovod's documented training API (:data:`HOROVOD_API`) and Python's builtins that only compute
on values (:data:`PURE_BUILTINS`). A use outside it is a review flag: the vocabulary grows by
a reviewed honest conversion added to the variants, never by a rule that guesses.
"""

from __future__ import annotations

import ast
import builtins
import functools
from collections.abc import Iterator
from dataclasses import dataclass

#: Horovod's training API as its documentation teaches a conversion (horovod.torch): start,
#: who am I, the optimizer that averages the gradients, the broadcasts of the initial state (and of
#: a resumed epoch: ``broadcast_object``), the averaging of a metric. ``optimizer.synchronize()`` and ``skip_synchronize()`` are documented
#: too, for gradient clipping, and left out: between them a script can change the gradients it
#: steps with, so a person looks.
HOROVOD_API = frozenset(
    [f"call:horovod.torch.{n}" for n in ("init", "shutdown", "is_initialized", "rank", "size", "local_rank",
                                          "local_size", "cross_rank", "cross_size", "DistributedOptimizer",
                                          "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
                                          "allreduce", "join")]
    + [f"value:horovod.torch.{n}" for n in ("Average", "Sum", "Compression.none", "Compression.fp16")])
#: Builtins that compute on the values they are given and reach nothing else (no attribute by
#: name, no module, no file, no code): calls and values of these are known.
PURE_BUILTINS = frozenset(
    f"{kind}:builtins.{n}" for kind in ("call", "value")
    for n in ("abs", "all", "any", "bool", "dict", "divmod", "enumerate", "float", "format", "int", "isinstance",
              "len", "list", "max", "min", "print", "range", "reversed", "round", "set", "sorted", "str", "sum",
              "tuple", "zip",
              # the exceptions a script raises or catches
              *(n for n in dir(builtins) if isinstance(getattr(builtins, n), type)
                and issubclass(getattr(builtins, n), BaseException))))
#: Module globals every script has (not builtins, not imports).
MODULE_GLOBALS = frozenset({"__name__", "__file__", "__doc__"})


@dataclass(frozen=True)
class Use:
    """One use of a name: ``kind`` is ``import``, ``call``, ``method``, ``value`` or ``define``."""

    kind: str
    name: str
    node: ast.AST

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.name}"


def dotted(node: ast.AST) -> tuple[str, ...]:
    """``("torch", "optim", "SGD")`` for that attribute chain on a name (() for anything else)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return tuple(reversed(parts))
    return ()


class Names:
    """The names of one parsed source: what its imports bind, which functions and classes it
    defines, and (:meth:`uses`) every use of a name it makes."""

    def __init__(self, tree: ast.AST):
        self.tree = tree
        self.aliases: dict[str, str] = {}
        self.defined: set[str] = set()
        assigned: set[str] = set()
        self.annotations: set[int] = set()
        self.parent: dict[int, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parent[id(child)] = node
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                for a in node.names:
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defined.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                assigned.add(node.id)
            elif isinstance(node, ast.arg):
                assigned.add(node.arg)
            for note in _annotations(node):
                self.annotations.update(id(x) for x in ast.walk(note))
        #: names the script binds itself (variables, parameters): they shadow builtins
        self.variables = assigned - set(self.aliases) - self.defined

    def qualified(self, node: ast.AST) -> str:
        """The full name of a module member (``horovod.torch.allreduce``) or builtin
        (``builtins.len``) that ``node`` names; "" for anything else (a variable, an object's
        attribute, a function of the script)."""
        parts = dotted(node)
        if not parts:
            return ""
        root = parts[0]
        if root in self.aliases:
            return ".".join((self.aliases[root], *parts[1:]))
        if root not in self.variables and root not in self.defined and root not in MODULE_GLOBALS \
                and hasattr(builtins, root):
            return ".".join(("builtins", *parts))
        return ""

    def inner(self, node: ast.AST) -> bool:
        """Part of a longer attribute chain, or an annotation: judged with the whole, or not at all."""
        up = self.parent.get(id(node))
        return id(node) in self.annotations or (isinstance(up, ast.Attribute) and up.value is node)

    def uses(self) -> Iterator[Use]:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                yield from (Use("import", a.name, node) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = "." * node.level + (node.module or "")
                yield from (Use("import", f"{base}.{a.name}", node) for a in node.names)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    isinstance(self.parent.get(id(node)), ast.ClassDef):
                yield Use("define", node.name, node)
            elif isinstance(node, ast.Call):
                yield from self._call(node)
            elif isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load) \
                    and not self.inner(node) and not self._called(node):
                q = self.qualified(node)
                if q:
                    yield Use("value", q, node)

    def _called(self, node: ast.AST) -> bool:
        up = self.parent.get(id(node))
        return isinstance(up, ast.Call) and up.func is node

    def _call(self, call: ast.Call) -> Iterator[Use]:
        f = call.func
        q = self.qualified(f)
        if q:
            yield Use("call", q, call)
        elif isinstance(f, ast.Attribute):
            yield Use("method", f.attr, call)


def _annotations(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.arg) and node.annotation is not None:
        return [node.annotation]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
        return [node.returns]
    if isinstance(node, ast.AnnAssign):
        return [node.annotation]
    return []


def learn(sources: list[str]) -> frozenset[str]:
    """Every use (``kind:name``) the ``sources`` make."""
    return frozenset(u.key for text in sources for u in Names(ast.parse(text)).uses())


@functools.lru_cache(maxsize=1)
def known() -> frozenset[str]:
    """The vocabulary: the uses of the starter, the reference and every honest variant, Horovod's
    training API and the pure builtins (see the module doc)."""
    import tempfile
    from pathlib import Path

    from multigpu.core import layout
    from multigpu.grading import variants

    reference = layout.reference_solution(layout.course_root())
    sources = [variants.SOURCES["unconverted"].read_text(), reference.read_text()]  # the starter, the reference
    with tempfile.TemporaryDirectory() as tmp:
        sources += [variants.write(name, reference, Path(tmp) / f"{name}.py").read_text() for name in variants.HONEST]
    return learn(sources) | HOROVOD_API | PURE_BUILTINS
