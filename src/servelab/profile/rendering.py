"""A profile rendered: the CSV tables (`profile_tables`) and the Markdown section
(`profile_markdown`) of profile.json and the analysis behind it. Pure functions: writing them
is `servelab.profile.report.write_profile`.

Every table is sorted and every float printed with a fixed format, so the same profile gives
the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from servelab import render
from servelab.documents.declared import ProfileRecord, ProfileSettings, TraceInfo, WindowEntry
from servelab.profile.records import us_per_token
from servelab.profile.trace_analysis import ProfileResult

REPORT = "profile.md"
# The tables' values are microsecond totals: 9 significant digits, as in profile.json.
DIGITS = 9

Rows = list[list[Any]]


def _csv(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    return render.csv_text(columns, rows, digits=DIGITS)


def _windows(profile: ProfileRecord) -> dict[str, WindowEntry]:
    return profile.get("windows") or {}


def _active_fraction_rows(result: ProfileResult | None, profile: ProfileRecord) -> Rows:
    return [
        [lb, d, v] for lb, w in _windows(profile).items() for d, v in w["active_fraction"].items()
    ]


def _family_rows(result: ProfileResult | None, profile: ProfileRecord) -> Rows:
    return [
        [lb, name, f["calls"], f["total_us"], f["us_per_token"]]
        for lb, w in _windows(profile).items()
        for name, f in w["families"].items()
    ]


def _kernel_rows(result: ProfileResult | None, profile: ProfileRecord) -> Rows:
    if result is None:
        return []
    return [
        [lb, k["family"], k["kernel"], k["instantiations"], k["calls"], k["total_us"]]
        for lb, rows in result.kernels.items()
        for k in rows
    ]


def _attention_path_rows(result: ProfileResult | None, profile: ProfileRecord) -> Rows:
    return [
        [
            lb,
            p["path"],
            p["grids"],
            " ".join(p.get("instantiations") or []),
            p["calls"],
            p["total_us"],
            p["us_per_token"],
            p["mean_us"],
            p["slope_us_per_seq"],
        ]
        for lb, w in _windows(profile).items()
        for p in w["attention_paths"]
    ]


def _forward_rows(result: ProfileResult | None, profile: ProfileRecord) -> Rows:
    if result is None:
        return []
    return [
        [
            lb,
            int(d) if d.isdigit() else d,
            f.index,
            f.start_ns,
            f.end_ns,
            f.population,
            f.kernel_ns / 1000.0,
            f.consistent,
            result.split.of_key(f.key),
            *_step_columns(result, lb, d, f.index),
        ]
        for lb, rows in result.forwards.items()
        for d, f in rows
    ]


def _steady_rows(result: ProfileResult | None, profile: ProfileRecord) -> Rows:
    return [
        [
            lb,
            s["first"],
            s["last"],
            s["forwards"],
            s["population_mean"],
            s["kernel_us_mean"],
            s["forward_kernel_us_mean"],
            s["forward_span_us_mean"],
        ]
        for lb, w in _windows(profile).items()
        if (s := w["steady"]) is not None
    ]


def _steady_path_rows(result: ProfileResult | None, profile: ProfileRecord) -> Rows:
    return [
        [
            lb,
            p["path"],
            p["forwards"],
            p.get("first"),
            p.get("last"),
            p["population_mean"],
            p["kernel_us_mean"],
            p.get("below_minimum"),
        ]
        for lb, w in _windows(profile).items()
        if (s := w["steady"]) is not None
        for p in s.get("paths") or []
    ]


def _ratio_rows(result: ProfileResult | None, profile: ProfileRecord) -> Rows:
    return [
        [r["from"], r["to"], r["population_ratio"], r["duration_ratio"]]
        for r in profile.get("ratios") or []
    ]


def _path_ratio_rows(result: ProfileResult | None, profile: ProfileRecord) -> Rows:
    return [
        [
            r["from"],
            r["to"],
            p["path"],
            p["population_ratio"],
            p["duration_ratio"],
            p.get("below_minimum"),
        ]
        for r in profile.get("ratios") or []
        for p in r.get("paths") or []
    ]


def _localisation_rows(result: ProfileResult | None, profile: ProfileRecord) -> Rows:
    return [
        [
            v["from"],
            v["to"],
            c["component"],
            c["kind"],
            c["from_us_per_token"],
            c["to_us_per_token"],
            c["delta_us_per_token"],
            c["share"],
        ]
        for v in profile.get("localisation") or []
        for c in v["components"]
    ]


def _steps_rows(result: ProfileResult | None, profile: ProfileRecord) -> Rows:
    return [
        [
            lb,
            st["format"],
            st["ranges"],
            st["forwards"],
            st["matched"],
            st["steps"],
            st["shared"],
            st["missed"],
            st["agree"],
            *(st["population"].get(k) for k in ("equal", "above", "below")),
        ]
        for lb, w in _windows(profile).items()
        if (st := w.get("steps")) is not None
    ]


@dataclass(frozen=True)
class Table:
    """One CSV table of a profile: its columns, the builder of its rows (from the analysis,
    None for a profile that was not made, and profile.json), and whether its rows are per
    window (sorted by window order, then by value)."""

    columns: tuple[str, ...]
    rows: Callable[[ProfileResult | None, ProfileRecord], Rows]
    per_window: bool = True


# File name -> table, in the order they are written.
TABLE_BUILDERS: dict[str, Table] = {
    "active_fraction.csv": Table(("window", "device", "active_fraction"), _active_fraction_rows),
    "families.csv": Table(("window", "family", "calls", "total_us", "us_per_token"), _family_rows),
    "kernels.csv": Table(
        ("window", "family", "kernel", "instantiations", "calls", "total_us"), _kernel_rows
    ),
    "attention_paths.csv": Table(
        (
            "window",
            "path",
            "grids",
            "instantiations",
            "calls",
            "total_us",
            "us_per_token",
            "mean_us",
            "slope_us_per_seq",
        ),
        _attention_path_rows,
    ),
    "forwards.csv": Table(
        (
            "window",
            "device",
            "forward",
            "start_ns",
            "end_ns",
            "population",
            "kernel_us",
            "consistent",
            "path",
            "step_context",
            "step_generation",
            "step_context_tokens",
            "step_generation_tokens",
        ),
        _forward_rows,
    ),
    "steady.csv": Table(
        (
            "window",
            "first",
            "last",
            "forwards",
            "population_mean",
            "kernel_us_mean",
            "forward_kernel_us_mean",
            "forward_span_us_mean",
        ),
        _steady_rows,
    ),
    "steady_paths.csv": Table(
        (
            "window",
            "path",
            "forwards",
            "first",
            "last",
            "population_mean",
            "kernel_us_mean",
            "below_minimum",
        ),
        _steady_path_rows,
    ),
    "ratios.csv": Table(
        ("from", "to", "population_ratio", "duration_ratio"), _ratio_rows, per_window=False
    ),
    "path_ratios.csv": Table(
        ("from", "to", "path", "population_ratio", "duration_ratio", "below_minimum"),
        _path_ratio_rows,
        per_window=False,
    ),
    "localisation.csv": Table(
        (
            "from",
            "to",
            "component",
            "kind",
            "from_us_per_token",
            "to_us_per_token",
            "delta_us_per_token",
            "share",
        ),
        _localisation_rows,
        per_window=False,
    ),
    "steps.csv": Table(
        (
            "window",
            "format",
            "ranges",
            "forwards",
            "matched",
            "steps",
            "shared",
            "missed",
            "agree",
            "population_equal",
            "population_above",
            "population_below",
        ),
        _steps_rows,
    ),
}
TABLES = tuple(TABLE_BUILDERS)


def profile_tables(result: ProfileResult | None, profile: ProfileRecord) -> dict[str, str]:
    """File name -> CSV text. A profile that was not made still gets its tables, empty."""
    pos = {label: i for i, label in enumerate(_windows(profile))}

    def by_window(rows: Rows) -> Rows:
        return sorted(rows, key=lambda r: (pos[r[0]], [_sortable(v) for v in r[1:]]))

    built = {name: (t, t.rows(result, profile)) for name, t in TABLE_BUILDERS.items()}
    return {
        name: _csv(t.columns, by_window(rows) if t.per_window else rows)
        for name, (t, rows) in built.items()
    }


def _step_columns(result: ProfileResult, label: str, device: str, index: int) -> list[Any]:
    st = result.forward_steps.get(label, {}).get((device, index))
    if st is None:
        return [None, None, None, None]
    return [st.context, st.generation, st.context_tokens, st.generation_tokens]


def _sortable(v: Any) -> tuple[int, Any]:
    if v is None:
        return (0, 0)
    if isinstance(v, bool):
        return (1, int(v))
    if isinstance(v, int | float):
        return (1, v)
    return (2, str(v))


def _num(v: Any, spec: str = ".3g") -> str:
    return render.num(v, spec)


def _trace_section(profile: ProfileRecord) -> list[str]:
    """The trace, the layer count and the main attention kernel; the GPUs that ran kernels
    and the telemetry's GPUs they are; the instantiations when the family merges several."""
    trace = profile.get("trace") or TraceInfo()
    settings = profile.get("settings") or ProfileSettings()
    lines = [
        f"Trace: {trace.get('kind')} ({', '.join(trace.get('files', []))}), clock "
        f"{trace.get('clock')}. Layers: {settings.get('layers')} "
        f"({settings.get('layers_source') or 'not given'}). Main attention kernel: "
        f"{', '.join(settings.get('attention_kernel') or []) or '-'}; population from "
        f"{settings.get('population_dim') or '-'}.",
        "",
    ]
    active = {d for w in (profile.get("windows") or {}).values() for d in w["active_fraction"]}
    gpus = [g for g in trace.get("gpus") or [] if g["id"] in active]
    if gpus:
        lines += [
            "GPUs that ran kernels (the trace's ids): "
            + "; ".join(
                f"{g['id']} = {g['uuid'] or 'no UUID'}, "
                + (
                    f"the telemetry's GPU {g['telemetry_device']} (by {g['matched_by']})"
                    if g["telemetry_device"] is not None
                    else "no telemetry GPU"
                )
                for g in gpus
            )
            + ".",
            "",
        ]
    inst = settings.get("attention_instantiations") or []
    if len(inst) > 1:
        lines += [
            f"Instantiations merged into the kernel family {settings.get('attention_family')}: "
            + "; ".join(f"{i['label']} {i['calls']} calls" for i in inst)
            + " (profile.json settings.attention_instantiations names them).",
            "",
        ]
    return lines


