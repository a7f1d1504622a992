"""The `profile_report` stage: one captured configuration's traces analyzed into profile.json,
the CSV tables and the report section (pure renderers plus thin writers).

Every table is sorted and every float printed with a fixed format, so the same profile gives
the same bytes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from servelab import render
from servelab.experiment import ProfileSection
from servelab.jsonio import read_json, write_json
from servelab.paths import ExperimentPaths
from servelab.profile.analyze import (
    PROFILE_FORMAT_VERSION,
    ProfileResult,
    TraceOptions,
    analyze_trace,
)
from servelab.profile.codepaths import parse_path_dims
from servelab.profile.forwards import layers_from_config
from servelab.profile.kernels import default_families, families_from_pairs
from servelab.profile.windows import load_windows

TABLES = (
    "active_fraction.csv",
    "families.csv",
    "kernels.csv",
    "attention_paths.csv",
    "forwards.csv",
    "steady.csv",
    "steady_paths.csv",
    "ratios.csv",
    "path_ratios.csv",
    "localisation.csv",
    "steps.csv",
)
REPORT = "profile.md"
# The tables' values are microsecond totals: 9 significant digits, as in profile.json.
DIGITS = 9


def not_profiled(
    reason: str, server_config: str | None = None, tool: str | None = None
) -> dict[str, Any]:
    return {
        "format_version": PROFILE_FORMAT_VERSION,
        "status": "not profiled",
        "reason": reason,
        "server_config": server_config,
        "tool": tool,
        "trace": None,
        "settings": None,
        "windows": {},
        "ratios": [],
        "localisation": [],
        "notes": [],
    }


def _csv(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    return render.csv_text(columns, rows, digits=DIGITS)


def profile_tables(result: ProfileResult | None, profile: dict[str, Any]) -> dict[str, str]:
    """File name -> CSV text. A profile that was not made still gets its tables, empty."""
    wins: dict[str, Any] = profile.get("windows") or {}
    order = list(wins)
    pos = {label: i for i, label in enumerate(order)}

    def by_window(rows: list[list[Any]]) -> list[list[Any]]:
        return sorted(rows, key=lambda r: (pos[r[0]], [_sortable(v) for v in r[1:]]))

    af = [[lb, d, v] for lb, w in wins.items() for d, v in w["active_fraction"].items()]
    fam = [
        [lb, name, f["calls"], f["total_us"], f["us_per_token"]]
        for lb, w in wins.items()
        for name, f in w["families"].items()
    ]
    paths = [
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
        for lb, w in wins.items()
        for p in w["attention_paths"]
    ]
    steady_paths = [
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
        for lb, w in wins.items()
        if (s := w["steady"]) is not None
        for p in s.get("paths") or []
    ]
    steady = [
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
        for lb, w in wins.items()
        if (s := w["steady"]) is not None
    ]
    steps = [
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
        for lb, w in wins.items()
        if (st := w.get("steps")) is not None
    ]
    kern: list[list[Any]] = []
    fwd: list[list[Any]] = []
    if result is not None:
        kern = [
            [lb, k["family"], k["kernel"], k["instantiations"], k["calls"], k["total_us"]]
            for lb, rows in result.kernels.items()
            for k in rows
        ]
        fwd = [
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
    ratio_rows = [
        [r["from"], r["to"], r["population_ratio"], r["duration_ratio"]]
        for r in profile.get("ratios") or []
    ]
    path_ratio_rows = [
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
    loc_rows = [
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
    return {
        "active_fraction.csv": _csv(["window", "device", "active_fraction"], by_window(af)),
        "families.csv": _csv(
            ["window", "family", "calls", "total_us", "us_per_token"], by_window(fam)
        ),
        "kernels.csv": _csv(
            ["window", "family", "kernel", "instantiations", "calls", "total_us"], by_window(kern)
        ),
        "attention_paths.csv": _csv(
            [
                "window",
                "path",
                "grids",
                "instantiations",
                "calls",
                "total_us",
                "us_per_token",
                "mean_us",
                "slope_us_per_seq",
            ],
            by_window(paths),
        ),
        "forwards.csv": _csv(
            [
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
            ],
            by_window(fwd),
        ),
        "steady.csv": _csv(
            [
                "window",
                "first",
                "last",
                "forwards",
                "population_mean",
                "kernel_us_mean",
                "forward_kernel_us_mean",
                "forward_span_us_mean",
            ],
            by_window(steady),
        ),
        "steady_paths.csv": _csv(
            [
                "window",
                "path",
                "forwards",
                "first",
                "last",
                "population_mean",
                "kernel_us_mean",
                "below_minimum",
            ],
            by_window(steady_paths),
        ),
        "ratios.csv": _csv(["from", "to", "population_ratio", "duration_ratio"], ratio_rows),
        "path_ratios.csv": _csv(
            ["from", "to", "path", "population_ratio", "duration_ratio", "below_minimum"],
            path_ratio_rows,
        ),
        "localisation.csv": _csv(
            [
                "from",
                "to",
                "component",
                "kind",
                "from_us_per_token",
                "to_us_per_token",
                "delta_us_per_token",
                "share",
            ],
            loc_rows,
        ),
        "steps.csv": _csv(
            [
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
            ],
            by_window(steps),
        ),
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


def profile_markdown(profile: dict[str, Any], title: str = "Profile") -> str:
    lines = [f"## {title}", ""]
    if profile.get("status") != "profiled":
        lines += [f"Not profiled: {profile.get('reason')}", ""]
        return "\n".join(lines)
    trace = profile.get("trace") or {}
    settings = profile.get("settings") or {}
    families = _family_order(profile)
    lines += [
        f"Trace: {trace.get('kind')} ({', '.join(trace.get('files', []))}), clock "
        f"{trace.get('clock')}. Layers: {settings.get('layers')} "
        f"({settings.get('layers_source') or 'not given'}). Main attention kernel: "
        f"{', '.join(settings.get('attention_kernel') or []) or '-'}; population from "
        f"{settings.get('population_dim') or '-'}.",
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
    windows = profile["windows"].items()
    lines += render.md_table(
        ["window", "source", "coverage", "active fraction", "tokens"]
        + [f"{f} µs/token" for f in families],
        (
            [
                label,
                w["source"],
                _num(w.get("coverage"), ".2f"),
                ", ".join(f"{d}: {v:.2f}" for d, v in w["active_fraction"].items()) or "-",
                _num(w["output_tokens"], ""),
                *(_num(w["families"].get(f, {}).get("us_per_token")) for f in families),
            ]
            for label, w in windows
        ),
    )
    lines.append("")
    lines += render.md_table(
        [
            "window",
            "forwards",
            "violations",
            "steady range",
            "population",
            "attention µs per launch",
        ],
        (_forwards_row(label, w["forwards"], w["steady"]) for label, w in windows),
    )
    path_rows = [
        [
            label,
            p["path"],
            _num(p["calls"], ""),
            _num(p["us_per_token"]),
            _num(p["mean_us"]),
            _num(p["slope_us_per_seq"]),
            *_steady_path(w["steady"], p["path"]),
        ]
        for label, w in windows
        for p in w["attention_paths"]
    ]
    if path_rows:
        lines += ["", "Attention paths (the main attention kernel by code path):", ""]
        lines += render.md_table(
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
        )
    if profile.get("ratios"):
        lines.append("")
        lines += render.md_table(
            ["from", "to", "population ratio", "duration ratio"],
            (
                [r["from"], r["to"], _num(r["population_ratio"]), _num(r["duration_ratio"])]
                for r in profile["ratios"]
            ),
        )
    path_ratios = [
        [r["from"], r["to"], p["path"], _num(p["population_ratio"]), _num(p["duration_ratio"])]
        for r in profile.get("ratios") or []
        for p in r.get("paths") or []
    ]
    if path_ratios:
        lines += ["", "Steady state per attention path, from window to window:", ""]
        lines += render.md_table(
            ["from", "to", "path", "population ratio", "duration ratio"], path_ratios
        )
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
        for label, w in windows
        if (st := w.get("steps")) is not None
    ]
    if step_rows:
        lines += ["", "vLLM's step ranges (NVTX) against the forwards:", ""]
        lines += render.md_table(
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
        )
    for v in profile.get("localisation") or []:
        lines += ["", f"Localisation: {v['text']}"]
    for n in profile.get("notes") or []:
        lines += ["", f"Note: {n}"]
    lines.append("")
    return "\n".join(lines)


def _forwards_row(label: str, f: dict[str, Any] | None, s: dict[str, Any] | None) -> list[Any]:
    return [
        label,
        f["count"] if f else "-",
        f["violations"] if f else "-",
        f"{s['first']}-{s['last']} ({s['forwards']})" if s else "-",
        _num(s and s["population_mean"]),
        _num(s and s["kernel_us_mean"]),
    ]


def _steady_path(s: dict[str, Any] | None, path: str) -> list[str]:
    p = next((p for p in (s or {}).get("paths") or [] if p["path"] == path), None)
    if p is None:
        return ["-", "-", "-"]
    few = " (below minimum)" if p.get("below_minimum") else ""
    return [
        _num(p["forwards"], "") + few,
        _num(p["population_mean"]),
        _num(p["kernel_us_mean"]),
    ]


def _family_order(profile: dict[str, Any]) -> list[str]:
    fams = [f[0] for f in (profile.get("settings") or {}).get("families") or []]
    return fams + ["other"]


def write_profile(
    out: Path, profile: dict[str, Any], result: ProfileResult | None, title: str = "Profile"
) -> list[Path]:
    """profile.json, the tables and profile.md into `out`; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in profile_tables(result, profile).items():
        p = out / name
        _write_text(p, text)
        written.append(p)
    md = out / REPORT
    _write_text(md, profile_markdown(profile, title))
    pj = out / "profile.json"
    write_json(pj, profile)
    return [pj, md, *written]


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def analyze_capture(
    profile: ProfileSection, paths: ExperimentPaths, sc: str, model_dir: Path
) -> dict[str, Any]:
    """profile.json, tables and profile.md for one captured configuration."""
    out = paths.profile(sc)
    capture = read_json(out / "capture.json")
    title = f"Profile: {sc}"
    if capture.get("status") != "profiled":
        record = not_profiled(str(capture.get("reason")), sc, capture.get("tool"))
        write_profile(out, record, None, title)
        return record
    opts = TraceOptions(
        layers=layers_from_config(model_dir / "config.json"),
        layers_source="model config.json",
        families=(
            families_from_pairs(
                ((f["name"], f["regex"]) for f in profile.families), "profile.families"
            )
            if profile.families
            else default_families()
        ),
        attention_kernel=profile.attention_kernel,
        band=profile.band,
        path_dims=parse_path_dims(profile.path_dims, "profile.path_dims"),
        path_dims_source="profile.path_dims" if profile.path_dims is not None else None,
    )
    traces = [out / t for t in capture["traces"] if not t.endswith(".nsys-rep")]
    result = analyze_trace(traces, load_windows(out / "windows.json"), opts)
    record = {**result.profile, "server_config": sc, "tool": capture["tool"]}
    write_profile(out, record, result, title)
    return record
