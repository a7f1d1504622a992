"""The records of profile.json, typed: the whole profile (`ProfileRecord`), a window's entry
(`WindowEntry`) and the rows inside it, the ratios and localisation verdicts between windows,
the analysis settings and the trace's facts. Written by servelab.profile.trace_analysis (and
the modules it calls), read by servelab.profile.rendering. Then what capture.json keeps of a
capture (servelab.profile.capture): its points, its progress and the nsys report.

Keys that are Python keywords (`from`) make some records use TypedDict's functional form.
Fields added within format 2 (see trace_analysis.PROFILE_FORMAT_VERSION) are NotRequired:
a reader may meet a profile.json written before them.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict


class FamilyRow(TypedDict):
    """A kernel family's time in a window (WindowEntry.families[name])."""

    calls: int
    total_us: float
    us_per_token: float | None


def us_per_token(family: FamilyRow | None) -> float | None:
    """A family row's µs per output token; None for a family the window does not list."""
    return family.get("us_per_token") if family is not None else None


class KernelRow(TypedDict):
    """A kernel (or kernel family, nsys) in a window: kernels.csv's rows."""

    kernel: str
    family: str
    instantiations: int
    calls: int
    total_us: float


class GridPathRow(TypedDict):
    """A launch grid's time in a window (kernels.paths_table)."""

    path: str
    grid: list[int] | None
    calls: int
    total_us: float
    us_per_token: float | None
    mean_us: float | None


class AttentionPath(TypedDict):
    """The main attention kernel's time on one code path (WindowEntry.attention_paths)."""

    path: str
    grid: list[int | None] | None
    grids: int
    instantiations: NotRequired[list[str]]
    calls: int
    total_us: float
    us_per_token: float | None
    mean_us: float | None
    slope_us_per_seq: float | None


class SteadyPath(TypedDict):
    """One attention path's own steady state (Steady.paths)."""

    path: str
    forwards: int
    first: NotRequired[int]
    last: NotRequired[int]
    population_mean: float
    kernel_us_mean: float
    below_minimum: NotRequired[bool]


class Steady(TypedDict):
    """A window's steady state: the run of forwards of a stable population."""

    first: int
    last: int
    forwards: int
    population_mean: float
    kernel_us_mean: float
    forward_kernel_us_mean: float
    forward_span_us_mean: float
    paths: NotRequired[list[SteadyPath]]


class ForwardsInfo(TypedDict):
    """The forwards found on a window's reported device (WindowEntry.forwards)."""

    device: str
    count: int
    layers: int
    launches: int
    offset: int
    violations: int
    path_splits: int


class StepsEntry(TypedDict):
    """vLLM's step ranges (NVTX) against a window's forwards (WindowEntry.steps)."""

    format: str
    ranges: int
    forwards: int
    projected: bool
    matched: int | None
    steps: int | None
    shared: int | None
    missed: int | None
    agree: bool | None
    kinds: dict[str, int]
    population: dict[str, int]
    paths: dict[str, dict[str, int]]


class WindowEntry(TypedDict):
    """One window of profile.json (ProfileRecord.windows[label])."""

    start_ns: int
    end_ns: int
    source: str
    output_tokens: int | None
    requests: int | None
    length_us: float
    coverage: float | None
    tokens_source: str
    active_fraction: dict[str, float]
    idle_gpus: NotRequired[list[str]]
    families: dict[str, FamilyRow]
    attention_kernel: str | None
    attention_paths: list[AttentionPath]
    forwards: ForwardsInfo | None
    steady: Steady | None
    no_kernel_activity: NotRequired[bool]
    steps: NotRequired[StepsEntry | None]


class PathRatio(TypedDict):
    """One attention path's steady-state ratios from a window to the next."""

    path: str
    population_ratio: float | None
    duration_ratio: float | None
    below_minimum: NotRequired[bool]


RatioRow = TypedDict(
    "RatioRow",
    {
        "from": str,
        "to": str,
        "population_ratio": float | None,
        "duration_ratio": float | None,
        "paths": NotRequired[list[PathRatio]],
    },
)
"""The steady state's ratios from a window to the next (ProfileRecord.ratios)."""


