"""Validity checks run on every measured point (docs/analysis.md#validity).

A check is a pure function of what was recorded for one point (its requests, its duration,
its telemetry summary) and the thresholds of the config's `analysis.validity` section. It
returns a Flag: passed, failed, noted (recorded, never excluding) or not checked (the data it
needs was not recorded). A failed check removes the metrics it affects from every statistic:
`latency` (TTFT, TPOT and ITL metrics: burst delivery leaves E2EL and throughput intact) or
`all`. The raw data stays as it was.

To add a check: write a function (PointFacts, Thresholds) -> Flag, add the facts it reads to
PointFacts (and to both builders), its threshold to Thresholds and to the schema, and an entry
to CHECKS.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from servelab.client import RequestRecord
from servelab.errors import ServelabError

FORMAT_VERSION = 1
PASSED, FAILED, NOTED, NOT_CHECKED = "passed", "failed", "noted", "not checked"
STATUSES = (PASSED, FAILED, NOTED, NOT_CHECKED)
LATENCY, ALL, NONE = "latency", "all", "none"
AFFECTS_WORDS = {LATENCY: "TTFT, TPOT, ITL", ALL: "every metric", NONE: "nothing (note)"}
LATENCY_METRIC = re.compile(r"_(ttft|tpot|itl)_ms$")
SECTION = "analysis.validity"

# streaming: a request is burst-delivered when its content came in at most this many reads
# while it has at least BURST_MIN_TOKENS output tokens (fewer tokens fit in two reads anyway)
BURST_MAX_READS = 2
BURST_MIN_TOKENS = 4
# vllm-bench trees keep one timestamp per chunk, not per read: chunks of one read are
# microseconds apart, so gaps under this count as the same read
BENCH_SAME_READ_S = 1e-4
ERROR_CHARS = 80


@dataclass(frozen=True)
class Thresholds:
    """The `analysis.validity` section; defaults are the schema's."""

    max_burst_share: float
    max_other_cpu_cores: float
    max_failed_requests: int
    min_point_duration_s: float

    @staticmethod
    def from_config(cfg: Mapping[str, Any] | None) -> Thresholds:
        from servelab.config import schema_defaults

        names = [f.name for f in fields(Thresholds)]
        given = dict(cfg or {})
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise ServelabError(
                f"{SECTION}.{unknown[0]}: not a validity threshold; use one of {', '.join(names)}"
            )
        values = {**schema_defaults("analysis", "validity"), **given}
        for name in names:
            v = values.get(name)
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
                raise ServelabError(f"{SECTION}.{name}: {v!r} is not a number >= 0")
        if values["max_burst_share"] > 1:
            raise ServelabError(
                f"{SECTION}.max_burst_share: {values['max_burst_share']!r} is a share: 0 to 1"
            )
        return Thresholds(
            max_burst_share=float(values["max_burst_share"]),
            max_other_cpu_cores=float(values["max_other_cpu_cores"]),
            max_failed_requests=int(values["max_failed_requests"]),
            min_point_duration_s=float(values["min_point_duration_s"]),
        )

    @staticmethod
    def defaults() -> Thresholds:
        return Thresholds.from_config(None)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RequestFacts:
    completed: bool  # succeeded and carried content
    output_tokens: int | None
    reads: int | None  # reads that carried content; None when unknown
    error: str | None


@dataclass(frozen=True)
class PointFacts:
    """What the checks read of one point, from either raw layout."""

    requests: tuple[RequestFacts, ...]
    duration_s: float | None  # first send to last completion; None when nothing completed
    telemetry: Mapping[str, Any] | None  # point.json's `telemetry` block
    no_telemetry: str = "no telemetry recorded"


@dataclass(frozen=True)
class Flag:
    check: str
    status: str
    value: float | None
    threshold: float | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Check:
    name: str
    definition: str
    affects: str  # LATENCY | ALL | NONE
    threshold_key: str | None  # key under analysis.validity
    run: Callable[[PointFacts, Thresholds], Flag]

    def removes(self, metric: str) -> bool:
        if self.affects == ALL:
            return True
        return self.affects == LATENCY and LATENCY_METRIC.search(metric) is not None

    def threshold(self, t: Thresholds) -> float | None:
        return None if self.threshold_key is None else float(getattr(t, self.threshold_key))


