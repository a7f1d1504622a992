"""Clients compared at a rate (servelab.analysis.clients): what differs between servelab's
client and another tool's in an open loop, and what the tool's recorded schedule shows.

- **Where latencies count from.** servelab times TTFT and E2EL from each request's scheduled
  send, the tools from their send: a request sent late, or held for a slot under a cap on
  requests in flight, counts that delay on servelab's side only.
- **Two draws.** Each client draws its own arrival times from the same process; each re-sends
  its one draw at every repeat, so an interval over the repeats does not cover the draw.
- **One schedule** (client.schedule servelab): the tool was handed servelab's own send times
  (AIPerf's --fixed-schedule), so both sides were offered the same load request by request;
  what is left is how late each side's sends went out after them (`Handed`: the tool's k-th
  send against servelab's k-th scheduled send, its schedule's start aligned with servelab's).
- **Offered rates.** Below the server's capacity an open loop serves what it is offered: a
  tool whose schedules ran at another rate than servelab's (each side's schedule's own rate,
  vllm bench's the target it scales its schedule to) differs in throughput by about as much.
- **Schedules that are not the process** (where the tool records its schedule, AIPerf's and
  GuideLLM's: each send less its wait after falling due): gaps that repeat an earlier gap to
  the microsecond (draws of a continuous process never do), and requests scheduled before the
  run began (sent at once: a burst).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from servelab.analysis.benchtree import scheduled_sends
from servelab.analysis.dataset import Point
from servelab.analysis.groups import Groups
from servelab.analysis.validity.facts import BenchJson
from servelab.analysis.validity.openloop import slip_pct
from servelab.design.level import RATE, Level, LevelValue
from servelab.documents.declared import ClientRunJson
from servelab.store.records import ArrivalsRecord


@dataclass(frozen=True)
class Handed:
    """A tool's run of a rate point on servelab's own schedule (client.schedule servelab): how
    late its sends went out after servelab's scheduled sends (ms, the p90 and the largest),
    or why that is not known (`why`)."""

    level: LevelValue
    repeat: int
    p90_ms: float | None = None
    max_ms: float | None = None
    why: str | None = None


def handed(
    run: ClientRunJson, bench: BenchJson, record: ArrivalsRecord | None, name: str
) -> Handed:
    """A tool's run handed servelab's schedule (client.json `schedule_sha256`): its sends
    (`bench`, its results) against that schedule (`record`, servelab's arrivals record of the
    rate, named `name`; None: missing). Its k-th send is set against the k-th scheduled send,
    its clock's zero at its own first scheduled send (its first send less its recorded wait,
    else its first send)."""
    level, repeat = float(run["rate"] or 0.0), int(run["repeat"])
    if record is None:
        return Handed(level, repeat, why=f"servelab's schedule {name} is missing")
    if record.doc["schedule_sha256"] != run.get("schedule_sha256"):
        return Handed(level, repeat, why=f"the schedule handed is not {name}")
    sends = sorted(float(s) for s in bench.get("start_times") or [])
    offsets = record.offsets_ns
    if len(sends) != len(offsets):
        why = f"{len(sends)} sends recorded against {len(offsets)} scheduled"
        return Handed(level, repeat, why=why)
    zero = min(scheduled_sends(bench) or sends)
    slips = sorted(1e3 * (s - zero) - o / 1e6 for s, o in zip(sends, offsets, strict=True))
    return Handed(level, repeat, slip_pct(slips), slips[-1])


def rate_causes(
    ours: Groups,
    config: str,
    name: str,
    points: Sequence[Point],
    off_pct: float,
    runs: Sequence[Handed] = (),
) -> list[str]:
    """The lines "Clients compared" gives for the tool `name`'s rate points beside servelab's
    configuration `config`; `off_pct` (analysis.validity.max_arrival_rate_error_pct): how far
    apart two offered rates are named; `runs`: the tool's runs handed servelab's schedule."""
    rated = [p for p in points if p.level.is_rate]
    if not rated:
        return []
    drawn = sorted(
        {str(a["process"]) for p in rated if (a := p.extra.get("arrival"))} - {"schedule"}
    )
    out = [timing_cause(ours, config, name, rated)]
    if drawn:
        out.append(
            f"{name}: at its rates it drew its own arrival times ({', '.join(drawn)}, "
            "as its files record the process) with its own generator, servelab its own from "
            "workload.seed: the two schedules differ, each re-sent at every repeat, so the "
            "interval covers the repeats, not the draw of the schedule"
        )
    return [
        *out,
        *handed_causes(name, runs, capped=any(_cap(p) for p in rated)),
        *offered_cause(ours, config, name, rated, off_pct),
        *schedule_causes(name, rated),
    ]


def _cap(point: Point) -> int | None:
    """The cap on requests in flight of a tool's rate point (None: none)."""
    arrival = point.extra.get("arrival")
    return arrival["max_in_flight"] if arrival else None


