"""The `profile_report` stage: one captured configuration's traces analyzed into profile.json,
the CSV tables and the report section (`analyze_capture`), and the writer of those files
(`write_profile`). The tables and the report are rendered by `servelab.profile.rendering`."""

from __future__ import annotations

from pathlib import Path

from servelab.documents.declared import ProfileRecord
from servelab.experiment import ProfileSection
from servelab.profile.codepaths import parse_path_dims
from servelab.profile.forwards import layers_from_config
from servelab.profile.gpumatch import TelemetryGpu, telemetry_gpus
from servelab.profile.kernels import default_families, families_from_pairs
from servelab.profile.rendering import REPORT, profile_markdown, profile_tables
from servelab.profile.trace_analysis import (
    PROFILE_FORMAT_VERSION,
    ProfileResult,
    TraceOptions,
    analyze_trace,
)
from servelab.profile.windows import load_windows
from servelab.store.jsonio import write_atomic, write_json
from servelab.store.paths import PROFILE_FILE, ExperimentPaths
from servelab.store.records import CaptureRecord


def not_profiled(
    reason: str, server_config: str | None = None, tool: str | None = None
) -> ProfileRecord:
    """The profile record of a configuration that was not profiled, and why."""
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


def write_profile(
    out: Path, profile: ProfileRecord, result: ProfileResult | None, title: str = "Profile"
) -> list[Path]:
    """profile.json, the tables and profile.md into `out`; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in profile_tables(result, profile).items():
        p = out / name
        write_atomic(p, text)
        written.append(p)
    md = out / REPORT
    write_atomic(md, profile_markdown(profile, title))
    pj = out / PROFILE_FILE
    write_json(pj, profile)
    return [pj, md, *written]


def _sampled_gpus(paths: ExperimentPaths, sc: str) -> tuple[TelemetryGpu, ...] | None:
    """The GPUs the telemetry of the configuration's measured points sampled (its launch is
    given the same GPUs as the profiling launch), or None when none were sampled."""
    points = [p for p in paths.point_files() if p.relative_to(paths.raw).parts[0] == sc]
    return telemetry_gpus(points) or None


def analyze_capture(
    profile: ProfileSection, paths: ExperimentPaths, sc: str, model_dir: Path
) -> ProfileRecord:
    """profile.json, tables and profile.md for one captured configuration."""
    out = paths.profile(sc)
    capture = CaptureRecord.read(paths.capture(sc)).doc
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
        telemetry_gpus=_sampled_gpus(paths, sc) if capture["tool"] == "nsys" else None,
    )
    traces = [out / t for t in capture["traces"] if not t.endswith(".nsys-rep")]
    result = analyze_trace(traces, load_windows(paths.windows(sc)), opts)
    record = {**result.profile, "server_config": sc, "tool": capture["tool"]}
    write_profile(out, record, result, title)
    return record