def _windows_section(profile: ProfileRecord) -> list[str]:
    """Per window: its source, coverage, active fraction, tokens and µs/token per family."""
    families = _family_order(profile)
    lines = render.md_table(
        ["window", "source", "coverage", "active fraction", "tokens"]
        + [f"{f} µs/token" for f in families],
        (
            [
                label,
                w["source"],
                _num(w.get("coverage"), ".2f"),
                "no kernel activity"
                if w.get("no_kernel_activity")
                else ", ".join(f"{d}: {v:.2f}" for d, v in w["active_fraction"].items()) or "-",
                _num(w["output_tokens"], ""),
                *(_num(us_per_token(w["families"].get(f))) for f in families),
            ]
            for label, w in profile["windows"].items()
        ),
    )
    return [*lines, ""]


def _forwards_section(profile: ProfileRecord) -> list[str]:
    """Per window: the forwards found and their steady state."""
    return render.md_table(
        [
            "window",
            "forwards",
            "violations",
            "steady range",
            "population",
            "attention µs per launch",
        ],
        (_forwards_row(label, w) for label, w in profile["windows"].items()),
    )


def _paths_section(profile: ProfileRecord) -> list[str]:
    """The main attention kernel by code path, with each path's steady state."""
    path_rows = [
        [
            label,
            p["path"],
            _num(p["calls"], ""),
            _num(p["us_per_token"]),
            _num(p["mean_us"]),
            _num(p["slope_us_per_seq"]),
            *_steady_path(w, p["path"]),
        ]
        for label, w in profile["windows"].items()
        for p in w["attention_paths"]
    ]
    if not path_rows:
        return []
    return [
        "",
        "Attention paths (the main attention kernel by code path):",
        "",
        *render.md_table(
            [
                "window",
                "path",
                "calls",
                "µs/token",
                "mean µs",
                "µs per sequence",
                "steady forwards",
                "steady population",
                "steady µs per launch",
            ],
            path_rows,
        ),
    ]