def handed_causes(name: str, runs: Sequence[Handed], capped: bool = False) -> list[str]:
    """The tool's runs on servelab's own schedule: how late its sends went out after it (under
    a cap on requests in flight, `capped`, its waits for a slot among it), and the runs where
    that is not known."""
    if not runs:
        return []
    known = [r for r in runs if r.p90_ms is not None and r.max_ms is not None]
    line = (
        f"{name}: sent on servelab's own schedule (client.schedule servelab), the same send "
        "times, so both sides were offered the same load request by request"
    )
    if known:
        p90 = max(float(r.p90_ms or 0.0) for r in known)
        worst = max(float(r.max_ms or 0.0) for r in known)
        line += (
            f"; its sends went out up to {p90:.1f} ms after them (p90 of a run; at most "
            f"{worst:.1f} ms), over {len(known)} run{'s' if len(known) > 1 else ''}"
        )
        if capped:
            line += ", a wait for a slot under the cap on requests in flight among it"
    unknown = [f"{Level.on(RATE, r.level)} rep {r.repeat}: {r.why}" for r in runs if r.why]
    if unknown:
        line += f" (not known: {'; '.join(unknown)})"
    return [line]


def timing_cause(ours: Groups, config: str, name: str, rated: Sequence[Point]) -> str:
    """servelab's latencies from the scheduled send, the tool's from its send, with what each
    side records of the delay between: servelab's send_slip, the tool's waits, a cap."""
    slips = [
        float(f.value)
        for level in sorted({p.level.value for p in rated})
        for p in ours.by.get((config, level), {}).values()
        for f in p.checks
        if f.check == "send_slip" and f.value is not None
    ]
    waits = [w for p in rated if (w := p.extra.get("client_wait_ms")) is not None]
    capped = sorted({cap for p in rated if (cap := _cap(p))})
    seen = []
    if slips:
        seen.append(f"servelab's sends up to {max(slips):.1f} ms late (send_slip, p90)")
    if waits:
        seen.append(f"the tool's a mean {sum(waits) / len(waits):.1f} ms after falling due")
    if capped:
        seen.append(
            f"at most {', '.join(map(str, capped))} requests in flight, a request due "
            "while the cap was full waiting for a slot"
        )
    return (
        f"{name}: at a rate servelab times TTFT and E2EL from each request's scheduled "
        "send, the tool from its send: a request sent late counts the delay in servelab's "
        "latencies only" + (f" ({'; '.join(seen)})" if seen else "")
    )


def offered_cause(
    ours: Groups, config: str, name: str, rated: Sequence[Point], off_pct: float
) -> list[str]:
    """The levels where the tool's schedules offered a rate more than `off_pct` off servelab's
    (means over the repeats)."""
    offered = []
    for level in sorted({p.level.value for p in rated}):
        mine = offered_rate(rated, level)
        theirs = offered_rate(ours.by.get((config, level), {}).values(), level)
        if mine is not None and theirs is not None and abs(mine / theirs - 1) * 100 > off_pct:
            offered.append(f"{Level.on(RATE, level)}: {mine:.3g} against {theirs:.3g} req/s")
    if not offered:
        return []
    return [
        f"{name}: its schedules offered a rate more than {off_pct:g}% "
        f"(max_arrival_rate_error_pct) off servelab's ({'; '.join(offered)}; each side's "
        "schedule's own rate, vllm bench's the target it scales to): below the server's "
        "capacity an open loop serves what it is offered, so throughput differs by about "
        "as much"
    ]


def schedule_causes(name: str, rated: Sequence[Point]) -> list[str]:
    """What the tool's recorded schedule shows: repeated gaps (a Poisson or gamma process),
    and requests scheduled before its run began."""
    out = []
    repeats = [
        (int(a.get("repeated_gaps") or 0), int(a["requests"]) - 1)
        for p in rated
        if (a := p.extra.get("arrival")) and a["process"] != "constant"
        if a.get("repeated_gaps") is not None
    ]
    if sum(r for r, _ in repeats):
        out.append(
            f"{name}: {sum(r for r, _ in repeats)} of the {sum(n for _, n in repeats)} gaps "
            "of its own schedule (each send less its recorded wait) repeat an earlier gap to "
            "the microsecond: its arrival times are not independent draws of the process "
            "(one seed's sequence drawn again, as by each of several worker processes)"
        )
    early = [
        f"{p.level} rep {p.repeat}: {n} of {a['requests']}"
        for p in rated
        if (a := p.extra.get("arrival")) and (n := int(a.get("scheduled_early") or 0))
    ]
    if early:
        out.append(
            f"{name}: requests scheduled before its run began (a recorded wait longer than "
            "the whole point: its schedule was anchored before the start), so sent at once, "
            f"a burst instead of the process ({'; '.join(early)})"
        )
    return out


def offered_rate(points: Iterable[Point], level: LevelValue) -> float | None:
    """The mean offered rate of the points at `level` whose throughput counts (those the
    table's mean is over; req/s; None: none recorded)."""
    rates = [
        float(r)
        for p in points
        if p.level.value == level and (r := p.extra.get("offered_rate")) is not None
        if not p.left_out("output_throughput")
    ]
    return sum(rates) / len(rates) if rates else None
