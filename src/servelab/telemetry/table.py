"""Per point, throughput beside telemetry: the table, points.csv and the figure that
`servelab telemetry summarize results/<experiment>` prints and writes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from servelab.errors import ServelabError
from servelab.render import csv_text, num
from servelab.telemetry.columns import (
    COLUMNS,
    table_columns,
    telemetry_columns,
    utilization_vs_throughput,
)

POINT_COLUMNS = ("server_config", "concurrency", "repeat", "output_throughput", "mean_ttft_ms")


def point_rows(points: Sequence[Mapping[str, object]]) -> list[dict[str, object]]:
    """Per point.json: its POINT_COLUMNS as recorded, then its telemetry columns."""

    def telemetry(p: Mapping[str, object]) -> Mapping[str, object] | None:
        block = p.get("telemetry")
        return block if isinstance(block, Mapping) else None

    rows = [
        {**{k: p.get(k) for k in POINT_COLUMNS}, **telemetry_columns(telemetry(p))} for p in points
    ]
    rows.sort(key=lambda r: (str(r["server_config"]), r["concurrency"] or 0, r["repeat"] or 0))
    return rows


def rows_csv(rows: Sequence[Mapping[str, object]], columns: Sequence[str] = COLUMNS) -> str:
    return csv_text([*POINT_COLUMNS, *columns], rows)


def _f(v: object, spec: str, width: int) -> str:
    return f"{num(v, spec):>{width}}"


def render_table(rows: Sequence[Mapping[str, object]]) -> str:
    head = (
        f"{'server config':<18} {'conc':>4} {'rep':>3} {'tok/s':>8} {'util%':>5} {'srv CPU%':>8} "
        f"{'cli CPU%':>8} {'GPU%':>5} {'run max':>7} {'wait max':>8} {'wait frac':>9} "
        f"{'KV max':>6} {'preempt':>7} {'J/tok':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{str(r['server_config']):<18} {r['concurrency'] or 0:>4} {r['repeat'] or 0:>3} "
            f"{_f(r['output_throughput'], '.1f', 8)} {_f(r['utilization_pct'], '.0f', 5)} "
            f"{_f(r['cpu_server_util_pct_mean'], '.0f', 8)} "
            f"{_f(r['cpu_client_util_pct_mean'], '.0f', 8)} {_f(r['gpu_util_pct_mean'], '.0f', 5)} "
            f"{_f(r['running_max'], '.0f', 7)} {_f(r['waiting_max'], '.0f', 8)} "
            f"{_f(r['waiting_fraction'], '.2f', 9)} {_f(r['kv_usage_max'], '.3f', 6)} "
            f"{_f(r['preemptions'], '.0f', 7)} {_f(r.get('joules_per_output_token'), '.3f', 7)}"
        )
    lines.append(
        "util%: GPU utilization (the server's GPUs), or the server's CPU as a share of all the "
        "host's cores; srv / cli CPU%: % of one core; KV: fraction of the KV cache; J/tok: "
        "the server's GPUs' (else the CPU packages') energy per output token"
    )
    absent = sorted({str(r["gpu_absent"]) for r in rows if r.get("gpu_absent")})
    for reason in absent:
        lines.append(f"GPU telemetry absent: {reason}")
    for reason in sorted({str(r["energy_absent"]) for r in rows if r.get("energy_absent")}):
        lines.append(f"energy absent: {reason}")
    notes = {str(r["gpu_selection_ambiguous"]) for r in rows if r.get("gpu_selection_ambiguous")}
    for note in sorted(notes):
        lines.append(f"GPU selection ambiguous: {note}")
    return "\n".join(lines) + "\n"


def summarize_experiment(exp_dir: Path, out_dir: Path | None = None) -> tuple[str, list[Path]]:
    """The table as text, and the files written: points.csv and the figure (SVG and PNG)."""
    from servelab.store.rawdata import load_points
    from servelab.telemetry.figure import plot_utilization_vs_throughput

    if not (exp_dir / "raw").is_dir():
        raise ServelabError(f"{exp_dir}: no raw/ folder; pass results/<experiment>")
    points = [p.meta for p in load_points(exp_dir)]
    if not points:
        raise ServelabError(f"{exp_dir}/raw: no complete point; run the sweep first")
    rows = point_rows(points)
    out = out_dir if out_dir is not None else exp_dir / "telemetry"
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "points.csv"
    columns = table_columns(p.get("telemetry") for p in points) or COLUMNS
    csv_path.write_text(rows_csv(rows, columns), encoding="utf-8")
    figure = plot_utilization_vs_throughput(utilization_vs_throughput(points), out)
    return render_table(rows), [csv_path, *figure]
