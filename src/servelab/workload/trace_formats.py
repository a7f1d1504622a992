"""The request trace file formats servelab replays (workload.trace.format), each read by one
adapter into the same rows (TraceRow, below): a request's timestamp in ms
after the trace's first request, its input and output lengths in tokens, its prefix blocks'
ids (None where the format has none) and its line in the file.

- `mooncake`: JSON lines, one request per line: `timestamp` (ms from the trace's start),
  `input_length`, `output_length` and, optionally, `hash_ids` (the FAST'25 Mooncake traces,
  also read by vLLM bench serve and GuideLLM).
- `azure`: the Azure LLM inference traces (AzurePublicDataset), a CSV with `TIMESTAMP` (a wall
  clock, `2023-11-16 18:15:46.6805900` in the 2023 release, `2024-05-10 00:00:00.009930+00:00`
  in the 2024 one), `ContextTokens` and `GeneratedTokens`.
- `burstgpt`: the BurstGPT traces, a CSV with `Timestamp` (seconds from 0:00 of the trace's
  first day), `Request tokens` and `Response tokens`; a row with 0 response tokens is a
  request that failed.

A CSV's other columns are ignored. Its timestamps are read exactly, to the nanosecond, and
become offsets from the first row: an int number of ms where whole, else the float nearest
the exact offset. A CSV row with 0 prompt or 0 output tokens cannot be replayed: it is kept
as `failed` (the window leaves it out and counts it). Anything else that is not what the
format says (a missing column, a length that is not a whole number, timestamps going back)
is refused in one line naming the file, the line and the column.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from pathlib import Path

from servelab.documents import JsonObject
from servelab.errors import ServelabError
from servelab.store.jsonio import DamagedFile, json_object_line


@dataclass(frozen=True)
class TraceRow:
    """One request of the trace: its `timestamp` (ms after the trace's first request, an int
    or a float), `input_length`, `output_length` and `hash_ids` (None: the plain form); `line`,
    its line in the file; `failed`: the trace records it as failed (a CSV row with no prompt or
    no response tokens, as BurstGPT writes a failed request), never replayed and counted."""

    timestamp: int | float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] | None
    line: int
    failed: bool = False


FORMATS = ("mooncake", "azure", "burstgpt")

# The columns each CSV format needs: timestamp, input length, output length.
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")

_KNOWN = (
    "the trace formats known: mooncake (JSON lines: timestamp, input_length, output_length), "
    f"azure (CSV: {', '.join(AZURE_COLUMNS)}), burstgpt (CSV: {', '.join(BURSTGPT_COLUMNS)}); "
    "set workload.trace.format or convert the file"
)
_NS_PER_MS = 1_000_000
_NS_PER_S = 1_000_000_000
# Azure's TIMESTAMP: a date, a time to the second, an optional fraction (up to 9 digits) and
# an optional UTC offset (Z, +HH:MM, +HHMM).
_WALL_CLOCK = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(?:\s*(Z|[+-]\d{2}:?\d{2}))?"
)
_SECONDS = re.compile(r"([+-]?)(\d+)(?:\.(\d{0,9}))?")
_COUNT = re.compile(r"\d+")


def read_rows(path: Path, fmt: str = "auto") -> list[TraceRow]:
    """The requests of a trace file in `fmt` (one of FORMATS, or `auto`: told from the file's
    content), in file order; a one-line DamagedFile naming the file (and the line) otherwise."""
    if fmt == "auto":
        fmt = detect(path)
    reader = _READERS.get(fmt)
    if reader is None:
        raise ServelabError(
            f"workload.trace.format: {fmt!r} is not a trace format; give auto or one of "
            + ", ".join(FORMATS)
        )
    return reader(path)


def detect(path: Path) -> str:
    """The format of a trace file, told from its first non-blank line: a `{` starts a Mooncake
    JSON line; a CSV header with Azure's or BurstGPT's columns names that format."""
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            return "mooncake"
        header = _header(next(csv.reader([line])))
        for fmt, needed in (("azure", AZURE_COLUMNS), ("burstgpt", BURSTGPT_COLUMNS)):
            if all(c in header for c in needed):
                return fmt
        raise DamagedFile(
            path,
            f"line {lineno}",
            f"neither a Mooncake JSON line nor a known CSV header ({_shown(line)}); {_KNOWN}",
        )
    raise DamagedFile(path, "$", f"empty: no request; {_KNOWN}")


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of the file's lines, their line ends kept, a UTF-8 byte order mark
    dropped."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as fh:
            yield from enumerate(fh, 1)
    except UnicodeDecodeError as exc:
        raise DamagedFile(path, "$", f"not UTF-8 text ({exc.reason})") from None


def _shown(line: str, limit: int = 80) -> str:
    text = line.strip()
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _header(names: list[str]) -> list[str]:
    return [n.strip() for n in names]


# --- mooncake --------------------------------------------------------------------------


def _count(row: JsonObject, key: str, path: Path, lineno: int, low: int) -> int:
    v = row.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise DamagedFile(path, f"line {lineno}", f"{key}: {v!r} is not an integer >= {low}")
    return v


def read_mooncake(path: Path) -> list[TraceRow]:
    """A Mooncake trace: one JSON object per line (blank lines skipped), `timestamp` (ms, a
    number, non-decreasing from 0 up), `input_length` and `output_length` (integers >= 1) and
    optionally `hash_ids` (a list of integers); other keys ignored."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DamagedFile(path, "$", f"not UTF-8 text ({exc.reason})") from None
    rows: list[TraceRow] = []
    last: int | float = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        row = json_object_line(path, lineno, line, "a trace is one JSON object per line")
        ts = row.get("timestamp")
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
            raise DamagedFile(path, f"line {lineno}", f"timestamp: {ts!r} is not a number (ms)")
        if ts < last:
            raise DamagedFile(
                path, f"line {lineno}", f"timestamp {ts!r} is before the line above's {last!r}"
            )
        last = ts
        ids = row.get("hash_ids")
        if ids is not None and (
            not isinstance(ids, list)
            or any(isinstance(h, bool) or not isinstance(h, int) for h in ids)
        ):
            raise DamagedFile(path, f"line {lineno}", "hash_ids: not a list of integers")
        rows.append(
            TraceRow(
                ts,
                _count(row, "input_length", path, lineno, 1),
                _count(row, "output_length", path, lineno, 1),
                None if ids is None else tuple(h for h in ids if isinstance(h, int)),
                lineno,
            )
        )
    if not rows:
        raise DamagedFile(path, "$", "no request: a trace is one JSON object per line")
    return rows


