"""vllm bench serve's results, and other tools' read into its shape (servelab.analysis.peers):
a tree of ROOT/rep_<NN>/concurrency_<CCC>/ (runs at a concurrency, --max-concurrency C) or
ROOT/rep_<NN>/rate_<R>/ (runs at a request rate, --request-rate R) point folders, one server
configuration per root. Here: finding the point files (`vllm_bench_files`), each point's
metrics with servelab's definitions from its per-request lists (`vllm_bench_metrics`; from its
aggregates where it has none, `aggregate_metrics`), its arrival process, and its validity
checks (`bench_checks`). servelab.analysis.dataset turns them into points.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, cast

from servelab.analysis.peers import point_file, read_point
from servelab.analysis.validity import (
    NOT_CHECKED,
    Flag,
    checks_for,
    evaluate,
    facts_from_bench,
)
from servelab.analysis.validity.facts import BenchJson
from servelab.analysis.validity.openloop import (
    achieved_rate,
    arrival_rate_flag,
    cap_reached_flag,
    send_slip_flag,
)
from servelab.design.level import RATE, Level
from servelab.errors import ServelabError
from servelab.experiment import ValiditySection
from servelab.metrics import PERCENTILES, PointMetrics, assemble, supported

VLLM_REP = re.compile(r"^rep_(\d+)$")
VLLM_CONC = re.compile(r"^concurrency_(\d+)$")
VLLM_RATE = re.compile(r"^rate_(inf|\d+(?:\.\d+)?)$")
VLLM_TREE = "rep_<NN>/concurrency_<CCC>/benchmark.json or rep_<NN>/rate_<R>/benchmark.json"
NOT_BY_BENCH = "not recorded by vllm bench"


def _s_to_ms(xs: list[float]) -> list[float]:
    return [float(x) * 1000.0 for x in xs]


def vllm_bench_metrics(
    bench: BenchJson, source: str
) -> tuple[PointMetrics, list[float], list[tuple[float, float | None, float]]]:
    """Metrics of one benchmark.json, from its per-request lists, with servelab's definitions;
    one saved without them (no --save-detailed) from its aggregates (`aggregates_only`)."""
    if aggregates_only(bench):
        return aggregate_metrics(bench, source), [], []
    for key in ("ttfts", "itls", "output_lens", "duration"):
        if key not in bench:
            raise ServelabError(
                f"{source}: key {key!r} missing; save with --save-result --save-detailed"
            )
    n = len(bench["ttfts"])
    errors = bench.get("errors") or [""] * n
    input_lens = bench.get("input_lens") or [0] * n
    itls = bench["itls"]
    latencies = bench.get("latencies")
    ttft, tpot, e2el, itl_all = [], [], [], []
    per: list[tuple[float, float | None, float]] = []
    total_in = total_out = 0
    completed = 0
    for i in range(n):
        if errors[i] or bench["output_lens"][i] in (0, None):
            continue
        out = int(bench["output_lens"][i])
        completed += 1
        total_in += int(input_lens[i] or 0)
        total_out += out
        first = bench["ttfts"][i]
        gaps = _s_to_ms(itls[i] or [])
        itl_all.extend(gaps)
        if first is None:  # completed, its first token untimed: in the counts, not the latencies
            if latencies:
                e2el.append(float(latencies[i]) * 1000.0)
            continue
        t = float(first) * 1000.0
        e = float(latencies[i]) * 1000.0 if latencies else t + sum(gaps)
        tp = (e - t) / (out - 1) if out > 1 else None
        ttft.append(t)
        e2el.append(e)
        if tp is not None:
            tpot.append(tp)
        per.append((t, tp, e))
    m = assemble(
        num_prompts=n,
        completed=completed,
        duration=float(bench["duration"]),
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        latencies_ms={"ttft": ttft, "tpot": tpot, "itl": itl_all, "e2el": e2el},
    )
    m["client_cpu_s"] = None
    return m, ttft, per


# what a benchmark.json without per-request lists must hold to be read from its aggregates
AGGREGATE_KEYS = ("duration", "completed", "total_output_tokens", "mean_ttft_ms")
AGGREGATES_ONLY = (
    "aggregates only: the file holds no per-request records (vllm bench without "
    "--save-detailed), so no check on requests can run"
)


def aggregates_only(bench: BenchJson) -> bool:
    """A vllm bench result saved without its per-request lists (no --save-detailed)."""
    return "ttfts" not in bench and all(k in bench for k in AGGREGATE_KEYS)


def aggregate_metrics(bench: BenchJson, source: str) -> PointMetrics:
    """A point's metrics from vllm bench's aggregates: its counts, duration and each latency's
    mean, median and std as it computed them; a percentile only where its count of requests
    can support one (metrics.samples_needed), without an interval (no sample to bound it)."""
    raw: Mapping[str, object] = cast(Mapping[str, object], bench)
    completed = int(cast(int, raw["completed"]))
    failed = raw.get("failed")
    m = assemble(
        num_prompts=completed + (int(failed) if isinstance(failed, int) else 0),
        completed=completed,
        duration=float(cast(float, raw["duration"])),
        total_input_tokens=int(cast(int, raw.get("total_input_tokens") or 0)),
        total_output_tokens=int(cast(int, raw["total_output_tokens"])),
        latencies_ms={},
    )
    for name in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", *(f"p{p}" for p in PERCENTILES)):
            value = raw.get(f"{stat}_{name}_ms")
            if not isinstance(value, int | float):
                continue
            if stat.startswith("p") and not supported(completed, float(stat[1:])):
                continue
            m[f"{stat}_{name}_ms"] = float(value)
        if raw.get(f"mean_{name}_ms") is not None:
            m[f"n_{name}"] = completed
    m["client_cpu_s"] = None
    return m


@dataclass(frozen=True)
class BenchFile:
    """One benchmark.json of a vllm-bench tree: its repeat (rep_<NN>) and what its folder names,
    a concurrency (concurrency_<CCC>) or a request rate (rate_<R>, R as given to --request-rate)."""

    path: Path
    repeat: int
    axis: str  # "concurrency" | "rate"
    folder_level: str  # the level as the folder spells it
    tool: str = "vllm"  # the tool that wrote it (servelab.analysis.peers.POINT_FILES)

    def read(self) -> BenchJson:
        """The point's results as vllm bench's per-request lists (another tool's, adapted)."""
        return read_point(self.path, self.tool)

    def concurrency(self, bench: BenchJson) -> int:
        """A concurrency point's level: benchmark.json's max_concurrency, else the folder's."""
        return int(bench.get("max_concurrency") or self.folder_level)

    def rate(self, bench: BenchJson) -> float:
        """A rate point's level: benchmark.json's request_rate, else the folder's; a finite
        rate above 0, or a one-line error (vLLM's default rate, inf, sends every request at
        once: that is no rate point)."""
        if bench.get("ramp_up_strategy") is not None:
            raise ServelabError(
                f"{self.path}: a ramp-up run (ramp_up_strategy {bench['ramp_up_strategy']!r}) "
                "has no single request rate; measure each rate with --request-rate R"
            )
        given = bench.get("request_rate")
        given = self.folder_level if given is None else given
        try:
            rate = float(given)
        except (TypeError, ValueError):
            raise ServelabError(f"{self.path}: request_rate {given!r} is not a number") from None
        if math.isinf(rate):
            raise ServelabError(
                f"{self.path}: request rate inf (vllm bench serve's default: every request at "
                "once) is not a rate point; measure with --request-rate R, or file it under "
                "concurrency_<CCC>"
            )
        if not rate > 0:
            raise ServelabError(f"{self.path}: request rate {given!r} is not above 0")
        return rate

    def level(self, bench: BenchJson) -> Level:
        """The point's concurrency or request rate (as `axis` says)."""
        if self.axis == RATE:
            return Level.at_rate(self.rate(bench))
        return Level.at_concurrency(self.concurrency(bench))


def vllm_bench_files(root: Path) -> list[BenchFile]:
    """Every point file of a vllm-bench tree (vllm bench's benchmark.json, or another tool's
    results: servelab.analysis.peers), by repeat, then folder name; a tree that holds
    both concurrency_<CCC> and rate_<R> folders is a one-line error (one sweep per root)."""
    files, axes = [], set()
    # the repeat folders, each with its name's match of VLLM_REP
    reps = {d: rm for d in root.glob("rep_*") if d.is_dir() and (rm := VLLM_REP.match(d.name))}
    for rep_dir in sorted(reps):
        rep = int(reps[rep_dir].group(1))
        for d in sorted(rep_dir.iterdir()):
            for axis, pattern in (("concurrency", VLLM_CONC), ("rate", VLLM_RATE)):
                m = pattern.match(d.name)
                if m is None or not d.is_dir():
                    continue
                axes.add(axis)
                found = point_file(d)
                if found is not None:
                    files.append(BenchFile(found[0], rep, axis, m.group(1), found[1]))
    if len(axes) > 1:
        raise ServelabError(
            f"{root}: holds both concurrency_<CCC> and rate_<R> folders; a vllm-bench tree is a "
            "sweep over concurrency or over request rate: give each its own folder"
        )
    return files


class Arrival(TypedDict):
    """A rate point's arrival process (`extra["arrival"]` of a vllm-bench point)."""

    process: str
    burstiness: float
    max_in_flight: int | None
    requests: int
    # of the gaps between scheduled sends (where the file records them), how many equal an
    # earlier gap to the microsecond: draws of a continuous process never do (None: no schedule)
    repeated_gaps: int | None
    # requests scheduled before the run began: a recorded wait longer than the whole point,
    # a schedule anchored elsewhere (sent at once on arrival; None: no schedule)
    scheduled_early: int | None
    # the schedule's own rate (req/s, from the recorded schedule; None: none recorded)
    scheduled_rate: float | None


def bench_arrival(bench: BenchJson) -> Arrival:
    """A rate point's arrival process as far as benchmark.json records it: `process` (gamma
    gaps of shape `burstiness`, vLLM's default 1: poisson; an infinite one: constant;
    `schedule`: send times the tool was handed, AIPerf's --fixed-schedule),
    `burstiness` (1 for poisson and constant, as servelab records them), `max_in_flight`
    (--max-concurrency, None without a cap), `requests`, and what the schedule shows where
    the file records one (AIPerf's, GuideLLM's): `repeated_gaps`, `scheduled_early` and
    `scheduled_rate`."""
    b = bench.get("burstiness")
    burst = 1.0 if b is None else float(b)
    process = "constant" if math.isinf(burst) else "poisson" if burst == 1.0 else "gamma"
    if bench.get("fixed_schedule"):  # send times handed to the tool, not drawn by it
        process, burst = "schedule", 1.0
    cap = bench.get("max_concurrency")
    scheduled = scheduled_sends(bench)
    early = None
    if scheduled is not None:  # every wait is recorded: those not of this run's schedule
        early = len(scheduled) - len(run_waits(bench))
    return {
        "process": process,
        "burstiness": burst if process == "gamma" else 1.0,
        "max_in_flight": int(cap) if cap else None,
        "requests": len(bench["ttfts"]),
        "repeated_gaps": repeated_gaps(scheduled),
        "scheduled_early": early,
        "scheduled_rate": None if scheduled is None else achieved_rate(scheduled),
    }


def run_waits(bench: BenchJson) -> list[float]:
    """The recorded waits between falling due and the send (s) of the requests scheduled
    within the run (a wait longer than the point's duration belongs to a schedule anchored
    before the run began: `scheduled_early` counts those)."""
    duration = float(bench.get("duration") or 0.0)
    waits = [float(w) for w in bench.get("client_waits") or [] if w is not None]
    return [w for w in waits if w <= duration]


def scheduled_sends(bench: BenchJson) -> list[float] | None:
    """Each request's scheduled send (s, on the clock of `start_times`), in order: its send
    less its wait in the client between falling due and the send (`client_waits`, which the
    AIPerf and GuideLLM readers give); None where a wait is not recorded (vllm bench)."""
    sends, waits = bench.get("start_times"), bench.get("client_waits")
    if not sends or not waits or len(sends) != len(waits) or any(w is None for w in waits):
        return None
    return sorted(float(s) - float(w or 0.0) for s, w in zip(sends, waits, strict=True))


def repeated_gaps(scheduled: list[float] | None) -> int | None:
    """How many gaps between consecutive scheduled sends equal an earlier gap to the
    microsecond (None: no schedule)."""
    if scheduled is None:
        return None
    seen: set[int] = set()
    n = 0
    for a, b in itertools.pairwise(scheduled):
        gap = round((b - a) * 1e6)
        n += gap in seen
        seen.add(gap)
    return n


def bench_ends(bench: BenchJson, sends: list[float]) -> list[float]:
    """Each request's end on the clock of `start_times` (s): its send plus `latencies`, else
    plus TTFT and the ITLs (a failed request: its send)."""
    n = len(sends)
    lat = bench.get("latencies")
    if lat and len(lat) == n:
        return [s + float(x or 0.0) for s, x in zip(sends, lat, strict=True)]
    itls = bench.get("itls") or [None] * n
    ttfts = bench["ttfts"]
    return [
        s + float(ttfts[i] or 0.0) + sum(float(g) for g in itls[i] or [])
        for i, s in enumerate(sends)
    ]


def _bench_arrival_rate(
    bench: BenchJson, rate: float, own: float | None, t: ValiditySection
) -> Flag:
    """arrival_rate from the send times (`start_times`, after any wait for a slot) against
    the schedule's own rate where the file records the schedule (AIPerf, GuideLLM: as servelab
    checks its own points, since a drawn schedule differs from the target by sampling), else
    against the target: vLLM records no schedule, but scales its drawn gaps so that request N
    of N is due at N/R s, and its first send then differs from 1/R by sampling alone. `own`:
    the schedule's rate (bench_arrival's `scheduled_rate`; None: none recorded)."""
    limit = float(t.max_arrival_rate_error_pct)
    sends = sorted(float(x) for x in bench.get("start_times") or [])
    achieved = achieved_rate(sends)
    if achieved is None:
        why = "fewer than two requests sent at different times"
        if not sends:
            why = f"the send times (start_times) are {NOT_BY_BENCH}"
        return Flag("arrival_rate", NOT_CHECKED, None, limit, why)
    if own is not None:
        off = 100.0 * abs(achieved / own - 1.0)
        said = (
            f"requests sent at {achieved:.3g} req/s, their schedule's rate {own:.3g} req/s "
            f"(target {rate:g}; the schedule is each send less the tool's recorded wait): "
            f"{off:.2g}% off"
        )
    else:
        off = 100.0 * abs(achieved / rate - 1.0)
        said = (
            f"requests sent at {achieved:.3g} req/s, target {rate:g} req/s: {off:.2g}% off "
            f"(the schedule's own rate is {NOT_BY_BENCH}; vLLM scales its schedule to the "
            "target)"
        )
    return arrival_rate_flag(off, limit, said)


def _bench_cap_reached(bench: BenchJson, cap: int | None) -> Flag:
    """cap_reached from vllm bench's send times and waits for a slot (`queue_times`): a request
    was held when, as its schedule released it (its send less its wait), `cap` requests were
    sent and not ended."""
    if not cap:
        return Flag("cap_reached", NOT_CHECKED, None, None, "no cap on requests in flight")
    starts, queued = bench.get("start_times"), bench.get("queue_times")
    if not starts or not queued or len(starts) != len(queued):
        why = f"the waits for a slot (queue_times) are {NOT_BY_BENCH}"
        return Flag("cap_reached", NOT_CHECKED, None, None, why)
    sends = [float(x) for x in starts]
    sorted_sends = sorted(sends)
    ends = sorted(bench_ends(bench, sends))
    n = 0
    for s, q in zip(sends, queued, strict=True):
        due = s - float(q or 0.0)
        others = bisect.bisect_right(sorted_sends, due) - (s <= due)  # sent by then, not itself
        in_flight = others - bisect.bisect_right(ends, due)
        n += in_flight >= cap
    return cap_reached_flag(n, len(sends), cap, "released", "--max-concurrency")


def bench_checks(
    bench: BenchJson, level: Level, t: ValiditySection, arrival: Arrival | None = None
) -> tuple[Flag, ...]:
    """Every check on one benchmark.json. A rate point's open-loop checks read what vllm bench
    records: the send times and waits for a slot (`start_times`, `queue_times`, in newer
    versions), never the scheduled send times, so `send_slip` is not checked. A file of
    aggregates only has every check not run, saying so. `arrival`: the point's bench_arrival,
    where the caller has it already."""
    if aggregates_only(bench):
        return tuple(
            Flag(c.name, NOT_CHECKED, None, None, AGGREGATES_ONLY) for c in checks_for(level.axis)
        )
    if not level.is_rate:
        return evaluate(facts_from_bench(bench), t)
    arrival = arrival or bench_arrival(bench)
    flags = evaluate(facts_from_bench(bench, level, arrival), t)
    own = {
        "arrival_rate": _bench_arrival_rate(
            bench, float(level.value), arrival["scheduled_rate"], t
        ),
        "send_slip": _bench_send_slip(bench, arrival, t),
        "cap_reached": _bench_cap_reached(bench, arrival["max_in_flight"]),
    }
    return tuple(own.get(f.check, f) for f in flags)


def _bench_send_slip(bench: BenchJson, arrival: Arrival, t: ValiditySection) -> Flag:
    """send_slip from the waits between falling due and the send that another tool's file
    records (AIPerf's, GuideLLM's `client_waits`), read as servelab reads its own slips: their
    90th percentile. Not checked without them (vllm bench records no schedule) or under a cap
    on requests in flight (the file does not tell a wait for a slot from a late send)."""
    limit = float(t.max_send_slip_ms)
    early = arrival["scheduled_early"]
    if early is None:
        why = f"the scheduled send times are {NOT_BY_BENCH}"
        return Flag("send_slip", NOT_CHECKED, None, limit, why)
    if arrival["max_in_flight"]:
        why = "the tool's waits for a slot (max_concurrency) are not told apart from late sends"
        return Flag("send_slip", NOT_CHECKED, None, limit, why)
    slips = sorted(1000.0 * float(w or 0.0) for w in bench.get("client_waits") or [])
    more = ""
    if early:
        more = (
            f"; {early} of them were scheduled before the run began, a schedule anchored "
            "elsewhere, and went out at once"
        )
    source = "; the tool's own record of each request's wait after falling due"
    return send_slip_flag(slips, limit, source, more)