# --- facts from the raw layouts -------------------------------------------------------------


def facts_from_records(records: Sequence[RequestRecord], meta: Mapping[str, Any]) -> PointFacts:
    """servelab's layout: requests.jsonl.gz and point.json."""
    reqs = []
    for r in records:
        done = bool(r.ok and r.chunk_offsets_us)
        error = r.error if not done else None
        if not done and not error:
            error = "no content received" if r.ok else "failed without an error message"
        reqs.append(
            RequestFacts(
                completed=done,
                output_tokens=r.output_tokens,
                reads=len(set(r.chunk_offsets_us)) if done else None,
                error=error,
            )
        )
    good = [r for r in records if r.ok and r.chunk_offsets_us]
    duration = None
    if good:
        start = min(r.sent_epoch_ns for r in records)
        end = max(r.sent_epoch_ns + (r.done_offset_us or 0) * 1000 for r in good)
        duration = (end - start) / 1e9
    telemetry = meta.get("telemetry")
    return PointFacts(tuple(reqs), duration, telemetry if isinstance(telemetry, Mapping) else None)


def facts_from_bench(bench: Mapping[str, Any]) -> PointFacts:
    """A `vllm bench serve --save-detailed` benchmark.json: per-request ITLs stand in for reads
    (gaps under BENCH_SAME_READ_S join one read); no telemetry."""
    n = len(bench["ttfts"])
    errors = bench.get("errors") or [""] * n
    itls = bench.get("itls") or [None] * n
    reqs = []
    for i in range(n):
        out = bench["output_lens"][i]
        done = not errors[i] and out not in (0, None)
        gaps = itls[i] if i < len(itls) else None
        reads = 1 + sum(1 for g in gaps if float(g) >= BENCH_SAME_READ_S) if gaps else None
        reqs.append(
            RequestFacts(
                completed=done,
                output_tokens=int(out) if out is not None else None,
                reads=reads if done and gaps is not None else None,
                error=None if done else (str(errors[i]) or "no output"),
            )
        )
    duration = float(bench["duration"]) if any(r.completed for r in reqs) else None
    return PointFacts(tuple(reqs), duration, None, no_telemetry="not recorded by vllm bench")


# --- the checks -----------------------------------------------------------------------------


def _g(x: float) -> str:
    return f"{x:g}"


def check_streaming(f: PointFacts, t: Thresholds) -> Flag:
    limit = t.max_burst_share
    eligible = [r for r in f.requests if r.completed and (r.output_tokens or 0) >= BURST_MIN_TOKENS]
    known = [r for r in eligible if r.reads is not None]
    if not known:
        why = (
            "chunk arrival times not recorded"
            if eligible
            else f"no completed request with at least {BURST_MIN_TOKENS} output tokens"
        )
        return Flag("streaming", NOT_CHECKED, None, limit, why)
    burst = [r for r in known if (r.reads or 0) <= BURST_MAX_READS]
    how = "in one read" if all(r.reads == 1 for r in burst) and burst else "in one or two reads"
    share = len(burst) / len(known)
    said = f"{len(burst)} of {len(known)} requests delivered {how}"
    if share > limit:
        return Flag("streaming", FAILED, share, limit, f"{said} (limit {_g(100 * limit)}%)")
    return Flag("streaming", PASSED, share, limit, said)


