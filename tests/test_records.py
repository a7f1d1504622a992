"""The records of the raw layout (servelab.store.records): each writes the bytes it reads, reads damage
as one line, and is the only way the code reads and writes its file; no file name of the raw
layout is spelled outside servelab.store.paths."""

from __future__ import annotations

import ast
import json
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servelab.errors import ServelabError
from servelab.store import paths as layout
from servelab.store.jsonio import dumps
from servelab.store.records import (
    CapacityRecord,
    CaptureRecord,
    DamagedRawData,
    LaunchRecord,
    PointRecord,
    Record,
    RunRecord,
    RuntimeRecord,
    WarmupRecord,
    WindowsRecord,
)

REPO = Path(__file__).resolve().parents[1]
RELEASE = REPO / "evidence" / "quickstart-cpu" / "v6" / "v6.tar.gz"

# (record type, a path of the release's raw data that holds one)
RECORDS: list[tuple[type[Record], str]] = [
    (PointRecord, "raw/max-num-seqs-1/rep01/c0001/point.json"),
    (WarmupRecord, "raw/max-num-seqs-1/warmup/point.json"),
    (RunRecord, "raw/max-num-seqs-1/run.json"),
    (LaunchRecord, "server/max-num-seqs-1/launch.json"),
    (CapacityRecord, "server/max-num-seqs-1/capacity.json"),
    (CaptureRecord, "profile/max-num-seqs-1/capture.json"),
    (WindowsRecord, "profile/max-num-seqs-1/windows.json"),
    (RuntimeRecord, "runtime/runtime.json"),
]


def released(rel: str) -> bytes:
    """A file of the committed release's experiment folder, as released."""
    with tarfile.open(RELEASE) as tar:
        member = next(m for m in tar.getmembers() if m.name.split("/", 1)[-1] == rel)
        data = tar.extractfile(member)
        assert data is not None
        return data.read()


@pytest.mark.parametrize(("record", "rel"), RECORDS, ids=[r.__name__ for r, _ in RECORDS])
def test_a_record_writes_the_bytes_it_reads(tmp_path: Path, record: type[Record], rel: str) -> None:
    """Read a released file through its record, write it back: the same bytes, and read again
    the same document and fields."""
    original = released(rel)
    src = tmp_path / "in" / rel
    src.parent.mkdir(parents=True)
    src.write_bytes(original)
    read = record.read(src)
    assert read.to_json() == json.loads(original)
    dest = tmp_path / "out" / rel
    read.write(dest)
    assert dest.read_bytes() == original
    again = record.read(dest)
    assert again == read
    assert record.from_json(json.loads(original), src) == read
    assert Path(rel).name == record.FILE


def test_the_typed_fields_read_the_document() -> None:
    point = PointRecord.from_json(
        json.loads(released(RECORDS[0][1])), Path("raw/max-num-seqs-1/rep01/c0001/point.json")
    )
    assert (point.server_config, point.repeat, point.concurrency) == ("max-num-seqs-1", 1, 1)
    assert point.status == "complete"
    assert isinstance(point.started_epoch_ns, int) and isinstance(point.finished_epoch_ns, int)
    launch = LaunchRecord.from_json(json.loads(released(RECORDS[3][1])), Path("launch.json"))
    assert launch.launch >= 1 and launch.args == launch.doc["args"]
    assert launch.node == launch.doc.get("node") and launch.ready_s == launch.doc["ready_s"]
    cap = CapacityRecord.from_json(json.loads(released(RECORDS[4][1])), Path("capacity.json"))
    assert cap.vllm_version == (cap.doc.get("version_endpoint") or cap.doc.get("version"))
    run = RunRecord.from_json(json.loads(released(RECORDS[2][1])), Path("run.json"))
    assert run.sequential == run.doc.get("sequential")


@pytest.mark.parametrize(
    ("record", "version"),
    [
        (PointRecord, 1),
        (RunRecord, 1),
        (CaptureRecord, 1),
        (WindowsRecord, 1),
        (LaunchRecord, None),
        (CapacityRecord, None),
        (RuntimeRecord, None),
    ],
)
def test_each_record_writes_its_own_format_version(
    tmp_path: Path, record: type[Record], version: int | None
) -> None:
    """A record's writer puts its own format version first (none for a file that carries
    none); the bytes are those of servelab.store.jsonio's writer, keys sorted, floats rounded."""
    assert record.FORMAT_VERSION == version
    built = record.new({"server_config": "a", "x": 0.1 + 0.2})
    assert built.doc.get("format_version") == version
    assert list(built.doc)[0] == ("format_version" if version is not None else "server_config")
    built.write(tmp_path / record.FILE)
    assert (tmp_path / record.FILE).read_text(encoding="utf-8") == dumps(built.doc)
    assert '"x": 0.3' in (tmp_path / record.FILE).read_text(encoding="utf-8")


