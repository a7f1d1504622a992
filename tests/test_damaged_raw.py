"""Damaged raw data gives one line naming the file, the field and what to do; exit 2, no
traceback, nothing written; `servelab analyze --skip-damaged` leaves damaged points out and
lists them."""

from __future__ import annotations

import csv
import gzip
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from analysis_fixtures import servelab_tree

from servelab.cli import main

SPEC = {"a100": {1: [(100.0, 10.0)] * 2, 8: [(400.0, 20.0)] * 2}}
TODO = "re-run the sweep of a100, or pass --skip-damaged to servelab analyze"


def tree(tmp_path: Path) -> Path:
    return servelab_tree(tmp_path / "exp", SPEC)


def point_dir(exp: Path, rep: int = 1, conc: int = 8) -> Path:
    return exp / "raw" / "a100" / f"rep{rep:02d}" / f"c{conc:04d}"


def edit_point(exp: Path, change: Callable[[dict[str, Any]], None], rep: int = 1) -> Path:
    path = point_dir(exp, rep) / "point.json"
    point = json.loads(path.read_text())
    change(point)
    path.write_text(json.dumps(point))
    return path


def edit_rows(exp: Path, change: Callable[[list[str]], None]) -> Path:
    path = point_dir(exp) / "requests.jsonl.gz"
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    change(lines)
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return path


def truncate_gzip(exp: Path, rep: int = 1) -> Path:
    path = point_dir(exp, rep) / "requests.jsonl.gz"
    data = path.read_bytes()
    assert len(data) > 300
    path.write_bytes(data[:300])
    return path


def concurrency_eight(exp: Path, rep: int = 1) -> Path:
    return edit_point(exp, lambda p: p.update(concurrency="eight"), rep)


def not_json(exp: Path) -> Path:
    path = point_dir(exp) / "point.json"
    path.write_text('{"format_version": 1, "status": ')
    return path


def missing_repeat(exp: Path) -> Path:
    return edit_point(exp, lambda p: p.pop("repeat"))


def wrong_row_type(exp: Path) -> Path:
    def change(lines: list[str]) -> None:
        row = json.loads(lines[2])
        row["output_tokens"] = "100"
        lines[2] = json.dumps(row)

    return edit_rows(exp, change)


def truncated_line(exp: Path) -> Path:
    def change(lines: list[str]) -> None:
        lines[-1] = lines[-1][: len(lines[-1]) // 2]

    return edit_rows(exp, change)


# damage -> the expected line (a regex), the file named and the field
CASES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "truncated gzip": (
        truncate_gzip,
        r"line \d+: truncated or corrupt gzip stream \(Compressed file ended before the "
        r"end-of-stream marker was reached\)",
    ),
    "point.json not JSON": (
        not_json,
        re.escape("$: not valid JSON (Expecting value at line 1)"),
    ),
    "concurrency is a string": (
        concurrency_eight,
        re.escape("$.concurrency: 'eight' is not of type 'integer' (schema point.schema.json)"),
    ),
    "required field missing": (
        missing_repeat,
        re.escape("$.repeat: required field missing (schema point.schema.json)"),
    ),
    "requests row of the wrong type": (
        wrong_row_type,
        re.escape("line 3: $.output_tokens: '100' is not an integer"),
    ),
    "truncated JSON line": (
        truncated_line,
        r"line 16: not valid JSON \(Unterminated string starting at: line 1 column \d+\)"
        r"|line 16: not valid JSON \(Expecting [^)]*\)",
    ),
}


