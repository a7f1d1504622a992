"""The analysis reads a run once: only the dataset (servelab.analysis.dataset.load_dataset,
and the readers it calls) opens the run's raw files; every table, verdict and section is
computed from what it read. Modules that compare one run with another read those runs'
records themselves, each named below with why."""

from __future__ import annotations

import ast
from pathlib import Path

ANALYSIS = Path(__file__).resolve().parents[1] / "src" / "servelab" / "analysis"

# calls that open a run's files: the builtins, the JSON and record readers, the raw-data
# readers, and the listings of a run's files
READERS = frozenset(
    {
        "open",
        "read_text",
        "read_bytes",
        "read_json",
        "read_raw",
        "read_if_present",
        "read",
        "records",
        "load_points",
        "read_search",
        "run_canaries",
        "launch_files",
        "run_files",
        "point_files",
        "capacity_files",
        "search_files",
    }
)
ALLOWED = {
    "dataset.py": "the dataset: the run's points and the records beside them, read once",
    "search_records.py": "read_search, which load_dataset calls for each search.json",
    "engine_diff.py": "launches_of: two runs' launch.json set side by side (a reproduction, "
    "the history, the summary); within an analysis, the dataset's",
    "hostspeed.py": "read_host_speed: a run's or a release's canaries, for the comparisons of "
    "two runs (a reproduction, the history)",
    "peers.py": "read_point: another tool's result files of one point, which load_dataset (and "
    "dataframes, and a comparison's setup facts) call for each point folder of a tree",
    "clients.py": "run_clients: each client.json of client.cross_check's tools (their command, "
    "CPU and load window), beside the tools' trees it reads through load_dataset; for a run "
    "handed servelab's schedule, that schedule (arrivals/) and the run's send times again",
}


def reads(path: Path, root: Path = ANALYSIS) -> list[str]:
    """The calls of READERS in one module, as `name:line call` (`name` relative to `root`)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name in READERS:
                out.append(f"{path.relative_to(root).as_posix()}:{node.lineno} {name}")
    return out


def test_only_the_dataset_reads_the_raw_files() -> None:
    found = [r for p in sorted(ANALYSIS.rglob("*.py")) for r in reads(p)]
    outside = [r for r in found if r.split(":")[0] not in ALLOWED]
    assert outside == [], "read these through the Dataset (analysis/dataset.py):\n" + "\n".join(
        outside
    )
    # the list is alive: each module it excuses still reads
    assert {r.split(":")[0] for r in found} == set(ALLOWED)


def test_a_read_is_found(tmp_path: Path) -> None:
    """The check itself: a module that opens a file is named, with the line."""
    (tmp_path / "x.py").write_text(
        "import json\n\ndef f(p):\n    return json.loads(p.read_text())\n"
    )
    assert reads(tmp_path / "x.py", tmp_path) == ["x.py:4 read_text"]