def _block(d: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    v = d.get(key)
    return v if isinstance(v, Mapping) else {}


def _mean(d: Mapping[str, Any], key: str) -> float | None:
    v = _block(d, key).get("mean")
    return None if v is None else float(v)


def check_contention(f: PointFacts, t: Thresholds) -> Flag:
    limit = t.max_other_cpu_cores
    tel = f.telemetry
    if tel is None:
        return Flag("contention", NOT_CHECKED, None, limit, f.no_telemetry)
    if tel.get("enabled") is False:
        return Flag("contention", NOT_CHECKED, None, limit, "telemetry disabled")
    cpu = _block(tel, "cpu")
    if cpu.get("absent"):
        return Flag("contention", NOT_CHECKED, None, limit, f"no CPU telemetry: {cpu['absent']}")
    host, cores = _mean(cpu, "host_cpu_pct"), cpu.get("host_cpus")
    if host is None or not cores:
        return Flag("contention", NOT_CHECKED, None, limit, "no host CPU sample inside the point")
    own = [_mean(cpu, k) for k in ("server_cpu_pct", "client_cpu_pct", "telemetry_cpu_pct")]
    if any(v is None for v in own):
        err = cpu.get("server_error")
        why = f"server CPU unknown ({err})" if own[0] is None and err else "process CPU unknown"
        return Flag("contention", NOT_CHECKED, None, limit, why)
    # percent of all cores and percents of one core, as cores; sampling can put the difference
    # slightly below zero on an idle host
    other = max(0.0, host / 100.0 * int(cores) - sum(v or 0.0 for v in own) / 100.0)
    said = f"{other:.2f} CPU cores busy outside the server, client and samplers"
    if other > limit:
        return Flag("contention", FAILED, other, limit, f"{said} (limit {_g(limit)})")
    return Flag("contention", PASSED, other, limit, said)


def check_failed_requests(f: PointFacts, t: Thresholds) -> Flag:
    limit = float(t.max_failed_requests)
    n = len(f.requests)
    if n == 0:
        return Flag("failed_requests", NOT_CHECKED, None, limit, "no request recorded")
    bad = [r for r in f.requests if not r.completed]
    said = f"{len(bad)} of {n} requests failed"
    if len(bad) > limit:
        err = (bad[0].error or "")[:ERROR_CHARS]
        return Flag(
            "failed_requests",
            FAILED,
            float(len(bad)),
            limit,
            f"{said} (limit {t.max_failed_requests}; first: {err})",
        )
    return Flag("failed_requests", PASSED, float(len(bad)), limit, said)


def check_restarted_requests(f: PointFacts, t: Thresholds) -> Flag:
    tel = f.telemetry
    if tel is None:
        return Flag("restarted_requests", NOT_CHECKED, None, None, f.no_telemetry)
    srv = _block(tel, "server")
    n = srv.get("preemptions")
    if tel.get("enabled") is False or n is None:
        why = "telemetry disabled" if tel.get("enabled") is False else "no preemption counter"
        if srv.get("absent"):
            why = f"no server metrics: {srv['absent']}"
        return Flag("restarted_requests", NOT_CHECKED, None, None, why)
    if float(n) > 0:
        said = f"the server preempted requests {_g(float(n))} times (kept: server behaviour)"
        return Flag("restarted_requests", NOTED, float(n), None, said)
    return Flag("restarted_requests", PASSED, 0.0, None, "no preemption")


def check_min_duration(f: PointFacts, t: Thresholds) -> Flag:
    limit = t.min_point_duration_s
    if f.duration_s is None:
        return Flag("min_duration", NOT_CHECKED, None, limit, "no request completed")
    said = f"the point lasted {f.duration_s:.2f} s"
    if f.duration_s < limit:
        return Flag("min_duration", FAILED, f.duration_s, limit, f"{said} (minimum {_g(limit)} s)")
    return Flag("min_duration", PASSED, f.duration_s, limit, said)


CHECKS: tuple[Check, ...] = (
    Check(
        "streaming",
        f"share of completed requests with at least {BURST_MIN_TOKENS} output tokens whose "
        f"content arrived in at most {BURST_MAX_READS} reads",
        LATENCY,
        "max_burst_share",
        check_streaming,
    ),
    Check(
        "contention",
        "host CPU busy outside the server, the client and the samplers, in cores, over the "
        "point (telemetry)",
        ALL,
        "max_other_cpu_cores",
        check_contention,
    ),
    Check(
        "failed_requests",
        "requests that failed or carried no content",
        ALL,
        "max_failed_requests",
        check_failed_requests,
    ),
    Check(
        "restarted_requests",
        "preemptions the server counted during the point (telemetry); a note, never excluding",
        NONE,
        None,
        check_restarted_requests,
    ),
    Check(
        "min_duration",
        "point duration, first send to last completion (s)",
        ALL,
        "min_point_duration_s",
        check_min_duration,
    ),
)
BY_NAME = {c.name: c for c in CHECKS}


def evaluate(facts: PointFacts, t: Thresholds) -> tuple[Flag, ...]:
    return tuple(c.run(facts, t) for c in CHECKS)


def check_point(
    records: Sequence[RequestRecord], meta: Mapping[str, Any], t: Thresholds
) -> tuple[Flag, ...]:
    """Every check on one point of servelab's layout (records, point.json)."""
    return evaluate(facts_from_records(records, meta), t)


def removing(flags: Iterable[Flag], metric: str) -> list[Flag]:
    """The failed flags that leave `metric` out of the statistics."""
    return [f for f in flags if f.status == FAILED and BY_NAME[f.check].removes(metric)]


def failed(flags: Iterable[Flag]) -> list[Flag]:
    return [f for f in flags if f.status == FAILED]


# --- what the report, validity.json and the end-of-run summary say ----------------------------

PointFlags = tuple[str, int, int, Sequence[Flag]]  # server_config, repeat, concurrency, flags


def point_label(server_config: str, repeat: int, concurrency: int) -> str:
    return f"rep{repeat:02d} c={concurrency} {server_config}"


def counts(points: Sequence[PointFlags]) -> dict[str, dict[str, int]]:
    """check -> status -> number of points."""
    out = {c.name: dict.fromkeys(STATUSES, 0) for c in CHECKS}
    for *_, flags in points:
        for f in flags:
            out[f.check][f.status] += 1
    return out


def validity_json(points: Sequence[PointFlags], t: Thresholds) -> dict[str, Any]:
    rows = sorted(points, key=lambda p: (p[0], p[2], p[1]))
    return {
        "format_version": FORMAT_VERSION,
        "thresholds": t.to_json(),
        "checks": [
            {
                "name": c.name,
                "definition": c.definition,
                "affects": c.affects,
                "threshold_key": f"{SECTION}.{c.threshold_key}" if c.threshold_key else None,
                "threshold": c.threshold(t),
            }
            for c in CHECKS
        ],
        "counts": counts(rows),
        "points": [
            {
                "server_config": sc,
                "repeat": rep,
                "concurrency": conc,
                "valid": not failed(flags),
                "checks": [f.to_json() for f in flags],
            }
            for sc, rep, conc, flags in rows
        ],
    }


def summary_line(points: Sequence[PointFlags], anchor: str = "analysis/report.md#validity") -> str:
    """One line for the end of a run: how many points were flagged and by which checks."""
    n = len(points)
    if n == 0:
        return "validity: no measured point"
    c = counts(points)
    flagged = sum(1 for *_, flags in points if failed(flags))
    excluding = [k.name for k in CHECKS if k.affects != NONE]
    if flagged:
        by = ", ".join(f"{k} {c[k][FAILED]}" for k in excluding if c[k][FAILED])
        line = f"validity: {flagged} of {n} points flagged ({by}); see {anchor}"
    elif any(c[k][NOT_CHECKED] < n for k in excluding):
        ran = [k for k in excluding if c[k][NOT_CHECKED] < n]
        line = f"validity: all {n} points passed ({', '.join(ran)})"
    else:
        return f"validity: no check could run on the {n} points (no requests or telemetry)"
    skipped = [k for k in excluding if c[k][NOT_CHECKED] == n]
    if skipped:
        line += f"; not checked: {', '.join(skipped)}"
    noted = {k.name: c[k.name][NOTED] for k in CHECKS if k.affects == NONE and c[k.name][NOTED]}
    for name, k in noted.items():
        line += f"; {name} noted on {k} point{'s' if k != 1 else ''} (not excluded)"
    return line
