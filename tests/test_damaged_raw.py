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


def telemetry_wrong_type(exp: Path) -> Path:
    block = {"format_version": 1, "gpu": {"devices": [{"device": 0, "util_pct": {"mean": "high"}}]}}
    return edit_point(exp, lambda p: p.update(telemetry=block))


def telemetry_not_object(exp: Path) -> Path:
    return edit_point(exp, lambda p: p.update(telemetry={"format_version": 1, "cpu": [1, 2]}))


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
    "telemetry statistic of the wrong type": (
        telemetry_wrong_type,
        re.escape(
            "$.telemetry.gpu.devices[0].util_pct.mean: 'high' is not of type 'number', 'null' "
            "(the telemetry block, docs/raw-data.md)"
        ),
    ),
    "telemetry source block not an object": (
        telemetry_not_object,
        re.escape(
            "$.telemetry.cpu: [1, 2] is not of type 'object', 'null' "
            "(the telemetry block, docs/raw-data.md)"
        ),
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


@pytest.mark.parametrize(
    "kind", ["truncated gzip", "concurrency is a string", "telemetry statistic of the wrong type"]
)
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
    head = (
        f"  skipped 2 damaged point(s) or file(s) (listed in report.md; paths relative to {exp}):"
    )
    assert head in got.out
    for rel, path, field in [
        ("raw/a100/rep01/c0008", gz, "line "),
        ("raw/a100/rep02/c0008", pj, "$.concurrency: 'eight'"),
    ]:
        line = next(x for x in got.out.splitlines() if x.startswith(f"  skipped {rel}: "))
        assert f": {path.relative_to(exp)}: {field}" in line
    with open(out / "points.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted((r["repeat"], r["concurrency"]) for r in rows) == [
        ("1", "1"),
        ("2", "1"),
    ]
    report = (out / "report.md").read_text()
    assert "## Skipped damaged raw data" in report
    # relative to the experiment folder: the report reads the same on every host
    assert str(tmp_path) not in report
    rel = "raw/a100/rep01/c0008"
    assert f"- `{rel}`: {rel}/requests.jsonl.gz: line " in report
    rel = "raw/a100/rep02/c0008"
    assert f"- `{rel}`: {rel}/point.json: $.concurrency: 'eight'" in report


def test_report_lines_are_relative_to_a_relative_root(
    tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    truncate_gzip(Path("exp"))
    argv = ["analyze", "exp", "--out", "analysis", "--no-figures", "--skip-damaged"]
    assert main(argv) == 0
    report = Path("analysis/report.md").read_text()
    rel = "raw/a100/rep01/c0008"
    assert f"- `{rel}`: {rel}/requests.jsonl.gz: line " in report
    assert "exp/raw" not in report
    # without the flag, the one line names the file as the user gave it
    capsys.readouterr()
    assert main(["analyze", "exp", "--out", "again", "--no-figures"]) == 2
    assert capsys.readouterr().err.startswith(f"servelab: exp/{rel}/requests.jsonl.gz: line ")


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


def test_skip_damaged_leaves_a_point_with_damaged_telemetry_out(
    tmp_path: Path, capsys: Any
) -> None:
    exp = tree(tmp_path)
    telemetry_wrong_type(exp)
    out = tmp_path / "analysis"
    argv = ["analyze", str(exp), "--out", str(out), "--no-figures", "--skip-damaged"]
    assert main(argv) == 0
    got = capsys.readouterr()
    assert got.err == ""
    with open(out / "points.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted((r["repeat"], r["concurrency"]) for r in rows) == [
        ("1", "1"),
        ("2", "1"),
        ("2", "8"),
    ]
    report = (out / "report.md").read_text()
    assert (
        "- `raw/a100/rep01/c0008`: raw/a100/rep01/c0008/point.json: "
        "$.telemetry.gpu.devices[0].util_pct.mean: 'high' is not of type" in report
    )


def damage_capacity(exp: Path) -> Path:
    path = exp / "server" / "a100" / "capacity.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"max_num_seqs": "many", "cudagraph_capture_sizes": [1, 2]}))
    return path


def test_damaged_capacity_is_one_line_without_skip_damaged(tmp_path: Path, capsys: Any) -> None:
    exp = tree(tmp_path)
    cap = damage_capacity(exp)
    out = tmp_path / "analysis"
    assert main(["analyze", str(exp), "--out", str(out), "--no-figures"]) == 2
    got = capsys.readouterr()
    assert "Traceback" not in got.out + got.err
    field = "$.max_num_seqs: 'many' is not of type 'integer', 'null' (schema capacity.schema.json)"
    one_line(got.err, cap, re.escape(field))
    assert not out.exists()


def test_skip_damaged_goes_without_a_damaged_capacity(tmp_path: Path, capsys: Any) -> None:
    exp = tree(tmp_path)
    plain = tmp_path / "plain"
    assert main(["analyze", str(exp), "--out", str(plain), "--no-figures"]) == 0
    damage_capacity(exp)
    out = tmp_path / "analysis"
    argv = ["analyze", str(exp), "--out", str(out), "--no-figures", "--skip-damaged"]
    assert main(argv) == 0
    got = capsys.readouterr()
    assert got.err == ""
    assert "  skipped server/a100/capacity.json: server/a100/capacity.json: " in got.out
    # every point kept: the tables are those of the data without a capacity.json
    for table in ("points.csv", "summary.csv"):
        assert (out / table).read_bytes() == (plain / table).read_bytes()
    report = (out / "report.md").read_text()
    assert "point(s) could not be read" not in report
    assert (
        "- `server/a100/capacity.json` (the capacity facts of a100 left out): "
        "server/a100/capacity.json: $.max_num_seqs: 'many' is not of type" in report
    )


def test_skip_damaged_with_a_damaged_launch_json(tmp_path: Path, capsys: Any) -> None:
    exp = servelab_tree(tmp_path / "exp", {**SPEC, "h100": SPEC["a100"]})
    lj = exp / "server" / "a100" / "launch.json"
    lj.parent.mkdir(parents=True)
    lj.write_text('{"args": ')
    out = tmp_path / "analysis"
    argv = ["analyze", str(exp), "--out", str(out), "--no-figures", "--skip-damaged"]
    assert main(argv) == 0
    got = capsys.readouterr()
    assert got.err == ""
    with open(out / "points.csv") as fh:
        assert {r["server_config"] for r in csv.DictReader(fh)} == {"h100"}
    report = (out / "report.md").read_text()
    assert "4 point(s) could not be read" in report
    assert "- `raw/a100/rep01/c0001`: server/a100/launch.json: $: not valid JSON" in report
    assert "file(s) of a server configuration" not in report  # listed once, with its points


def write_samples_text(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


GOOD_SAMPLE = '{"epoch_ns": 1, "source": "cpu"}'


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ('{"epoch_ns": 2, "source": ', r"line 2: not valid JSON \(Expecting value\)"),
        ("[1, 2]", r"line 2: a list, not a JSON object"),
        ('{"epoch_ns": "2", "source": "gpu"}', r"line 2: \$\.epoch_ns: '2' is not an integer"),
        ('{"epoch_ns": 2}', r"line 2: \$\.source: required field missing"),
    ],
)
def test_telemetry_samples_name_line_and_field(tmp_path: Path, line: str, field: str) -> None:
    from servelab.errors import ServelabError
    from servelab.telemetry import read_samples

    path = write_samples_text(tmp_path / "telemetry.jsonl", [GOOD_SAMPLE, line])
    with pytest.raises(ServelabError) as err:
        read_samples(path)
    todo = "re-run the sweep of the point's server configuration to sample it again"
    assert re.fullmatch(rf"{re.escape(str(path))}: {field}; {re.escape(todo)}", str(err.value))
