"""Windows: the diagnostic points of a profile pass as windows.json records them, read and
checked, and mapped into a trace's own clock.

A window is one point's wall-clock interval (the client's clock, "epoch") or an interval on
the trace's clock ("trace"); the readers resolve it to trace timestamps (`ResolvedWindow`), and
every kernel belongs to at most one window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from servelab.documents import JsonValue
from servelab.errors import ServelabError
from servelab.store.records import WindowsRecord

# The format of windows.json (servelab.store.records.WindowsRecord).
FORMAT_VERSION = WindowsRecord.FORMAT_VERSION
CLOCKS = ("trace", "epoch")


@dataclass(frozen=True)
class Window:
    """One diagnostic point as windows.json records it."""

    label: str
    start_ns: int
    end_ns: int
    clock: str
    output_tokens: int | None
    extra: Mapping[str, JsonValue] = field(default_factory=dict)


@dataclass(frozen=True)
class ResolvedWindow:
    """A window in the trace's own timestamps, and how it was found."""

    label: str
    lo: int
    hi: int
    source: str  # wallclock | nvtx | trace
    output_tokens: int | None
    requests: int | None = None
    coverage: float | None = None  # share of the window the trace covers (torch traces)
    tokens_source: str = "client"  # client | trace steps

    @property
    def length_ns(self) -> int:
        return self.hi - self.lo


def parse_windows(data: JsonValue, source: str) -> list[Window]:
    if not isinstance(data, dict) or not isinstance(windows := data.get("windows"), list):
        raise ServelabError(f'{source}: expected {{"windows": [...]}}')
    version = data.get("format_version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise ServelabError(
            f"{source}: format_version {version!r} is not supported (this servelab reads "
            f"{FORMAT_VERSION}); recapture or upgrade servelab"
        )
    out: list[Window] = []
    for i, w in enumerate(windows):
        where = f"{source}: windows[{i}]"
        if not isinstance(w, dict):
            raise ServelabError(f"{where}: expected an object")
        for key in ("label", "start_ns", "end_ns", "clock"):
            if key not in w:
                raise ServelabError(f"{where}: missing {key!r}")
        label, start, end, clock = w["label"], w["start_ns"], w["end_ns"], w["clock"]
        if not isinstance(label, str) or not label:
            raise ServelabError(f"{where}.label: expected a non-empty string")
        if not isinstance(start, int) or not isinstance(end, int) or end <= start:
            raise ServelabError(f"{where}: start_ns and end_ns must be integers, start < end")
        if not isinstance(clock, str) or clock not in CLOCKS:
            raise ServelabError(f"{where}.clock: {clock!r} is not one of {', '.join(CLOCKS)}")
        tokens = w.get("output_tokens")
        if tokens is not None and (not isinstance(tokens, int) or tokens < 0):
            raise ServelabError(f"{where}.output_tokens: expected a non-negative integer")
        extra = {k: v for k, v in w.items() if k not in {"label", "start_ns", "end_ns", "clock"}}
        extra.pop("output_tokens", None)
        out.append(Window(label, start, end, clock, tokens, extra))
    labels = [w.label for w in out]
    if len(set(labels)) != len(labels):
        raise ServelabError(f"{source}: window labels must differ: {labels}")
    return out


def load_windows(path: Path) -> list[Window]:
    """The windows of a windows.json, the file checked (WindowsRecord) and then each window."""
    return parse_windows(WindowsRecord.read(path).doc, str(path))


def windows_json(windows: Sequence[Window], **top: JsonValue) -> dict[str, object]:
    """windows.json: the windows and the capture's top-level facts (`top`). Its
    `client_nvtx_emitted` says whether the client emitted NVTX ranges (the nvtx package
    imported), not whether a trace holds them: the client runs on the host, outside the
    server's Nsight Systems session, so a trace holds them only when the client ran under the
    same session (older captures name it `nvtx`). The analysis records what the trace holds
    (profile.json `trace.nvtx`). `point_gap_s` (nsys): the idle time between two points."""
    rows = []
    for w in windows:
        rows.append(
            {
                **dict(w.extra),
                "label": w.label,
                "start_ns": w.start_ns,
                "end_ns": w.end_ns,
                "clock": w.clock,
                "output_tokens": w.output_tokens,
            }
        )
    return WindowsRecord.new({**top, "windows": rows}).doc


def to_trace_clock(
    w: Window, trace_clock: str, session_start_ns: int | None, source: str
) -> tuple[int, int]:
    """Map a window into the trace's timestamps.

    An nsys trace counts from the session start unless it was exported with --ts-normalize
    (then it is epoch); TARGET_INFO_SESSION_START_TIME.utcEpochNs bridges the two.
    """
    if w.clock == trace_clock:
        return w.start_ns, w.end_ns
    if session_start_ns is None:
        raise ServelabError(
            f"{source}: window {w.label} is on the {w.clock} clock but the trace has no "
            "session start time (TARGET_INFO_SESSION_START_TIME) to bridge it; give windows "
            "on the trace's clock"
        )
    shift = -session_start_ns if w.clock == "epoch" else session_start_ns
    return w.start_ns + shift, w.end_ns + shift


def check_disjoint(windows: Sequence[ResolvedWindow], source: str) -> list[ResolvedWindow]:
    ordered = sorted(windows, key=lambda w: w.lo)
    for a, b in zip(ordered, ordered[1:], strict=False):
        if b.lo < a.hi:
            raise ServelabError(
                f"{source}: windows {a.label} and {b.label} overlap; each kernel must belong "
                "to one window"
            )
    return ordered
