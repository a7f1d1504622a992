"""The import structure of src/servelab: no cycles between modules, and every import goes down
the layers.

Every import counts, wherever it stands (module level, inside a function, under
`if TYPE_CHECKING:`): a dependency deferred to run time is still a dependency.

A module belongs to the unit named right after `servelab.` (servelab.analysis.core: analysis;
`servelab` alone is the package's __init__.py, the public API for notebooks). A module may
import modules of its own unit, of the units listed after its own in its layer, and of lower
layers; never a unit listed before it, never a higher layer (docs/architecture.md). Imports of the package itself for its `__version__` are no dependency
(importing any submodule loads the package first) and are left out.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

# Highest layer first. Within a layer, a unit may import the units listed after it.
LAYERS: dict[str, tuple[str, ...]] = {
    "entry": ("servelab", "cli", "smk", "dataframes"),
    "stages": (
        "campaign",
        "confirm",
        "site",
        "reproduce",
        "evidence",
        "summary",
        "measure",
        "profile",
        "analysis",
    ),
    "services": (
        "workload",
        "launch",
        "telemetry",
        "config",
        "env",
        "metrics",
        "client",
        "hostfacts",
    ),
    "base": (
        "job",
        "store",
        "experiment",
        "claims_syntax",
        "render",
        "redact",
        "design",
        "errors",
        "documents",
    ),
}
ORDER = {unit: i for i, unit in enumerate(u for units in LAYERS.values() for u in units)}
RANK = {unit: i for i, units in enumerate(LAYERS.values()) for unit in units}
LAYER_OF = {unit: layer for layer, units in LAYERS.items() for unit in units}
NO_DEPENDENCY = {"__version__"}  # names of the package itself (`from servelab import ...`)

SRC = Path(__file__).resolve().parents[1] / "src"


def module_name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(src: Path = SRC) -> dict[str, Path]:
    return {module_name(p, src): p for p in sorted((src / "servelab").rglob("*.py"))}


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imports(
    module: str, source: str, known: set[str], is_package: bool = False
) -> Iterator[tuple[str, int]]:
    """(imported servelab module, line) for every import in `source`, wherever it stands.
    `from P import x` imports the module P.x when there is one, else P itself."""
    here = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "servelab":
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, up level - 1
                base = here.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] != "servelab":
                continue
            names = [a.name for a in node.names]
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in known]
            for sub in subs:
                yield sub, node.lineno
            rest = [n for n in names if f"{target}.{n}" not in known]
            if target == "servelab":
                rest = [n for n in rest if n not in NO_DEPENDENCY]
            if rest:
                yield target, node.lineno


def graph(src: Path = SRC) -> dict[str, dict[str, int]]:
    """module -> {imported module: first line that imports it}"""
    mods = modules(src)
    known = set(mods)
    out: dict[str, dict[str, int]] = {}
    for mod, path in mods.items():
        edges: dict[str, int] = {}
        text = path.read_text(encoding="utf-8")
        for target, line in imports(mod, text, known, path.name == "__init__.py"):
            if target != mod:
                edges.setdefault(target, line)
        out[mod] = dict(sorted(edges.items(), key=lambda kv: kv[1]))
    return out


def cycles(edges: Mapping[str, Mapping[str, int]]) -> list[list[str]]:
    """One cycle (a path that returns to its start) per strongly connected component of more
    than one module (Tarjan), each starting at its component's first module by name."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    out = []
    for comp in sorted(comps, key=min):
        start = min(comp)
        # the shortest way back to `start` inside the component (breadth first)
        prev: dict[str, str] = {}
        todo = [start]
        found = None
        while todo and found is None:
            nxt = []
            for v in todo:
                for w in sorted(edges.get(v, {})):
                    if w == start:
                        found = v
                        break
                    if w in comp and w not in prev:
                        prev[w] = v
                        nxt.append(w)
                if found is not None:
                    break
            todo = nxt
        assert found is not None
        path = [found]
        while path[-1] != start:
            path.append(prev[path[-1]])
        out.append([*reversed(path), start])
    return out


def violations(edges: Mapping[str, Mapping[str, int]]) -> list[str]:
    out = []
    for mod, targets in sorted(edges.items()):
        for target, line in targets.items():
            a, b = unit(mod), unit(target)
            if a == b or a not in RANK or b not in RANK:
                continue
            if RANK[b] < RANK[a]:
                why = f"upward: {LAYER_OF[a]} imports {LAYER_OF[b]}"
            elif RANK[b] == RANK[a] and ORDER[b] < ORDER[a]:
                why = f"same layer ({LAYER_OF[a]}): {b} is listed before {a}"
            else:
                continue
            out.append(f"{mod} (line {line}) imports {target}: {why}")
    return out


