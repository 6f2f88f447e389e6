"""The package stays readable: no module over 400 lines (data tables excepted, each named below with
its reason), no function over 60 lines, no private name (``_x``) of the package used outside the
module or the object that owns it. Each check walks ``src/multigpu`` with ``ast`` and names every
offender."""

from __future__ import annotations

import ast
from pathlib import Path

import multigpu

PACKAGE = Path(multigpu.__file__).parent
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
#: Modules allowed past MAX_MODULE_LINES, relative to the package, each with its reason.
DATA_TABLES: dict[str, str] = {}
#: Private-looking names that are public API of the standard library (namedtuple's methods).
PUBLIC_UNDERSCORE = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def where(path: Path, line: int | None = None) -> str:
    name = str(path.relative_to(PACKAGE))
    return f"{name}:{line}" if line else name


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in PUBLIC_UNDERSCORE


def long_module(path: Path, name: str) -> str | None:
    """``name: N lines`` where the module at ``path`` is too long and not a listed data table."""
    lines = len(path.read_text().splitlines())
    return f"{name}: {lines} lines" if lines > MAX_MODULE_LINES and name not in DATA_TABLES else None


def long_modules() -> list[str]:
    return [found for path in modules() if (found := long_module(path, where(path)))]


def long_functions(tree: ast.AST, path: Path) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                found.append(f"{where(path, node.lineno)} {node.name}: {lines} lines")
    return found


def outside_modules(tree: ast.AST) -> set[str]:
    """Names bound in this module to modules from outside the package (``os``, ``argparse``): their
    private names are theirs, not the package's."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if not a.name.startswith("multigpu")}
        elif isinstance(node, ast.ImportFrom) and not (node.module or "").startswith("multigpu") and not node.level:
            names |= {a.asname or a.name for a in node.names}
    return names


def private_uses(tree: ast.AST, path: Path) -> list[str]:
    """``from multigpu.x import _y``, ``import multigpu.x._y``, and ``obj._y`` on anything but
    ``self``, ``cls`` or a module from outside the package."""
    found = []
    outside = outside_modules(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and ((node.module or "").startswith("multigpu") or node.level):
            dotted = (node.module or "").split(".")
            names = [a.name for a in node.names]
            found += [f"{where(path, node.lineno)} from {node.module} import {n}"
                      for n in names if private(n) or any(private(part) for part in dotted)]
        elif isinstance(node, ast.Import):
            found += [f"{where(path, node.lineno)} import {a.name}" for a in node.names
                      if a.name.startswith("multigpu") and any(private(part) for part in a.name.split("."))]
        elif isinstance(node, ast.Attribute) and private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value  # nn.modules.conv._ConvNd: the name the chain starts from
            owner = root.id if isinstance(root, ast.Name) else None
            if owner not in ("self", "cls") and owner not in outside:
                found.append(f"{where(path, node.lineno)} {ast.unparse(node)}")
    return found


def test_no_module_is_over_400_lines_except_the_data_tables():
    assert not long_modules(), "split these modules by job (or, for a data table, list it in DATA_TABLES with why):\n" + \
        "\n".join(long_modules())
    for name, reason in DATA_TABLES.items():
        assert (PACKAGE / name).exists() and reason, f"DATA_TABLES names {name}, which is gone or has no reason"


def test_no_function_is_over_60_lines():
    found = [f for path in modules() for f in long_functions(ast.parse(path.read_text()), path)]
    assert not found, "shorten these functions into named steps:\n" + "\n".join(found)


def test_no_private_name_is_used_outside_its_module_or_object():
    found = [u for path in modules() for u in private_uses(ast.parse(path.read_text()), path)]
    assert not found, "make these names public, or keep their use inside their module or class:\n" + "\n".join(found)


def test_the_checks_find_what_they_look_for(tmp_path):
    """Each check names an offender in a small made-up module (so a check that finds nothing is not
    passing by accident)."""
    source = "\n".join([
        "import os",
        "from multigpu.running import _worker",
        "from multigpu.core.data import _helper",
        "def long():",
        *["    x = 1"] * MAX_FUNCTION_LINES,
        "def short(obj):",
        "    os._exit(0)",
        "    return obj._secret, self_like._x, os.path._joinrealpath",
    ])
    written = tmp_path / "made_up.py"
    written.write_text(source + "\n#" * (MAX_MODULE_LINES - source.count("\n")))
    assert long_module(written, "made_up.py") == f"made_up.py: {MAX_MODULE_LINES + 1} lines"
    written.write_text(source)
    assert long_module(written, "made_up.py") is None
    path = PACKAGE / "made_up.py"
    tree = ast.parse(source)
    assert long_functions(tree, path) == [f"made_up.py:4 long: {MAX_FUNCTION_LINES + 1} lines"]
    uses = private_uses(tree, path)
    assert uses == ["made_up.py:2 from multigpu.running import _worker",
                    "made_up.py:3 from multigpu.core.data import _helper",
                    f"made_up.py:{MAX_FUNCTION_LINES + 7} obj._secret",
                    f"made_up.py:{MAX_FUNCTION_LINES + 7} self_like._x"], uses