DAMAGED = [
    (PointRecord, "{", "$: not valid JSON"),
    (
        PointRecord,
        '{"format_version": 1, "status": "complete", "server_config": "a", '
        '"repeat": 1, "concurrency": "8"}',
        "$.concurrency: '8' is not of type 'integer'",
    ),
    (
        PointRecord,
        '{"format_version": 1, "status": "complete", "server_config": "a", '
        '"repeat": 1, "concurrency": 8, "telemetry": {"cpu": []}}',
        "(the telemetry block, docs/raw-data.md)",
    ),
    (WarmupRecord, "[]", "$: a list, not a JSON object"),
    (RunRecord, '{"sequential": 3}', "$.sequential: 3 is not of type 'object'"),
    (LaunchRecord, '{"launch": "x"}', "$.launch: 'x' is not of type 'integer'"),
    (CapacityRecord, '{"version": 3}', "(schema capacity.schema.json)"),
    (CaptureRecord, '{"status": 1}', "re-run the profiling pass"),
    (WindowsRecord, '{"nvtx": 1, "windows": []}', "$.nvtx: 1 is not of type 'boolean'"),
    (RuntimeRecord, "nul", "re-run the runtime stage"),
]


@pytest.mark.parametrize(("record", "text", "says"), DAMAGED)
def test_damage_is_one_line_naming_file_and_field(
    tmp_path: Path, record: type[Record], text: str, says: str
) -> None:
    path = tmp_path / "raw" / "a" / record.FILE
    path.parent.mkdir(parents=True)
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DamagedRawData) as err:
        record.read(path)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{path}: $")
    assert says in line
    if text not in ("{", "nul"):  # a document that is JSON: from_json says the same
        with pytest.raises(DamagedRawData, match=re.escape(says)):
            record.from_json(json.loads(text), path)


def test_a_point_of_another_format_version_is_an_error_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / layout.POINT_FILE
    path.write_text('{"format_version": 2}', encoding="utf-8")
    with pytest.raises(ServelabError, match="point format_version 2 is not one this servelab"):
        PointRecord.read(path)


def test_resume_reads_the_status_leniently(tmp_path: Path) -> None:
    """The sweep's resume reads a point's status alone: a point.json that is not JSON is a point
    to measure again, not an error."""
    assert PointRecord.status_in(tmp_path) is None
    (tmp_path / layout.POINT_FILE).write_text("{", encoding="utf-8")
    assert PointRecord.status_in(tmp_path) is None
    PointRecord.new({"status": "complete"}).write(tmp_path / layout.POINT_FILE)
    assert PointRecord.status_in(tmp_path) == "complete"


# --- every reader goes through the records ---------------------------------------------------

# the record files' names, as paths.py defines them; and the ExperimentPaths methods that
# name one of those files
RECORD_FILES = tuple(r.FILE for r, _ in RECORDS)
CONSTANTS = {
    "POINT_FILE",
    "RUN_FILE",
    "LAUNCH_FILE",
    "CAPACITY_FILE",
    "CAPTURE_FILE",
    "WINDOWS_FILE",
    "RUNTIME_FILE",
    "FILE",
}
METHODS = {
    "point_files",
    "warmup_file",
    "warmup_files",
    "run",
    "run_files",
    "launch",
    "launch_files",
    "capacity",
    "capacity_files",
    "capture",
    "capture_files",
    "windows",
    "runtime_record",
}
READERS = {"read_json", "read_checked", "load", "loads", "read_text", "read_bytes", "open"}
OWNERS = {"servelab/store/paths.py", "servelab/store/records.py"}


def python_files(root: Path) -> Iterator[tuple[str, Path]]:
    """(name relative to its folder, path) of every Python file of src/servelab and scripts."""
    for path in sorted((root / "src").rglob("*.py")):
        yield path.relative_to(root / "src").as_posix(), path
    for path in sorted((root / "scripts").glob("*.py")):
        yield path.relative_to(root).as_posix(), path


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def names_a_raw_file(text: str) -> str | None:
    """The raw-layout file a string names as a path (a component of it), None when none."""
    for part in re.split(r"[/\\{}]", text):
        if part in layout.RAW_LAYOUT_FILES:
            return part
    return None


def spelled_names(source: str) -> Iterator[tuple[int, str]]:
    """(line, file name) for every string in `source` (not a docstring) that spells a
    raw-layout file name as a path or a path's part."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            name = names_a_raw_file(node.value)
            if name is not None:
                yield node.lineno, name


def smk_names(text: str) -> Iterator[tuple[int, str]]:
    """(line, file name) for every quoted string of a Snakemake file (comments left out) that
    spells a raw-layout file name."""
    for lineno, line in enumerate(text.splitlines(), 1):
        code = re.sub(r"#[^\"']*$", "", line)
        if code.lstrip().startswith("#"):
            continue
        for quoted in re.findall(r"\"([^\"]*)\"|'([^']*)'", code):
            name = names_a_raw_file("".join(quoted))
            if name is not None:
                yield lineno, name


def spelled_outside_paths(root: Path) -> list[str]:
    found = [
        f"{name}:{line}: {file}"
        for name, path in python_files(root)
        if name != "servelab/store/paths.py"
        for line, file in spelled_names(path.read_text(encoding="utf-8"))
    ]
    smk = [root / "Snakefile", *sorted((root / "rules").glob("*.smk"))]
    found += [
        f"{path.relative_to(root).as_posix()}:{line}: {file}"
        for path in smk
        if path.is_file()
        for line, file in smk_names(path.read_text(encoding="utf-8"))
    ]
    return found


def _mentions(node: ast.AST, tainted: set[str]) -> bool:
    """Whether an expression names a record's file: a literal, a constant of CONSTANTS, an
    ExperimentPaths method of METHODS, or a variable bound from one."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            if any(part in RECORD_FILES for part in re.split(r"[/\\{}]", sub.value)):
                return True
        if isinstance(sub, ast.Attribute) and (
            sub.attr in CONSTANTS
            or (sub.attr in METHODS and "paths" in ast.unparse(sub.value).lower())
        ):
            return True
        if isinstance(sub, ast.Name) and (sub.id in CONSTANTS or sub.id in tainted):
            return True
    return False