def _ratios_section(profile: ProfileRecord) -> list[str]:
    """The steady state's ratios from window to window."""
    if not profile.get("ratios"):
        return []
    return [
        "",
        *render.md_table(
            ["from", "to", "population ratio", "duration ratio"],
            (
                [r["from"], r["to"], _num(r["population_ratio"]), _num(r["duration_ratio"])]
                for r in profile["ratios"]
            ),
        ),
    ]


def _path_ratios_section(profile: ProfileRecord) -> list[str]:
    """Each attention path's steady-state ratios from window to window."""
    path_ratios = [
        [r["from"], r["to"], p["path"], _num(p["population_ratio"]), _num(p["duration_ratio"])]
        for r in profile.get("ratios") or []
        for p in r.get("paths") or []
    ]
    if not path_ratios:
        return []
    return [
        "",
        "Steady state per attention path, from window to window:",
        "",
        *render.md_table(["from", "to", "path", "population ratio", "duration ratio"], path_ratios),
    ]


def _steps_section(profile: ProfileRecord) -> list[str]:
    """vLLM's step ranges (NVTX) against the kernel-derived forwards, per window."""
    step_rows = [
        [
            label,
            st["format"],
            _num(st["ranges"], ""),
            _num(st["forwards"], ""),
            _num(st["matched"], ""),
            _num(st["missed"], ""),
            "-" if st["agree"] is None else ("yes" if st["agree"] else "no"),
            "/".join(_num(st["population"].get(k), "") for k in ("equal", "above", "below")),
        ]
        for label, w in profile["windows"].items()
        if (st := w.get("steps")) is not None
    ]
    if not step_rows:
        return []
    return [
        "",
        "vLLM's step ranges (NVTX) against the forwards:",
        "",
        *render.md_table(
            [
                "window",
                "format",
                "step ranges",
                "forwards",
                "launched in a step",
                "steps without a forward",
                "agree",
                "grid population =/>/< requests",
            ],
            step_rows,
        ),
    ]