# --- CSV -------------------------------------------------------------------------------

# A CSV row's timestamp, in ns on the trace's own clock, from its text: (path, line, text).
TimeReader = Callable[[Path, int, str], int]


def _read_csv(
    path: Path, name: str, columns: tuple[str, str, str], clock: TimeReader
) -> list[TraceRow]:
    """The rows of a CSV trace whose `columns` are its timestamp, input and output lengths
    (read by `clock` and as whole numbers); `name` is the format's, for messages."""
    rows: list[TraceRow] = []
    first: int | None = None
    last = 0
    where: tuple[int, int, int] | None = None
    lines = (line for _, line in _lines(path))
    reader = csv.reader(lines, strict=True)
    try:
        for fields in reader:
            lineno = reader.line_num
            if not fields or not any(f.strip() for f in fields):
                continue  # a blank line
            if where is None:
                where = _columns(path, lineno, _header(fields), name, columns)
                continue
            ts_text, input_text, output_text = (
                _field(path, lineno, fields, i, c) for i, c in zip(where, columns, strict=True)
            )
            ns = clock(path, lineno, ts_text)
            if first is None:
                first = last = ns
            elif ns < last:
                raise DamagedFile(
                    path,
                    f"line {lineno}",
                    f"{columns[0]}: {ts_text.strip()} is before the previous row's; a trace's "
                    "rows must be in time order (sort the file by its timestamps)",
                )
            last = ns
            n_in = _length(path, lineno, columns[1], input_text)
            n_out = _length(path, lineno, columns[2], output_text)
            offset = ns - first
            ms = offset // _NS_PER_MS if offset % _NS_PER_MS == 0 else offset / _NS_PER_MS
            rows.append(TraceRow(ms, n_in, n_out, None, lineno, failed=n_in == 0 or n_out == 0))
    except csv.Error as exc:
        raise DamagedFile(path, f"line {reader.line_num}", f"not CSV ({exc})") from None
    if where is None:
        raise DamagedFile(path, "$", f"empty: no header and no request ({name} CSV)")
    if not rows:
        raise DamagedFile(path, "$", f"no request: a header and no row ({name} CSV)")
    return rows


def _columns(
    path: Path, lineno: int, header: list[str], name: str, columns: tuple[str, str, str]
) -> tuple[int, int, int]:
    """Where each of `columns` is in the header (its first occurrence); a missing one refused."""
    for col in columns:
        if col not in header:
            raise DamagedFile(
                path,
                f"line {lineno}",
                f"no column {col!r} in the header: the {name} format needs "
                f"{', '.join(columns)} (other columns are ignored)",
            )
    ts, n_in, n_out = (header.index(col) for col in columns)
    return ts, n_in, n_out


