"""The code's shape (docs/architecture.md, "Code limits"): functions of src/servelab that take
more than 6 parameters or run over 80 lines, and modules over 600 lines. They are prompts to look
(are these parameters one thing? is this module two concepts?), not failures: the test run prints
them at its end (conftest.py), and tests/test_code_shape.py checks only that they are counted as
documented."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "servelab"
MAX_PARAMETERS = 6
MAX_LINES = 80
MAX_MODULE_LINES = 600


# generated modules: their size follows what they are generated from
GENERATED = {"documents/declared.py"}


def parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Parameters of a function as its callers see them: self and cls not counted, *args and
    **kwargs counted one each."""
    a = fn.args
    named = [x for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
    return len(named) + (a.vararg is not None) + (a.kwarg is not None)


def oversized(source: str, name: str) -> list[str]:
    """The functions of one module over the limits, and the module itself when it is, as
    `name:line function (what)` and `name (N lines)`."""
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
    if (n := len(source.splitlines())) > MAX_MODULE_LINES:
        out.append(f"{name} ({n} lines)")
    return out


def prompts(src: Path = SRC) -> list[str]:
    """Every function and module of the package over a limit."""
    found = []
    for path in sorted(src.rglob("*.py")):
        if path.relative_to(src).as_posix() in GENERATED:
            continue
        found += oversized(path.read_text(encoding="utf-8"), path.relative_to(src).as_posix())
    return found