def one_line(err: str, path: Path, field: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert re.fullmatch(
        rf"servelab: {re.escape(str(path))}: (?:{field}); {re.escape(TODO)}", lines[0]
    ), lines[0]


@pytest.mark.parametrize("kind", sorted(CASES))
def test_analyze_names_file_and_field(tmp_path: Path, capsys: Any, kind: str) -> None:
    damage, field = CASES[kind]
    exp = tree(tmp_path)
    path = damage(exp)
    out = tmp_path / "analysis"
    assert main(["analyze", str(exp), "--out", str(out), "--no-figures"]) == 2
    got = capsys.readouterr()
    assert "Traceback" not in got.out + got.err
    assert got.out == ""
    one_line(got.err, path, field)
    assert not out.exists()  # nothing written, not even the folder


@pytest.mark.parametrize("kind", ["truncated gzip", "concurrency is a string"])
def test_analyze_leaves_an_existing_output_folder_as_it_was(
    tmp_path: Path, capsys: Any, kind: str
) -> None:
    exp = tree(tmp_path)
    out = tmp_path / "analysis"
    assert main(["analyze", str(exp), "--out", str(out), "--no-figures"]) == 0
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    CASES[kind][0](exp)
    capsys.readouterr()
    assert main(["analyze", str(exp), "--out", str(out), "--no-figures"]) == 2
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before


@pytest.mark.parametrize("kind", sorted(CASES))
def test_summary_names_file_and_field(tmp_path: Path, capsys: Any, kind: str) -> None:
    damage, field = CASES[kind]
    exp = tree(tmp_path)
    path = damage(exp)
    assert main(["summary", str(exp)]) == 2
    got = capsys.readouterr()
    assert "Traceback" not in got.out + got.err
    one_line(got.err, path, field)


@pytest.mark.parametrize("kind", ["truncated gzip", "concurrency is a string"])
def test_compare_names_file_and_field(tmp_path: Path, capsys: Any, kind: str) -> None:
    damage, field = CASES[kind]
    ref = servelab_tree(tmp_path / "ref", SPEC)
    exp = tree(tmp_path)
    path = damage(exp)
    out = tmp_path / "reproduction"
    assert main(["compare", str(ref), str(exp), "--out", str(out)]) == 2
    got = capsys.readouterr()
    assert "Traceback" not in got.out + got.err
    one_line(got.err, path, field)
    assert not out.exists()


def test_skip_damaged_leaves_points_out_and_lists_them(tmp_path: Path, capsys: Any) -> None:
    exp = tree(tmp_path)
    gz = truncate_gzip(exp, rep=1)
    pj = concurrency_eight(exp, rep=2)
    out = tmp_path / "analysis"
    argv = ["analyze", str(exp), "--out", str(out), "--no-figures", "--skip-damaged"]
    assert main(argv) == 0
    got = capsys.readouterr()
    assert "Traceback" not in got.out + got.err
    assert got.err == ""
    assert "  skipped 2 damaged point(s) (listed in report.md):" in got.out
    for rel, path, field in [
        ("raw/a100/rep01/c0008", gz, "line "),
        ("raw/a100/rep02/c0008", pj, "$.concurrency: 'eight'"),
    ]:
        line = next(x for x in got.out.splitlines() if x.startswith(f"  skipped {rel}: "))
        assert f"{path}: {field}" in line
    with open(out / "points.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted((r["repeat"], r["concurrency"]) for r in rows) == [
        ("1", "1"),
        ("2", "1"),
    ]
    report = (out / "report.md").read_text()
    assert "## Skipped damaged points" in report
    assert f"- `raw/a100/rep01/c0008`: {gz}: line " in report
    assert f"- `raw/a100/rep02/c0008`: {pj}: $.concurrency: 'eight'" in report


def test_no_skipped_section_without_damage(tmp_path: Path, capsys: Any) -> None:
    exp = tree(tmp_path)
    plain, skipping = tmp_path / "plain", tmp_path / "skipping"
    assert main(["analyze", str(exp), "--out", str(plain), "--no-figures"]) == 0
    argv = ["analyze", str(exp), "--out", str(skipping), "--no-figures", "--skip-damaged"]
    assert main(argv) == 0
    assert "\n  skipped" not in capsys.readouterr().out
    files = sorted(p.relative_to(plain) for p in plain.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(skipping) for p in skipping.rglob("*") if p.is_file())
    for f in files:
        assert (plain / f).read_bytes() == (skipping / f).read_bytes()
    assert "Skipped" not in (plain / "report.md").read_text()


def test_skip_damaged_with_every_point_damaged_is_one_line(tmp_path: Path, capsys: Any) -> None:
    exp = servelab_tree(tmp_path / "exp", {"a100": {8: [(400.0, 20.0)]}})
    truncate_gzip(exp)
    out = tmp_path / "analysis"
    argv = ["analyze", str(exp), "--out", str(out), "--no-figures", "--skip-damaged"]
    assert main(argv) == 2
    got = capsys.readouterr()
    assert len(got.err.splitlines()) == 1
    assert "all 1 points are damaged, nothing left to analyse" in got.err
    assert not out.exists()