def _field(path: Path, lineno: int, fields: list[str], i: int, column: str) -> str:
    if i >= len(fields):
        raise DamagedFile(path, f"line {lineno}", f"{column}: no value (the row is short)")
    return fields[i]


def _length(path: Path, lineno: int, column: str, text: str) -> int:
    """A token count: a whole number >= 0."""
    s = text.strip()
    if not _COUNT.fullmatch(s):
        raise DamagedFile(
            path, f"line {lineno}", f"{column}: {s!r} is not a whole number of tokens (>= 0)"
        )
    return int(s)


def wall_clock_ns(path: Path, lineno: int, text: str) -> int:
    """An Azure TIMESTAMP, `YYYY-MM-DD HH:MM:SS[.fraction][offset]`, as ns since 0001-01-01 on
    its clock (a UTC offset subtracted), exactly: the fraction's digits (up to 9) are read as
    they are written, never through a float."""
    return _wall_clock(path, lineno, text)[0]


def _wall_clock(path: Path, lineno: int, text: str) -> tuple[int, bool]:
    """wall_clock_ns, and whether the time gives its UTC offset."""
    s = text.strip()
    m = _WALL_CLOCK.fullmatch(s)
    if m is None:
        raise DamagedFile(
            path,
            f"line {lineno}",
            f"TIMESTAMP: {s!r} is not a time as YYYY-MM-DD HH:MM:SS[.fraction][+HH:MM]",
        )
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    fraction, zone = m.group(7) or "", m.group(8)
    try:
        days = date(year, month, day).toordinal()
    except ValueError as exc:
        raise DamagedFile(path, f"line {lineno}", f"TIMESTAMP: {s!r}: {exc}") from None
    if hour > 23 or minute > 59 or second > 59:
        raise DamagedFile(path, f"line {lineno}", f"TIMESTAMP: {s!r}: no such time of day")
    seconds = days * 86_400 + hour * 3_600 + minute * 60 + second
    if zone is not None and zone != "Z":
        digits = zone[1:].replace(":", "")
        shift = int(digits[:2]) * 3_600 + int(digits[2:]) * 60
        seconds -= shift if zone[0] == "+" else -shift
    return seconds * _NS_PER_S + int(fraction.ljust(9, "0")), zone is not None


def seconds_ns(path: Path, lineno: int, text: str) -> int:
    """A BurstGPT Timestamp, seconds as a decimal number (`5`, `5.25`, `1.5e3`), as ns,
    exactly (more than 9 decimals rounded to the ns, half to even)."""
    s = text.strip()
    m = _SECONDS.fullmatch(s)
    if m is not None:
        sign, whole, fraction = m.group(1), m.group(2), m.group(3) or ""
        ns = int(whole) * _NS_PER_S + int(fraction.ljust(9, "0"))
        return -ns if sign == "-" else ns
    try:
        value = Decimal(s)
    except InvalidOperation:
        value = Decimal("NaN")
    if not value.is_finite():
        raise DamagedFile(path, f"line {lineno}", f"Timestamp: {s!r} is not a number (seconds)")
    return int((value * _NS_PER_S).to_integral_value(rounding=ROUND_HALF_EVEN))


def read_azure(path: Path) -> list[TraceRow]:
    """An Azure LLM inference trace (2023 or 2024 release): TIMESTAMP, ContextTokens (the
    input length), GeneratedTokens (the output length); the timestamps' offsets from the first
    row's. Within one file every TIMESTAMP has a UTC offset or none does (a clock without one
    is taken as the file's own)."""
    zoned: list[bool] = []  # the first row's: its time has a UTC offset

    def clock(p: Path, lineno: int, text: str) -> int:
        ns, has_zone = _wall_clock(p, lineno, text)
        if not zoned:
            zoned.append(has_zone)
        elif zoned[0] != has_zone:
            raise DamagedFile(
                p,
                f"line {lineno}",
                f"TIMESTAMP: {text.strip()!r} "
                + (
                    "has a UTC offset and the first row's does not"
                    if has_zone
                    else "has no UTC offset and the first row's does"
                )
                + "; give every row's time on one clock",
            )
        return ns

    return _read_csv(path, "azure", AZURE_COLUMNS, clock)


def read_burstgpt(path: Path) -> list[TraceRow]:
    """A BurstGPT trace (any release): Timestamp (seconds), Request tokens (the input length),
    Response tokens (the output length; 0: a failed request, kept as failed); Model, Total
    tokens, Log Type, Session ID, Elapsed time and any other column ignored."""
    return _read_csv(path, "burstgpt", BURSTGPT_COLUMNS, seconds_ns)


_READERS: dict[str, Callable[[Path], list[TraceRow]]] = {
    "mooncake": read_mooncake,
    "azure": read_azure,
    "burstgpt": read_burstgpt,
}