class Component(TypedDict):
    """A component's time per output token in two windows (Verdict.components)."""

    component: str
    kind: str
    from_us_per_token: float | None
    to_us_per_token: float | None
    delta_us_per_token: float | None
    share: NotRequired[float | None]


Verdict = TypedDict(
    "Verdict",
    {
        "from": str,
        "to": str,
        "stated": bool,
        "reasons": list[str],
        "delta_us_per_token": float | None,
        "component": str | None,
        "path_ratio": PathRatio | None,
        "components": list[Component],
        "text": str,
    },
)
"""The localisation verdict between two consecutive windows (ProfileRecord.localisation)."""


class Instantiation(TypedDict):
    """An instantiation merged into the main attention kernel's family."""

    label: str
    kernel: str
    name: str
    calls: int
    total_us: float


class Settings(TypedDict, total=False):
    """How the trace was analyzed (ProfileRecord.settings). Not total: a reader takes what
    is there (`attention_family`, `attention_instantiations` came within format 2)."""

    layers: int | None
    layers_source: str | None
    families: list[list[str]]
    attention_kernel: list[str]
    attention_family: str | None
    attention_instantiations: list[Instantiation]
    population_dim: str | None
    band: float
    path_dims: list[str] | None
    path_dims_source: str | None


class TraceGpu(TypedDict):
    """A GPU of an nsys trace and the telemetry's GPU it is (TraceInfo.gpus)."""

    id: str
    name: str
    uuid: str | None
    telemetry_device: int | None
    matched_by: str | None


class CudaDevice(TypedDict):
    """A process's CUDA device and the GPU it is (DeviceMap.cuda_devices)."""

    pid: int | None
    cuda_id: int
    gpu_id: int
    uuid: str | None
    by: str


class DeviceMap(TypedDict):
    """How an nsys trace's kernels were put on GPUs (TraceInfo.device_map)."""

    source: str
    cuda_devices: list[CudaDevice]


class NvtxInfo(TypedDict):
    """The NVTX an nsys trace holds (TraceInfo.nvtx)."""

    client_ranges: dict[str, int]
    step_ranges: int
    step_formats: list[str]
    steps_projected: bool


class TraceInfo(TypedDict, total=False):
    """The trace's facts (ProfileRecord.trace). Not total: the facts differ by trace kind
    (`device_map`, `nvtx` and `gpus` are an nsys trace's) and `files` is added after."""

    kind: str
    clock: str
    session_start_utc_ns: int | None
    exporter: dict[str, str]
    devices: dict[str, str]
    device_map: DeviceMap
    tables_absent: list[str]
    files: list[str]
    nvtx: NvtxInfo
    gpus: list[TraceGpu]


class ProfileRecord(TypedDict):
    """profile.json: a configuration's profile, or why it was not profiled."""

    format_version: int
    status: str
    reason: str | None
    server_config: NotRequired[str | None]
    tool: NotRequired[str | None]
    trace: TraceInfo | None
    settings: Settings | None
    windows: dict[str, WindowEntry]
    ratios: list[RatioRow]
    localisation: list[Verdict]
    notes: list[str]


# --- capture.json ---------------------------------------------------------------------------


class NsysReport(TypedDict):
    """capture.json's nsys_report: the report (relative to the profile folder), when nsys
    wrote it, how it was found and how long the job waited for it."""

    path: str
    generated: str
    found_by: str
    wait_s: float


class PointRow(TypedDict):
    """One diagnostic point as capture.json's `points` lists it."""

    label: str
    concurrency: int
    requests: int
    failed: int
    output_tokens: int
    duration_s: float
    trace_write_s: float


class Progress(TypedDict, total=False):
    """What capture.json keeps of a capture, also when it fails: the launch (how the profiler
    is driven, its command and environment, its start and lock), the points captured so far
    and the nsys report (and how long the job waited for it)."""

    interface: str
    command: list[str]
    env: dict[str, str]
    ready_s: float
    start: dict[str, object]
    lock: dict[str, object]
    points: list[PointRow]
    nsys_report: NsysReport
    report_wait_s: float
