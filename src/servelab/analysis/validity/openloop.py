"""The checks of an open-loop point (sweep.rate): did the client send on its schedule?

Latencies of an open loop count from each request's scheduled send, so a client that falls
behind cannot hide queueing; but it then offers a lighter, smoother load than the arrival
process asked for. These checks say whether it did:

- `arrival_rate`: the rate at which requests were actually sent against the rate of the
  schedule they were due on (not the target rate: a drawn schedule differs from it by sampling,
  which point.json `arrival.scheduled_rate` records);
- `send_slip`: how late requests were sent after their scheduled time (the 90th percentile:
  one request in thirty sent late by a hiccup of the host leaves the arrival process as it
  was, a client that keeps falling behind does not), leaving out those a full cap
  (sweep.arrival.max_in_flight) held back, whose wait is the cap's, not the client's;
- `cap_reached`: a note of the requests the cap held back (the point was then partly a closed
  loop).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import NamedTuple

from servelab.analysis.validity.facts import PointFacts, RequestFacts, integer, number
from servelab.analysis.validity.flags import (
    FAILED,
    NOT_CHECKED,
    NOTED,
    PASSED,
    Flag,
    number_text,
)
from servelab.experiment import ValiditySection

NOT_OPEN = "not an open-loop point"
SLIP_PCT = 90  # send_slip reads this percentile of the sends' slips (nearest rank)


class _Send(NamedTuple):
    """A request's open-loop times: its scheduled send (epoch ns), how late it was sent (µs)
    and when it ended (epoch ns; None when it never started)."""

    scheduled_ns: int
    slip_us: int
    end_ns: int | None

    @property
    def sent_ns(self) -> int:
        """When it was actually sent (epoch ns)."""
        return self.scheduled_ns + self.slip_us * 1000


def _sent(requests: tuple[RequestFacts, ...]) -> list[_Send]:
    """The open-loop times of the requests that have them (a scheduled send and its slip), in
    order."""
    return [
        _Send(int(r.scheduled_ns), int(r.send_slip_us), r.end_ns)
        for r in requests
        if r.scheduled_ns is not None and r.send_slip_us is not None
    ]


def achieved_rate(sends_s: list[float]) -> float | None:
    """The rate at which requests were actually sent: those after the first over the time
    from the first send to the last (sorted, in seconds); None for fewer than two sends or
    all at once."""
    if len(sends_s) < 2 or sends_s[-1] <= sends_s[0]:
        return None
    return (len(sends_s) - 1) / (sends_s[-1] - sends_s[0])


def held_by_cap(f: PointFacts) -> list[bool]:
    """Per request with open-loop times (in order): whether the cap was full at its scheduled
    send, i.e. as many requests as max_in_flight had been sent and had not ended."""
    reqs = _sent(f.requests)
    cap = (f.arrival or {}).get("max_in_flight")
    if not cap:
        return [False] * len(reqs)
    sends = sorted(r.sent_ns for r in reqs)
    ends = sorted(r.end_ns if r.end_ns is not None else r.sent_ns for r in reqs)
    out = []
    for r in reqs:
        due = r.scheduled_ns
        in_flight = bisect.bisect_right(sends, due) - bisect.bisect_right(ends, due)
        out.append(in_flight >= integer(cap))
    return out


def check_arrival_rate(f: PointFacts, t: ValiditySection) -> Flag:
    limit = float(t.max_arrival_rate_error_pct)
    if not f.open_loop:
        return Flag("arrival_rate", NOT_CHECKED, None, limit, NOT_OPEN)
    reqs = _sent(f.requests)
    scheduled = (f.arrival or {}).get("scheduled_rate")
    sends = sorted(r.sent_ns / 1e9 for r in reqs)
    achieved = achieved_rate(sends)
    if not scheduled or achieved is None:
        why = "fewer than two requests sent at different times, or no schedule recorded"
        return Flag("arrival_rate", NOT_CHECKED, None, limit, why)
    off = 100.0 * abs(achieved / number(scheduled) - 1.0)
    said = (
        f"requests sent at {achieved:.3g} req/s, their schedule's rate {number(scheduled):.3g} "
        f"req/s (target {f.rate:g}): {off:.2g}% off"
    )
    return arrival_rate_flag(off, limit, said)


def arrival_rate_flag(off_pct: float, limit: float, said: str) -> Flag:
    """arrival_rate's verdict on sends `off_pct` off the rate they were held to (servelab's
    points and other tools' alike): failed above `limit`."""
    if off_pct > limit:
        why = f"{said} (limit {number_text(limit)}%)"
        return Flag("arrival_rate", FAILED, off_pct, limit, why)
    return Flag("arrival_rate", PASSED, off_pct, limit, said)


def slip_pct(slips: Sequence[float]) -> float:
    """The SLIP_PCT percentile (nearest rank) of sorted send slips."""
    return slips[min(len(slips) - 1, max(0, -(-SLIP_PCT * len(slips) // 100) - 1))]


def send_slip_flag(slips: list[float], limit: float, source: str = "", more: str = "") -> Flag:
    """send_slip's verdict on sorted send slips (ms): their SLIP_PCT percentile (nearest
    rank) against `limit`; `source` ends the reason's parenthesis (where the slips come
    from), `more` follows it."""
    p90 = slip_pct(slips)
    said = (
        f"p{SLIP_PCT} send slip {p90:.3g} ms over {len(slips)} requests "
        f"(max {slips[-1]:.3g}{source}){more}"
    )
    if p90 > limit:
        return Flag("send_slip", FAILED, p90, limit, f"{said} (limit {number_text(limit)} ms)")
    return Flag("send_slip", PASSED, p90, limit, said)


def cap_reached_flag(held: int, total: int, cap: int, due: str, knob: str) -> Flag:
    """cap_reached's note on `held` of `total` requests that found every one of `cap` slots
    busy: `due` says when they found it (due, released), `knob` names the cap's setting."""
    if held:
        why = (
            f"{held} of {total} requests were {due} while all {cap} slots ({knob}) were busy "
            "and waited for one: the point was partly a closed loop"
        )
        return Flag("cap_reached", NOTED, held / total, None, why)
    return Flag("cap_reached", PASSED, 0.0, None, f"no request waited for one of the {cap} slots")


def check_send_slip(f: PointFacts, t: ValiditySection) -> Flag:
    limit = float(t.max_send_slip_ms)
    if not f.open_loop:
        return Flag("send_slip", NOT_CHECKED, None, limit, NOT_OPEN)
    reqs = _sent(f.requests)
    held = held_by_cap(f)
    slips = sorted(r.slip_us / 1000.0 for r, h in zip(reqs, held, strict=True) if not h)
    if not slips:
        why = "no send time recorded" if not reqs else "every request waited for the cap"
        return Flag("send_slip", NOT_CHECKED, None, limit, why)
    more = ""
    if len(slips) < len(reqs):
        more = f", not counting {len(reqs) - len(slips)} the cap held back"
    return send_slip_flag(slips, limit, more=more)


def check_cap_reached(f: PointFacts, t: ValiditySection) -> Flag:
    if not f.open_loop:
        return Flag("cap_reached", NOT_CHECKED, None, None, NOT_OPEN)
    cap = (f.arrival or {}).get("max_in_flight")
    if not cap:
        return Flag("cap_reached", NOT_CHECKED, None, None, "no cap on requests in flight")
    held = held_by_cap(f)
    n = sum(held)
    if not held:
        return Flag("cap_reached", NOT_CHECKED, None, None, "no send time recorded")
    return cap_reached_flag(n, len(held), integer(cap), "due", "max_in_flight")
