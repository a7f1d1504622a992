"""How much of a same-host pair's spread slices would cancel, from a side-by-side run's own
requests (benchmarks/README.md, "Slices").

A side-by-side round measures the two points a comparison pairs one after the other, seconds
apart, on servers of the same code or not. Where both sides run the same code, their two points
together are one stretch of the host's speed: this script bins each pair's output tokens per
second over time (1-s bins, each point's ramp bins dropped), then asks what the pair's log ratio
would have been had the same stretch been split between the sides in other ways:

- `whole`: the first point's half of the stretch against the second's (what a side-by-side
  round measures);
- `abba`: quarters, A B B A;
- `slices-<k>s`: slices of k bins, alternating A B B A A B ... (what `sweep.repeats.slices`
  sends).

The spread (standard deviation over every pair of the run) of each is printed. The same-code
assumption is the caller's: run it on a rerun of one setup against itself.

    python benchmarks/bench_slices.py results/rerun-a-q-w96
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

BIN_S = 1.0


def token_bins(point_dir: Path) -> tuple[float, list[int]]:
    """A point's output tokens per BIN_S bin from its first chunk, the first and last bins
    (ramp up and drain) left out: (the first chunk's time, the bins)."""
    times: list[tuple[float, int]] = []
    with gzip.open(point_dir / "requests.jsonl.gz", "rt") as f:
        for line in f:
            r = json.loads(line)
            t0 = r["sent_epoch_ns"] / 1e9
            for off, n in zip(r["chunk_offsets_us"], r["chunk_tokens"] or [], strict=False):
                times.append((t0 + off / 1e6, n))
    times.sort()
    if not times:
        return 0.0, []
    start, end = times[0][0], times[-1][0]
    bins = [0] * int((end - start) // BIN_S)
    for t, n in times:
        i = int((t - start) // BIN_S)
        if i < len(bins):
            bins[i] += n
    return start, bins[1:-1]


def mean(xs: list[int]) -> float:
    return sum(xs) / len(xs)


def designs(x: list[int]) -> dict[str, float]:
    """The log ratio B / A of one stretch split in each design."""
    n = len(x)
    h, q = n // 2, n // 4
    out = {
        "whole": math.log(mean(x[h:]) / mean(x[:h])),
        "abba": math.log(
            (mean(x[q:h]) + mean(x[h : h + q])) / (mean(x[:q]) + mean(x[h + q : 4 * q]))
        ),
    }
    for k in (1, 2, 4):
        a: list[int] = []
        b: list[int] = []
        for j, i in enumerate(range(0, n - k + 1, k)):
            # A B, B A, A B, ...: slice j goes to A where j's pair is even and j is its first
            first = j % 2 == 0
            (a if first == ((j // 2) % 2 == 0) else b).extend(x[i : i + k])
        out[f"slices-{k}s"] = math.log(mean(b) / mean(a))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path, help="a side-by-side run's experiment folder")
    p.add_argument("--min-bins", type=int, default=16, help="pairs shorter than this are skipped")
    args = p.parse_args()
    runs = [json.loads(f.read_text()) for f in sorted(args.run.glob("raw/*/run.json"))]
    if not runs or not all((r.get("sequential") or {}).get("side_by_side") for r in runs):
        print(f"{args.run}: not a side-by-side run (run.json sequential.side_by_side): its pairs")
        print("are not measured back to back, so they are not one stretch of the host's speed")
        return 1
    pairs: dict[tuple[int, int], list[tuple[float, list[int]]]] = defaultdict(list)
    for pj in sorted(args.run.glob("raw/*/rep*/c*/point.json")):
        point = json.loads(pj.read_text())
        if point.get("slices"):
            print(f"{pj}: sent in slices already; run this on a side-by-side run of whole points")
            return 1
        pairs[(point["repeat"], point["concurrency"])].append(token_bins(pj.parent))
    spreads: dict[str, list[float]] = defaultdict(list)
    used = 0
    for _key, two in sorted(pairs.items()):
        if len(two) != 2:
            continue
        (_, first), (_, second) = sorted(two)
        stretch = first + second
        if len(stretch) < args.min_bins:
            continue
        used += 1
        for name, v in designs(stretch).items():
            spreads[name].append(v)
    if used < 3:
        print(f"{args.run}: {used} pairs of at least {args.min_bins} bins; too few to tell")
        return 1
    print(f"{args.run}: {used} pairs, {BIN_S:g}-s bins")
    for name, vs in spreads.items():
        print(f"  {name:<10} spread of the log ratio {statistics.stdev(vs):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
