"""The measurements as pandas DataFrames, for notebooks: `points(path)` and `requests(path)`.

`path` is a servelab experiment folder (`results/<experiment>`) or a tree written by
`vllm bench serve --save-result --save-detailed` (`rep_<NN>/concurrency_<CCC>/benchmark.json`,
or `rep_<NN>/rate_<R>/benchmark.json` for runs at a request rate), as for `servelab analyze`.
docs/python.md has an example and the columns.

- `points`: one row per measured point, the rows and columns of the analysis' points.csv
  (computed by the same code, at full precision: the CSV rounds to 6 significant digits);
- `requests`: one row per request of those points, the same columns for both layouts first
  (`server_config`, `repeat`, `concurrency`, `request`, `ok`, `error`, `prompt_tokens`,
  `output_tokens`, `ttft_ms`, `tpot_ms`, `e2el_ms`, `itl_ms`; `rate` instead of `concurrency`
  for a sweep over request rates), then the layout's own fields.

A value the raw data lacks is missing: NaN, or None among lists and text (`isna()` either way).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

import pandas as pd

from servelab.analysis.benchtree import vllm_bench_files
from servelab.analysis.dataset import detect_layout, load_dataset
from servelab.analysis.groups import POINTS_COLUMNS, axis_of, points_table, with_axis
from servelab.client import RequestRecord
from servelab.config import load as load_config
from servelab.experiment import Experiment
from servelab.metrics import request_latencies
from servelab.store.rawdata import load_points
from servelab.telemetry.columns import table_columns as telemetry_table_columns

__all__ = ["points", "requests"]

PathLike = str | os.PathLike[str]

# requests(): the columns both layouts have, in this order
REQUEST_COLUMNS = (
    "server_config",
    "repeat",
    "concurrency",
    "request",
    "ok",
    "error",
    "prompt_tokens",
    "output_tokens",
    "ttft_ms",
    "tpot_ms",
    "e2el_ms",
    "itl_ms",
)


class Latencies(TypedDict):
    """A request's latencies (ms) as the analysis computes them; None where not counted."""

    ttft_ms: float | None
    tpot_ms: float | None
    e2el_ms: float | None
    itl_ms: list[float] | None


NO_LATENCIES = Latencies(ttft_ms=None, tpot_ms=None, e2el_ms=None, itl_ms=None)
# benchmark.json's per-request lists that the common columns hold
BENCH_MAPPED = ("ttfts", "itls", "latencies", "errors", "input_lens", "output_lens")


def points(
    path: PathLike, config: PathLike | Experiment | None = None, name: str | None = None
) -> pd.DataFrame:
    """One row per measured point, as analysis/points.csv has them. `config`: the experiment's
    config (a file or an `Experiment`), whose `analysis.validity` thresholds decide `valid`
    (the schema's defaults when None, as `servelab analyze` without --config); `name`: the
    server configuration's name for a vllm-bench tree (default: the folder's name)."""
    exp = load_config(Path(config)) if isinstance(config, str | os.PathLike) else config
    ds = load_dataset(Path(path), name, exp.analysis.validity if exp is not None else None)
    blocks = [p.extra["telemetry"] for p in ds.points if "telemetry" in p.extra]
    columns = [*with_axis(POINTS_COLUMNS, axis_of(ds)), *telemetry_table_columns(blocks)]
    return _frame(points_table(ds), columns)


def requests(path: PathLike, name: str | None = None) -> pd.DataFrame:
    """One row per request of every measured point, in the points' order (server_config,
    concurrency, repeat), then the request's. `name` as for `points`."""
    root = Path(path)
    if detect_layout(root) == "servelab":
        rows = list(_servelab_requests(root))
        extra = [f for f in RequestRecord.__dataclass_fields__ if f not in REQUEST_COLUMNS]
    else:
        rows = list(_bench_requests(root, name or root.name))
        extra = sorted({k for r in rows for k in r} - {*REQUEST_COLUMNS, "rate"})
    axis = "rate" if any("rate" in r for r in rows) else "concurrency"
    rows.sort(key=lambda r: (r["server_config"], r[axis], r["repeat"], r["request"]))
    return _frame(rows, [*with_axis(REQUEST_COLUMNS, axis), *extra])


def _frame(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> pd.DataFrame:
    df = pd.DataFrame(list(rows), columns=list(columns))
    for col in df.columns[df.isna().all()]:  # nothing recorded (None everywhere): NaN
        df[col] = df[col].astype("float64")
    return df


def _latencies(ttft: float, e2el: float, tpot: float | None, itl: list[float]) -> Latencies:
    return {"ttft_ms": ttft, "tpot_ms": tpot, "e2el_ms": e2el, "itl_ms": itl}


def _servelab_requests(root: Path) -> Iterator[dict[str, Any]]:
    """requests.jsonl.gz of every complete point; latencies (ms) as the analysis computes
    them, for the requests it counts (ok, with chunks)."""
    for point in load_points(root):
        meta = point.meta
        where = {
            "server_config": meta["server_config"],
            "repeat": int(meta["repeat"]),
            **point.level.to_json(),  # its concurrency, or an open-loop point's rate
        }
        for i, raw in enumerate(point.request_rows()):
            rec = RequestRecord.from_json(raw)
            lat = NO_LATENCIES
            if rec.ok and rec.chunk_offsets_us:
                r = request_latencies(rec)
                lat = _latencies(r["ttft"], r["e2el"], r["tpot"], r["itl"])
            yield {**where, "request": i, **rec.to_json(), **lat}


def _bench_requests(root: Path, name: str) -> Iterator[dict[str, Any]]:
    """The per-request lists of every benchmark.json, one row per index: a request fails
    with an `errors` entry or no output; latencies (ms) with the analysis' definitions
    (E2EL: `latencies`, else TTFT plus the ITLs); any other per-request list under its key.
    The point's level under `concurrency`, or `rate` for a run at a request rate."""
    for f in vllm_bench_files(root):
        bench = f.read()
        level = f.level(bench).to_json()
        n = len(bench["ttfts"])
        errors = bench.get("errors") or [""] * n
        inputs = bench.get("input_lens") or [None] * n
        latencies = bench.get("latencies")
        others = {
            k: v
            for k, v in bench.items()
            if k not in BENCH_MAPPED and isinstance(v, list) and len(v) == n
        }
        for i in range(n):
            out = bench["output_lens"][i]
            ok = not errors[i] and out not in (0, None)
            lat = NO_LATENCIES
            first = bench["ttfts"][i]
            if ok and first is not None:  # a first token the tool did not time: no latencies
                ttft = float(first) * 1000.0
                itl = [float(x) * 1000.0 for x in bench["itls"][i] or []]
                e2el = float(latencies[i]) * 1000.0 if latencies else ttft + sum(itl)
                tpot = (e2el - ttft) / (int(out) - 1) if int(out) > 1 else None
                lat = _latencies(ttft, e2el, tpot, itl)
            yield {
                "server_config": name,
                "repeat": f.repeat,
                **level,
                "request": i,
                "ok": ok,
                "error": errors[i] or None,
                "prompt_tokens": inputs[i],
                "output_tokens": out,
                **lat,
                **{k: v[i] for k, v in others.items()},
            }
