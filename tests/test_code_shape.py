"""The code's shape (docs/architecture.md, "Code limits"): no function of src/servelab takes more
than 6 parameters or runs over 80 lines, and no module runs over 600 lines. A function that
needs more takes a context object (a measuring job's `MeasureJob`, a group of inputs as a small
frozen dataclass) or is split into its parts (a table of builders, a list of checks, one
function per report section)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "servelab"
MAX_PARAMETERS = 6
MAX_LINES = 80


def parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Parameters of a function as its callers see them: self and cls not counted, *args and
    **kwargs counted one each."""
    a = fn.args
    named = [x for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
    return len(named) + (a.vararg is not None) + (a.kwarg is not None)


def oversized(source: str, name: str) -> list[str]:
    """The functions of one module over the limits, as `name:line function (what)`."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        assert node.end_lineno is not None
        lines = node.end_lineno - node.lineno + 1
        n = parameters(node)
        if n > MAX_PARAMETERS:
            out.append(f"{name}:{node.lineno} {node.name} ({n} parameters)")
        if lines > MAX_LINES:
            out.append(f"{name}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_no_function_over_the_limits() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        found += oversized(path.read_text(encoding="utf-8"), path.relative_to(SRC).as_posix())
    assert found == [], "split these, or group their parameters:\n" + "\n".join(found)


def test_the_limits_are_counted_as_documented() -> None:
    """The check itself: seven parameters or 81 lines are over, self and six are not."""
    seven = "def f(a, b, c, d, e, f, *g):\n    pass\n"
    assert oversized(seven, "m.py") == ["m.py:1 f (7 parameters)"]
    six = "class C:\n    def f(self, a, b, c, d, e, f):\n        pass\n"
    assert oversized(six, "m.py") == []
    long = "def f():\n" + "    x = 1\n" * 80
    assert oversized(long, "m.py") == ["m.py:1 f (81 lines)"]
    assert oversized("def f():\n" + "    x = 1\n" * 79, "m.py") == []


MAX_MODULE_LINES = 600


def test_no_module_over_600_lines() -> None:
    """No module of src/servelab runs over 600 lines: a longer one is split by what its parts
    do (e.g. evidence/crate.py beside evidence/bundle.py, experiment/workload.py)."""
    long = {
        path.relative_to(SRC).as_posix(): n
        for path in sorted(SRC.rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"split these modules: {long}"
