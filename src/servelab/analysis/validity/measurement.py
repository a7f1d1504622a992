"""The checks of the measurement itself: streaming delivered in reads (not bursts), a quiet
host, no failed requests, preemptions noted, a long enough point."""

from __future__ import annotations

from collections.abc import Mapping

from servelab.analysis.validity.facts import (
    BURST_MAX_READS,
    BURST_MIN_TOKENS,
    PointFacts,
    integer,
    number,
)
from servelab.analysis.validity.flags import (
    FAILED,
    NOT_CHECKED,
    NOTED,
    PASSED,
    Flag,
    block,
    block_mean,
    number_text,
)
from servelab.env.endpoint import REMOTE
from servelab.experiment import ValiditySection

ERROR_CHARS = 80


def check_streaming(f: PointFacts, t: ValiditySection) -> Flag:
    limit = float(t.max_burst_share)
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
        return Flag(
            "streaming", FAILED, share, limit, f"{said} (limit {number_text(100 * limit)}%)"
        )
    return Flag("streaming", PASSED, share, limit, said)


# the processes a point's CPU sample names: the server, its client, the samplers
OWN_CPU = ("server_cpu_pct", "client_cpu_pct", "telemetry_cpu_pct")


def outside_cores(cpu: Mapping[str, object]) -> float | None:
    """The host's cores busy outside the server (and the servers it alternates with), the
    client and the samplers, over a telemetry summary's `cpu` block; None where the host's
    busy percent, its core count or a process's CPU is unknown. Sampling can put the
    difference slightly below zero on an idle host: it is 0 then."""
    host, cores = block_mean(cpu, "host_cpu_pct"), cpu.get("host_cpus")
    own = [block_mean(cpu, k) for k in OWN_CPU]
    if host is None or not cores or any(v is None for v in own):
        return None
    # percent of all cores and percents of one core, as cores
    known = sum(v or 0.0 for v in own) + (block_mean(cpu, "siblings_cpu_pct") or 0.0)
    return max(0.0, host / 100.0 * integer(cores) - known / 100.0)


def check_contention(f: PointFacts, t: ValiditySection) -> Flag:
    limit = float(t.max_other_cpu_cores)
    tel = f.telemetry
    if tel is None:
        return Flag("contention", NOT_CHECKED, None, limit, f.no_telemetry)
    if tel.get("enabled") is False:
        return Flag("contention", NOT_CHECKED, None, limit, "telemetry disabled")
    cpu = block(tel, "cpu")
    if cpu.get("absent"):
        return Flag("contention", NOT_CHECKED, None, limit, f"no CPU telemetry: {cpu['absent']}")
    host, cores = block_mean(cpu, "host_cpu_pct"), cpu.get("host_cpus")
    if host is None or not cores:
        return Flag("contention", NOT_CHECKED, None, limit, "no host CPU sample over the point")
    own = [block_mean(cpu, k) for k in OWN_CPU]
    # the servers this one alternates with (a point sent in slices) are known, not contention
    siblings = "siblings_cpu_pct" in cpu
    if cpu.get("server_error") == REMOTE:
        # a server on another host: this host's load says nothing of the server's contention
        return Flag("contention", NOT_CHECKED, None, limit, REMOTE)
    if any(v is None for v in own):
        err = cpu.get("server_error")
        why = f"server CPU unknown ({err})" if own[0] is None and err else "process CPU unknown"
        return Flag("contention", NOT_CHECKED, None, limit, why)
    other = outside_cores(cpu)
    assert other is not None  # the host, its cores and every process's CPU are known here
    servers = "servers" if siblings else "server"
    said = f"{other:.2f} CPU cores busy outside the {servers}, client and samplers"
    steal = block_mean(cpu, "host_steal_pct")
    if steal is not None:
        # steal counts as busy, so it is part of `other`; the two means come from different
        # samples, so it is capped at `other` rather than read as more than all of it
        said += f" ({min(other, steal / 100.0 * integer(cores)):.2f} of them hypervisor steal)"
    if other > limit:
        return Flag("contention", FAILED, other, limit, f"{said} (limit {number_text(limit)})")
    return Flag("contention", PASSED, other, limit, said)


def check_failed_requests(f: PointFacts, t: ValiditySection) -> Flag:
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


def check_restarted_requests(f: PointFacts, t: ValiditySection) -> Flag:
    tel = f.telemetry
    if tel is None:
        return Flag("restarted_requests", NOT_CHECKED, None, None, f.no_telemetry)
    srv = block(tel, "server")
    n = srv.get("preemptions")
    if tel.get("enabled") is False or n is None:
        why = "telemetry disabled" if tel.get("enabled") is False else "no preemption counter"
        if srv.get("absent"):
            why = f"no server metrics: {srv['absent']}"
        return Flag("restarted_requests", NOT_CHECKED, None, None, why)
    if number(n) > 0:
        said = (
            f"the server preempted requests {number_text(number(n))} times (kept: server behaviour)"
        )
        return Flag("restarted_requests", NOTED, number(n), None, said)
    return Flag("restarted_requests", PASSED, 0.0, None, "no preemption")


def check_min_duration(f: PointFacts, t: ValiditySection) -> Flag:
    limit = float(t.min_point_duration_s)
    if f.duration_s is None:
        return Flag("min_duration", NOT_CHECKED, None, limit, "no request completed")
    said = f"the point lasted {f.duration_s:.2f} s"
    if f.duration_s < limit:
        return Flag(
            "min_duration", FAILED, f.duration_s, limit, f"{said} (minimum {number_text(limit)} s)"
        )
    return Flag("min_duration", PASSED, f.duration_s, limit, said)