EDGES = graph()


def test_every_module_has_a_layer() -> None:
    assert [m for m in EDGES if unit(m) not in RANK] == []
    assert len(RANK) == sum(len(units) for units in LAYERS.values())  # no unit in two layers


def test_no_import_cycles() -> None:
    found = [" -> ".join(c) for c in cycles(EDGES)]
    assert found == [], "import cycles:\n" + "\n".join(found)


def test_imports_go_down_the_layers() -> None:
    found = violations(EDGES)
    assert found == [], f"{len(found)} imports against the layers:\n" + "\n".join(found)


def test_the_analysis_reads_server_logs_without_process_control() -> None:
    """The analysis and the reproduction read a server's log with servelab.launch.serverlog; they never
    import servelab.launch.server, which starts and stops servers."""
    found = [
        f"{mod} (line {line}) imports servelab.launch.server"
        for mod, targets in sorted(EDGES.items())
        if unit(mod) in ("analysis", "reproduce", "evidence", "summary")
        for target, line in targets.items()
        if target == "servelab.launch.server"
    ]
    assert found == []


# --- the checker itself -----------------------------------------------------------------------

SOURCE = """
import os
import servelab.paths
from servelab import __version__, jsonio
from servelab.analysis import core, Dataset
from . import sibling
from .. import errors
from ..telemetry.summary import COLUMNS
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from servelab.config import load

def f():
    from servelab.client import RequestRecord

class C:
    def m(self):
        import servelab.render as r
"""
KNOWN = {
    "servelab",
    "servelab.paths",
    "servelab.jsonio",
    "servelab.analysis",
    "servelab.analysis.core",
    "servelab.errors",
    "servelab.telemetry.summary",
    "servelab.config",
    "servelab.client",
    "servelab.render",
    "servelab.profile.sibling",
}


def test_the_checker_finds_every_import_wherever_it_stands() -> None:
    found = sorted(imports("servelab.profile.core", SOURCE, KNOWN))
    assert found == [
        ("servelab.analysis", 5),  # Dataset: a name of the package
        ("servelab.analysis.core", 5),
        ("servelab.client", 14),
        ("servelab.config", 11),
        ("servelab.errors", 7),
        ("servelab.jsonio", 4),  # __version__ is no dependency
        ("servelab.paths", 3),
        ("servelab.profile.sibling", 6),
        ("servelab.render", 18),
        ("servelab.telemetry.summary", 8),
    ]
    # in a package's __init__.py, "." is the package itself
    assert list(imports("servelab.profile", "from .core import x", {"servelab.profile.core"}, True))
    assert list(imports("servelab.cli", "from servelab import points", KNOWN)) == [("servelab", 1)]


def test_the_checker_reports_cycles_and_layers() -> None:
    edges = {
        "servelab.cli": {"servelab.analysis.core": 1},
        "servelab.analysis.core": {"servelab.analysis.load": 2, "servelab.errors": 3},
        "servelab.analysis.load": {"servelab.client": 4},
        "servelab.client": {"servelab.analysis.core": 5, "servelab.summary": 6},
        "servelab.errors": {},
        "servelab.summary": {"servelab.errors": 7, "servelab.measure.sweep": 8},
        "servelab.measure.sweep": {"servelab.summary": 9},
    }
    assert cycles(edges) == [
        [
            "servelab.analysis.core",
            "servelab.analysis.load",
            "servelab.client",
            "servelab.analysis.core",
        ],
        ["servelab.measure.sweep", "servelab.summary", "servelab.measure.sweep"],
    ]
    assert violations(edges) == [
        "servelab.client (line 5) imports servelab.analysis.core: upward: services imports stages",
        "servelab.client (line 6) imports servelab.summary: upward: services imports stages",
        "servelab.measure.sweep (line 9) imports servelab.summary: same layer (stages): summary is "
        "listed before measure",
    ]


def test_module_names(tmp_path: Path) -> None:
    for name in ("servelab/__init__.py", "servelab/a/__init__.py", "servelab/a/b.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert set(modules(tmp_path)) == {"servelab", "servelab.a", "servelab.a.b"}
    assert [unit(m) for m in sorted(modules(tmp_path))] == ["servelab", "a", "a"]