def _verdicts_section(profile: ProfileRecord) -> list[str]:
    """The localisation verdicts, then the notes."""
    lines: list[str] = []
    for v in profile.get("localisation") or []:
        lines += ["", f"Localisation: {v['text']}"]
    for n in profile.get("notes") or []:
        lines += ["", f"Note: {n}"]
    return lines


# The report's sections, in order; each gives its lines.
MARKDOWN_SECTIONS: tuple[Callable[[ProfileRecord], list[str]], ...] = (
    _trace_section,
    _windows_section,
    _forwards_section,
    _paths_section,
    _ratios_section,
    _path_ratios_section,
    _steps_section,
    _verdicts_section,
)


def profile_markdown(profile: ProfileRecord, title: str = "Profile") -> str:
    """The report section of a profile (profile.md): a heading, then every section of
    MARKDOWN_SECTIONS, or the reason it was not profiled."""
    lines = [f"## {title}", ""]
    if profile.get("status") != "profiled":
        lines += [f"Not profiled: {profile.get('reason')}", ""]
        return "\n".join(lines)
    for section in MARKDOWN_SECTIONS:
        lines += section(profile)
    lines.append("")
    return "\n".join(lines)


def _forwards_row(label: str, w: WindowEntry) -> list[Any]:
    f, s = w["forwards"], w["steady"]
    return [
        label,
        f["count"] if f else "-",
        f["violations"] if f else "-",
        f"{s['first']}-{s['last']} ({s['forwards']})" if s else "-",
        _num(s and s["population_mean"]),
        _num(s and s["kernel_us_mean"]),
    ]


def _steady_path(w: WindowEntry, path: str) -> list[str]:
    s = w["steady"]
    p = next((p for p in (s.get("paths") if s else None) or [] if p["path"] == path), None)
    if p is None:
        return ["-", "-", "-"]
    few = " (below minimum)" if p.get("below_minimum") else ""
    return [
        _num(p["forwards"], "") + few,
        _num(p["population_mean"]),
        _num(p["kernel_us_mean"]),
    ]


def _family_order(profile: ProfileRecord) -> list[str]:
    fams = [f[0] for f in (profile.get("settings") or ProfileSettings()).get("families") or []]
    return fams + ["other"]
