"""Make small request traces in the CSV formats servelab reads besides Mooncake's (docs/config.md,
"Trace formats"), without any download, and the rows each must read into.

    python scripts/make_trace_formats.py --out DIR

writes into DIR:

- `azure-2023.csv`: the Azure LLM inference trace's 2023 layout (AzurePublicDataset,
  AzureLLMInferenceTrace_conv.csv): `TIMESTAMP,ContextTokens,GeneratedTokens`, wall-clock times
  with 7 fractional digits (`2023-11-16 18:15:46.6805900`), CRLF line ends and no line end
  after the last row, as the published file has;
- `azure-2024.csv`: its 2024 layout: the same columns, times with 6 fractional digits and a
  UTC offset (`2024-05-10 00:00:00.009930+00:00`), a time on a whole second without a
  fraction (`2024-05-10 00:00:03+00:00`, as pandas writes it), the trace crossing midnight;
- `burstgpt.csv`: the BurstGPT layout of the releases with sessions (`Timestamp,Model,Request
  tokens,Response tokens,Total tokens,Log Type,Session ID,Elapsed time`) and one column no
  release has (`Comment`, quoted, holding commas), seconds from 0:00 of the first day (whole
  or with a fraction), some failed rows (`Response tokens` 0).

Each has a few dozen rows, a few sharing a timestamp. The bytes are the same on every host:
only integer draws of random.Random(seed) (randint, choice), times kept as integer
nanoseconds and written digit by digit. `expected(name)` gives each file's rows as a reader
must return them: (offset from the first row in ns, input length, output length, failed).
"""

from __future__ import annotations

import argparse
import random
from datetime import date, timedelta
from pathlib import Path

Row = tuple[int, int, int, bool]  # offset ns, input length, output length, failed
NS = 1_000_000_000
ROWS = 36
NAMES = ("azure-2023.csv", "azure-2024.csv", "burstgpt.csv")


def _offsets(rng: random.Random, unit_ns: int, max_units: int) -> list[int]:
    """ROWS non-decreasing offsets in ns from 0, gaps drawn in units of `unit_ns` (about one
    gap in six 0: requests at the same time)."""
    t, out = 0, []
    for i in range(ROWS):
        if i:
            t += 0 if rng.randint(1, 6) == 1 else rng.randint(1, max_units) * unit_ns
        out.append(t)
    return out


def _wall_clock(start: date, start_ns: int, ns: int, digits: int, zone: str) -> str:
    """The time start + start_ns + ns (ns since that day's midnight) as `YYYY-MM-DD
    HH:MM:SS[.fraction]zone`, the fraction to `digits` digits (none for a whole second when
    `digits` is 6, as pandas writes a time with its UTC offset)."""
    total = start_ns + ns
    days, rest = divmod(total, 86_400 * NS)
    seconds, fraction = divmod(rest, NS)
    hh, mm, ss = seconds // 3600, seconds // 60 % 60, seconds % 60
    text = f"{start + timedelta(days=days)} {hh:02d}:{mm:02d}:{ss:02d}"
    if digits == 7 or fraction:
        text += "." + f"{fraction:09d}"[:digits]
    return text + zone


def azure(seed: int, layout: int) -> tuple[str, list[Row]]:
    """An Azure trace of the 2023 or the 2024 layout, and its rows."""
    rng = random.Random(f"{seed}:azure:{layout}")
    if layout == 2023:  # 100 ns ticks, gaps up to 4 s
        start, start_ns = date(2023, 11, 16), (18 * 3600 + 15 * 60 + 46) * NS + 680_590_000
        offsets, digits, zone, end = _offsets(rng, 100, 40_000_000), 7, "", "\r\n"
    else:  # 1 us ticks, gaps up to 1 s, from 10 s before midnight
        start, start_ns = date(2024, 5, 10), (23 * 3600 + 59 * 60 + 50) * NS + 9_930_000
        offsets, digits, zone, end = _offsets(rng, 1000, 1_000_000), 6, "+00:00", "\n"
        whole = offsets[2] + (NS - (start_ns + offsets[2]) % NS)  # the next whole second
        shift = max(0, whole - offsets[3])
        offsets[3:] = [whole, *(t + shift for t in offsets[4:])]  # still in order
    rows = [(t, rng.randint(1, 8000), rng.randint(1, 800), False) for t in offsets]
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"{_wall_clock(start, start_ns, t, digits, zone)},{i},{o}" for t, i, o, _ in rows]
    text = end.join(lines) + ("" if layout == 2023 else end)
    return text, rows


def burstgpt(seed: int) -> tuple[str, list[Row]]:
    """A BurstGPT trace with failed rows and an unknown column, and its rows."""
    rng = random.Random(f"{seed}:burstgpt")
    first_s = 5  # seconds from 0:00 of the first day (BurstGPT_1.csv starts at 5)
    offsets = _offsets(rng, NS // 4, 40)  # quarter-second steps: 5, 5.25, 7.5, ...
    lines = [
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type,Session ID,"
        "Elapsed time,Comment"
    ]
    rows: list[Row] = []
    for n, t in enumerate(offsets):
        failed = n % 7 == 3  # rows 3, 10, 17, ...: no response tokens
        n_in, n_out = rng.randint(1, 2000), 0 if failed else rng.randint(1, 600)
        whole, quarter = divmod(first_s * NS + t, NS)
        stamp = str(whole) if not quarter else f"{whole}.{quarter // 10_000_000:02d}"
        stamp = stamp.rstrip("0") if "." in stamp else stamp
        model = rng.choice(["ChatGPT", "GPT-4"])
        log = rng.choice(["Conversation log", "API log"])
        ms = rng.randint(100, 90_000)
        elapsed = f"{ms // 1000}.{ms % 1000:03d}"
        lines.append(
            f"{stamp},{model},{n_in},{n_out},{n_in + n_out},{log},{rng.randint(1, 9)},{elapsed},"
            f'"a note, row {n}"'
        )
        rows.append((t, n_in, n_out, failed))
    return "\n".join(lines) + "\n", rows


def make(name: str, seed: int = 0) -> tuple[str, list[Row]]:
    """One of NAMES: its text and the rows it must read into."""
    if name == "azure-2023.csv":
        return azure(seed, 2023)
    if name == "azure-2024.csv":
        return azure(seed, 2024)
    if name == "burstgpt.csv":
        return burstgpt(seed)
    raise ValueError(f"{name}: not one of {', '.join(NAMES)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the folder to write the files in")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        text, rows = make(name, args.seed)
        (args.out / name).write_bytes(text.encode("utf-8"))
        print(f"{args.out / name}: {len(rows)} requests")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
