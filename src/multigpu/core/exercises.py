"""What the notebooks' exercise tests share: whether an answer is the learner's own.

The package holds its own version of most exercises' answers (``multigpu.labs.lab5.memory.zero_bytes``
for Lab 5's Exercise 1, ...), because later cells need a working one whatever the learner wrote.
The notebook imports those modules, so an answer could simply call the course's version and pass
every test. :func:`borrowed` reads the learner's answer for that: it fails an answer that is the
course's version, or whose code calls it, directly or through the learner's own functions and
classes it uses.

It reads the compiled code, not the cell's text: every name the answer's code (nested functions
included) refers to is looked up where the answer runs, as Python would look it up (a global, a
module's attribute, a closure's cell, a default argument), so ``from ... import zero_bytes as z``
and ``z = memory.zero_bytes`` are caught as well as ``memory.zero_bytes``. A function or class the
learner defined in the same place is read the same way; the course's other functions are not
entered (an answer may use the helpers the exercise gives it). It catches the delegation a learner
writes, not code written to hide one: lab points are formative (the design's trust model).
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Iterator
from typing import Any


def borrowed(answer: Any, *versions: Any) -> str:
    """Why ``answer`` is not the learner's own: it is one of ``versions`` (the course's answers to
    the same exercise) or calls one; "" when it is its own. Starts with what to change."""
    hit = found_in(answer, versions)
    if hit is None:
        return ""
    name = getattr(unwrap(answer), "__name__", "") or "your answer"
    name = "your answer" if name == "<lambda>" else name
    verb = "is" if hit is unwrap(answer) else "uses"
    return (f"write {name} yourself: it {verb} {label(hit)}, the course's own answer to this exercise "
            "(there for the cells after it)")


def label(obj: Any) -> str:
    """``module.name`` as a notebook imports it: ``memory.zero_bytes``."""
    module = getattr(obj, "__module__", "") or ""
    return f"{module.rsplit('.', 1)[-1]}.{getattr(obj, '__qualname__', obj)}"


def unwrap(obj: Any) -> Any:
    """The function behind a bound method, a static or class method, a decorator's wrapper."""
    while True:
        if isinstance(obj, (types.MethodType, staticmethod, classmethod)):
            obj = obj.__func__
        elif callable(obj) and hasattr(obj, "__wrapped__"):
            obj = inspect.unwrap(obj)
        else:
            return obj


def same(obj: Any, version: Any) -> bool:
    """``obj`` is ``version``, a copy of its code, or a class built on it."""
    if obj is version:
        return True
    code = getattr(obj, "__code__", None)
    if code is not None and code is getattr(version, "__code__", None):
        return True
    return inspect.isclass(obj) and inspect.isclass(version) and version in obj.__mro__


def found_in(answer: Any, versions: tuple[Any, ...]) -> Any:
    """The first of ``versions`` that ``answer`` is or reaches (see the module's docstring), or None."""
    targets = [unwrap(v) for v in versions]
    start = unwrap(answer)
    home = getattr(start, "__module__", None)
    seen: set[int] = set()
    todo = [start]
    while todo:
        obj = unwrap(todo.pop())
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        hit = next((v for v in targets if same(obj, v)), None)
        if hit is not None:
            return hit
        if isinstance(obj, functools.partial):
            todo += [obj.func, *obj.args, *obj.keywords.values()]
        elif isinstance(obj, (dict, list, tuple, set, frozenset)):
            todo += list(obj.values() if isinstance(obj, dict) else obj)
        elif home is not None and getattr(obj, "__module__", None) == home:
            todo += list(referenced(obj))
    return None


def referenced(obj: Any) -> Iterator[Any]:
    """What a learner's function or class refers to: for a function, the objects its code's names
    resolve to (and the attributes of modules along the way), its closure and its defaults; for a
    class, its bases and what its own methods and attributes hold."""
    if inspect.isclass(obj):
        yield from obj.__bases__
        yield from vars(obj).values()
        return
    code = getattr(obj, "__code__", None)
    if not isinstance(code, types.CodeType):
        return
    names = set().union(*(c.co_names for c in code_objects(code)))
    scope = getattr(obj, "__globals__", {})
    found = {id(v): v for v in (scope[n] for n in names if n in scope)}
    modules = [m for m in found.values() if inspect.ismodule(m)]
    while modules:  # module.attribute chains: memory.zero_bytes, multigpu.labs.lab5.memory.zero_bytes
        module = modules.pop()
        for n in names:
            value = attribute(module, n)
            if value is not None and id(value) not in found:
                found[id(value)] = value
                if inspect.ismodule(value):
                    modules.append(value)
    yield from found.values()
    yield from (cell.cell_contents for cell in obj.__closure__ or () if cell_filled(cell))
    yield from obj.__defaults__ or ()
    yield from (obj.__kwdefaults__ or {}).values()


def attribute(module: types.ModuleType, name: str) -> Any:
    """``module.name``, or None where it has none (or a lazy attribute fails to load)."""
    try:
        return getattr(module, name, None)
    except Exception:  # a module's __getattr__ may import, and fail, on any name
        return None


def code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    """A code object and every one nested in it (inner functions, lambdas, comprehensions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from code_objects(const)


def cell_filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a closure variable not assigned yet
        return False
    return True