def bypassing_reads(source: str) -> list[int]:
    """Lines that read a record's file other than through its record type: read_json,
    read_checked, json.load(s), read_text, read_bytes or open on a path that names it."""
    tree = ast.parse(source)
    tainted: set[str] = set()
    for _ in range(2):  # names bound from names bound from a file's name
        for node in ast.walk(tree):
            value, targets = None, []
            if isinstance(node, ast.Assign):
                value, targets = node.value, node.targets
            elif isinstance(node, ast.For | ast.comprehension):
                value, targets = node.iter, [node.target]
            if value is not None and _mentions(value, tainted):
                tainted |= {
                    n.id
                    for t in targets
                    for n in ([t] if isinstance(t, ast.Name) else getattr(t, "elts", []))
                    if isinstance(n, ast.Name)
                }
    lines = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name not in READERS:
            continue
        operands = [*node.args, *(k.value for k in node.keywords)]
        if isinstance(func, ast.Attribute) and name in ("read_text", "read_bytes", "open"):
            operands.append(func.value)
        if name == "read_checked" or any(_mentions(op, tainted) for op in operands):
            lines.add(node.lineno)
    return sorted(lines)


def reads_outside_records(root: Path) -> list[str]:
    return [
        f"{name}:{line}"
        for name, path in python_files(root)
        if name not in OWNERS
        for line in bypassing_reads(path.read_text(encoding="utf-8"))
    ]


def test_no_raw_layout_file_name_is_spelled_outside_paths() -> None:
    """servelab.store.paths names every file of the raw layout; the code, the scripts and the rules
    take the names from there (docstrings and comments may mention them)."""
    found = spelled_outside_paths(REPO)
    assert found == [], "raw-layout file names spelled outside paths.py:\n" + "\n".join(found)


def test_every_reader_goes_through_the_records() -> None:
    """Only servelab.store.records reads a record's file: elsewhere no read_json, read_checked,
    json.load(s), read_text, read_bytes or open on a path that names one."""
    found = reads_outside_records(REPO)
    assert found == [], "reads that bypass servelab.store.records:\n" + "\n".join(found)


# --- the checkers themselves -------------------------------------------------------------------

BYPASSING = '''
import json
from servelab.store.jsonio import read_json

def hosts(exp_dir):
    """launch.json of every configuration"""
    for lj in sorted(exp_dir.glob("server/*/launch.json")):
        yield read_json(lj).get("node")

def version(paths, sc):
    return json.loads(paths.capacity(sc).read_text())

def resume(pdir):
    pj = pdir / POINT_FILE
    return json.loads(pj.read_text(encoding="utf-8"))

def status(path):
    return read_checked(path, "run")
'''

THROUGH_RECORDS = '''
from servelab.store.records import LaunchRecord

def hosts(paths):
    """launch.json of every configuration"""
    for lj in paths.launch_files():
        yield LaunchRecord.read(lj).node

def bench(bj):
    return read_json(bj / "benchmark.json")
'''


def test_the_checkers_find_a_bypassing_reader() -> None:
    assert bypassing_reads(BYPASSING) == [8, 11, 15, 18]
    assert [name for _, name in spelled_names(BYPASSING)] == ["launch.json"]
    assert bypassing_reads(THROUGH_RECORDS) == []
    assert list(spelled_names(THROUGH_RECORDS)) == []
    smk = 'rule x:\n    output:\n        f"{EXP}/raw/{{sc}}/run.json",  # run.json\n# "run.json"\n'
    assert list(smk_names(smk)) == [(3, "run.json")]


def _fields(record: type[Record]) -> dict[str, Any]:
    return {"FILE": record.FILE, "SCHEMA": record.SCHEMA, "VERSION": record.FORMAT_VERSION}


def test_records_name_their_files_from_paths() -> None:
    assert [_fields(r)["FILE"] for r, _ in RECORDS] == [
        layout.POINT_FILE,
        layout.POINT_FILE,
        layout.RUN_FILE,
        layout.LAUNCH_FILE,
        layout.CAPACITY_FILE,
        layout.CAPTURE_FILE,
        layout.WINDOWS_FILE,
        layout.RUNTIME_FILE,
    ]
