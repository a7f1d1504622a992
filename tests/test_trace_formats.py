"""The trace file formats (servelab.workload.trace_formats, workload.trace.format): each read
into the same rows with its timestamps exact to the nanosecond, the format told from the
file's content, the config key, and the one-line refusals naming the file, line and column."""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from servelab import config
from servelab.errors import ServelabError
from servelab.experiment import TraceSection
from servelab.store.jsonio import DamagedFile, as_object
from servelab.workload.promptset import PromptSource
from servelab.workload.trace import TraceRow, check_local_pin, read_trace
from servelab.workload.trace_formats import FORMATS, detect, read_rows

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "config" / "experiments" / "trace-replay-cpu.yaml"


def load_script() -> ModuleType:
    script = REPO / "scripts" / "make_trace_formats.py"
    spec = importlib.util.spec_from_file_location("make_trace_formats", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SCRIPT = load_script()


def ns_of(row: TraceRow) -> int:
    """A row's timestamp in ns, exactly as the float or int it holds."""
    return round(Fraction(row.timestamp) * 1_000_000)


def write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    return path


def refused(path: Path, fmt: str = "auto") -> str:
    with pytest.raises(DamagedFile) as e:
        read_rows(path, fmt)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{path}: ")
    return msg


# --- the fixtures of scripts/make_trace_formats.py ------------------------------------


@pytest.mark.parametrize(
    ("name", "fmt"),
    [("azure-2023.csv", "azure"), ("azure-2024.csv", "azure"), ("burstgpt.csv", "burstgpt")],
)
def test_each_format_reads_into_the_rows_it_was_made_from(
    tmp_path: Path, name: str, fmt: str
) -> None:
    text, expected = SCRIPT.make(name)
    path = write(tmp_path, text, name)
    assert detect(path) == fmt
    rows = read_trace(path)  # auto
    assert rows == read_rows(path, fmt)
    assert [(ns_of(r), r.input_length, r.output_length, r.failed) for r in rows] == expected
    assert [r.line for r in rows] == list(range(2, len(expected) + 2))
    assert all(r.hash_ids is None for r in rows)
    for r, (ns, *_) in zip(rows, expected, strict=True):  # an int where whole, else ns / 10^6
        assert r.timestamp == (ns // 10**6 if ns % 10**6 == 0 else ns / 10**6)
        assert isinstance(r.timestamp, int) == (ns % 10**6 == 0)
    assert len({r.timestamp for r in rows}) < len(rows)  # some requests share a time


def test_the_fixtures_are_the_same_bytes_every_time_and_hold_what_they_claim(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main: Callable[[list[str]], int] = SCRIPT.main
    assert main(["--out", str(tmp_path / "a")]) == 0
    assert "burstgpt.csv: 36 requests" in capsys.readouterr().out
    for name in SCRIPT.NAMES:
        assert (tmp_path / "a" / name).read_bytes() == SCRIPT.make(name)[0].encode()
    assert main(["--out", str(tmp_path / "b"), "--seed", "1"]) == 0
    assert (tmp_path / "b" / "burstgpt.csv").read_bytes() != (
        tmp_path / "a" / "burstgpt.csv"
    ).read_bytes()
    a2023 = (tmp_path / "a" / "azure-2023.csv").read_bytes()
    assert b"\r\n" in a2023 and not a2023.endswith(b"\n")  # as the published file
    assert b"18:15:46.6805900," in a2023  # 7 fractional digits
    a2024 = (tmp_path / "a" / "azure-2024.csv").read_text()
    assert "+00:00," in a2024 and "2024-05-11 " in a2024  # an offset; it crosses midnight
    assert any(line.split(",")[0].endswith(":51+00:00") for line in a2024.splitlines())
    burst = read_rows(tmp_path / "a" / "burstgpt.csv")
    failed = [r for r in burst if r.failed]
    assert len(failed) == 5 and all(r.output_length == 0 for r in failed)


# --- exact times ------------------------------------------------------------------------


def test_azure_2023_times_are_exact_to_the_100_ns(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
        "2023-11-16 18:15:46.6805900,374,44\r\n"
        "2023-11-16 18:15:46.6806001,396,109\r\n"  # 10.1 us later
        "2023-11-16 18:15:47,10,1\r\n"  # no fraction
        "2023-11-16 19:14:08.4025270,197,183",  # no line end after the last row
    )
    rows = read_rows(path, "azure")
    assert [ns_of(r) for r in rows] == [0, 10_100, 319_410_000, 3_501_721_937_000]
    assert rows[1].timestamp == 0.0101 and rows[3].timestamp == 3_501_721.937
    assert [(r.input_length, r.output_length, r.line) for r in rows] == [
        (374, 44, 2),
        (396, 109, 3),
        (10, 1, 4),
        (197, 183, 5),
    ]


def test_azure_2024_times_with_an_offset_are_on_one_clock(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 23:59:59.999999+00:00,5,5\n"
        "2024-05-11 02:00:00.000001+02:00,5,5\n"  # 2 us later, given at UTC+2
        "2024-05-11T00:00:01Z,5,5\n"
        "2024-05-10 19:00:02.5-05:00,5,5\n",
    )
    assert [ns_of(r) for r in read_rows(path)] == [0, 2_000, 1_000_001_000, 2_500_001_000]


def test_burstgpt_seconds_and_failed_rows(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "Log Type,Response tokens,Timestamp,Request tokens,Model,Extra\n"
        "Conversation log,18,5,472,ChatGPT,x\n"
        "API log,0,5.000000001,100,GPT-4,y\n"  # failed: no response tokens
        "API log,7,6.5,0,GPT-4,z\n"  # no prompt: not replayable either
        "API log,230,1e1,1087,GPT-4\n",  # a short row: the unknown column is not needed
    )
    rows = read_rows(path)
    assert rows == [
        TraceRow(0, 472, 18, None, 2),
        TraceRow(1e-6, 100, 0, None, 3, failed=True),
        TraceRow(1500, 0, 7, None, 4, failed=True),
        TraceRow(5000, 1087, 230, None, 5),
    ]
    assert type(rows[2].timestamp) is int and ns_of(rows[1]) == 1


# --- the format, told or given ----------------------------------------------------------


def test_auto_tells_the_format_from_the_content(tmp_path: Path) -> None:
    moon = write(tmp_path, '\n  {"timestamp": 0, "input_length": 3, "output_length": 2}\n', "m")
    assert detect(moon) == "mooncake"
    assert read_trace(moon) == [TraceRow(0, 3, 2, None, 2)]
    # a byte order mark, blank lines and spaces around the header's names
    azure = write(tmp_path, "\ufeff\n\n TIMESTAMP , ContextTokens,GeneratedTokens\n"
                  "2023-11-16 18:15:46,1,1\n", "a.txt")  # fmt: skip
    assert detect(azure) == "azure" and read_trace(azure)[0].line == 4
    burst = write(tmp_path, "Timestamp,Request tokens,Response tokens\n5,1,1\n", "b.jsonl")
    assert detect(burst) == "burstgpt"
    # a format given is read as that format, whatever the content
    msg = refused(burst, "mooncake")
    assert "line 1: not valid JSON" in msg
    assert "no column 'TIMESTAMP'" in refused(burst, "azure")


def test_an_unknown_format_names_the_file_and_the_formats_known(tmp_path: Path) -> None:
    path = write(tmp_path, "time,prompt,output\n1,2,3\n")
    msg = refused(path)
    assert "line 1: neither a Mooncake JSON line nor a known CSV header ('time,prompt,output')" in (
        msg
    )
    for fmt in FORMATS:
        assert f"{fmt} (" in msg
    assert "Request tokens" in msg and "GeneratedTokens" in msg
    assert "empty" in refused(write(tmp_path, "\n \n", "blank.csv"))
    with pytest.raises(ServelabError, match=r"^workload\.trace\.format: 'csv' is not"):
        read_rows(path, "csv")


# --- refusals ---------------------------------------------------------------------------


AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
BG = "Timestamp,Model,Request tokens,Response tokens\n5,ChatGPT,472,18\n"


@pytest.mark.parametrize(
    ("text", "fmt", "where"),
    [
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,1\n", "azure", "line 1: no column "
         "'GeneratedTokens' in the header: the azure format needs TIMESTAMP, ContextTokens, "
         "GeneratedTokens"),
        ("Timestamp,Request tokens,Total tokens\n5,1,2\n", "burstgpt", "line 1: no column "
         "'Response tokens'"),
        (AZ + "2023-11-16 18:15:47,12.5,3\n", "auto", "line 3: ContextTokens: '12.5' is not a "
         "whole number of tokens"),
        (AZ + "2023-11-16 18:15:47,12,-3\n", "auto", "line 3: GeneratedTokens: '-3' is not"),
        (BG + "6,GPT-4,12,,\n", "auto", "line 3: Response tokens: '' is not a whole number"),
        (BG + "6,GPT-4\n", "auto", "line 3: Request tokens: no value"),
        (AZ + "2023-11-16 18:15:46.6805899,1,1\n", "auto", "line 3: TIMESTAMP: "
         "2023-11-16 18:15:46.6805899 is before the previous row's"),
        (BG + "\n4.999,GPT-4,1,1\n", "auto", "line 4: Timestamp: 4.999 is before"),
        (AZ + "2023-11-16 25:00:00,1,1\n", "auto", "line 3: TIMESTAMP: '2023-11-16 25:00:00': "
         "no such time of day"),
        (AZ + "2023-02-30 10:00:00,1,1\n", "auto", "line 3: TIMESTAMP: '2023-02-30 10:00:00': "
         "day is out of range"),
        (AZ + "16/11/2023 18:15,1,1\n", "auto", "line 3: TIMESTAMP: '16/11/2023 18:15' is not "
         "a time as YYYY-MM-DD"),
        (AZ + "2023-11-16 18:15:47+00:00,1,1\n", "auto", "line 3: TIMESTAMP: "
         "'2023-11-16 18:15:47+00:00' has a UTC offset and the first row's does not"),
        (BG + "soon,GPT-4,1,1\n", "auto", "line 3: Timestamp: 'soon' is not a number"),
        (BG + "nan,GPT-4,1,1\n", "auto", "line 3: Timestamp: 'nan' is not a number"),
        ("Timestamp,Request tokens,Response tokens\n", "auto", "$: no request: a header and no "
         "row"),
        (AZ + '"2023-11-16 18:15:47,1,1\n', "auto", "line 3: not CSV (unexpected end"),
    ],
)  # fmt: skip
def test_a_damaged_csv_trace_is_refused_in_one_line_naming_the_line_and_column(
    tmp_path: Path, text: str, fmt: str, where: str
) -> None:
    path = write(tmp_path, text)
    assert f"{path}: {where}" in refused(path, fmt)


def test_a_csv_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(AZ.encode() + b"2023-11-16 18:15:47,1,\xff\n")
    assert "$: not UTF-8 text" in refused(path, "azure")


# --- the config key and the pin -------------------------------------------------------


def example() -> dict[str, Any]:
    data = config.read_file(EXAMPLE)
    assert isinstance(data, dict)
    return data


def test_the_format_key_defaults_to_auto_and_takes_only_the_formats_known() -> None:
    exp = config.load(EXAMPLE)
    assert exp.workload.trace is not None and exp.workload.trace.format == "auto"
    d = example()
    d["workload"]["trace"]["format"] = "burstgpt"
    resolved = as_object(as_object(config.resolve(d, "x")["workload"])["trace"])
    assert resolved["format"] == "burstgpt"
    trace = config.validate(d, "x").workload.trace
    assert trace is not None and trace.format == "burstgpt"
    d["workload"]["trace"]["format"] = "csv"
    with pytest.raises(ServelabError, match=r"^x: workload\.trace\.format: ") as e:
        config.resolve(d, "x")
    assert "\n" not in str(e.value)


def test_a_csv_trace_is_pinned_by_its_bytes_and_read_in_its_configured_format(
    tmp_path: Path,
) -> None:
    text, expected = SCRIPT.make("burstgpt.csv")
    path = write(tmp_path, text, "burstgpt.csv")
    pin = hashlib.sha256(path.read_bytes()).hexdigest()
    spec = TraceSection(str(path), None, pin, 512, 0.0, None, format="burstgpt")
    found = check_local_pin(spec)
    assert found is not None and found.sha256 == pin and found.path == path
    said: list[str] = []
    exp: Any = SimpleNamespace(workload=SimpleNamespace(trace=spec))
    source = PromptSource.of(exp, tmp_path, said.append)
    assert len(source.trace_rows) == len(expected) and source.dataset == found
    assert sum(r.failed for r in source.trace_rows) == 5
    assert said and f"{len(expected)} requests" in said[0]
    # the configured format is the one read: as Mooncake's, the CSV is refused
    with pytest.raises(DamagedFile, match="line 1: not valid JSON"):
        PromptSource.of(
            SimpleNamespace(
                workload=SimpleNamespace(
                    trace=TraceSection(str(path), None, pin, 512, 0.0, None, format="mooncake")
                )
            ),  # type: ignore[arg-type]
            tmp_path,
            said.append,
        )
    path.write_text(text.replace("5,ChatGPT", "6,ChatGPT", 1))
    with pytest.raises(ServelabError, match=r"workload\.trace\.path .*sha256"):
        check_local_pin(spec)
