"""The checks of a trace replay (workload.trace): did the point replay the traffic the trace
recorded? Beside the open loop's own (`send_slip`: the sends against the recorded schedule x
the time scale; `arrival_rate`), two:

- `trace_reuse`: the prompt tokens the server's prefix cache served (its counters over the
  point, else the requests' cached tokens) against the reuse the trace implies (point.json
  `trace.reuse.reused_tokens`: a request's leading blocks that an earlier request of the point
  sent at the same place). Fewer than `min_trace_reuse` of them (0.5 unless set): the cache did
  not see the reuse the trace recorded (too small a cache for the window, a tokenizer that did
  not keep the blocks, requests sent before the blocks they share were computed). Checked only
  where the configuration enables prefix caching; more than implied is fine (blocks a request
  shares with the warm-up, or a partial block vLLM completed);
- `trace_requests`: the requests the point sent against those in the trace's window (point.json
  `trace.window.in_window`): more missing (failed in the trace, left out for the server's
  max-model-len, or never sent) than `max_trace_missing_pct` percent where set, else than the
  replay's `workload.trace.min_kept` allows (5% at its 0.95), is no longer the window's
  traffic.
"""

from __future__ import annotations

from collections.abc import Mapping

from servelab.analysis.validity.facts import PointFacts, integer
from servelab.analysis.validity.flags import (
    FAILED,
    NOT_CHECKED,
    PASSED,
    Flag,
    block,
    number_text,
    threshold_of,
)
from servelab.analysis.validity.pitfalls import caching_asked, served_from_cache
from servelab.experiment import ValiditySection

NOT_TRACE = "not a trace replay"


def check_trace_reuse(f: PointFacts, t: ValiditySection) -> Flag:
    limit = threshold_of(t, "min_trace_reuse")
    if f.trace is None:
        return Flag("trace_reuse", NOT_CHECKED, None, limit, NOT_TRACE)
    implied = integer(block(f.trace, "reuse").get("reused_tokens") or 0)
    if not caching_asked(f.server_args):
        why = f"the configuration did not enable prefix caching (the trace implies {implied})"
        return Flag("trace_reuse", NOT_CHECKED, None, limit, why)
    if implied == 0:
        return Flag("trace_reuse", PASSED, None, limit, "the trace implies no reuse")
    found = served_from_cache(f)
    if found is None:
        return Flag("trace_reuse", NOT_CHECKED, None, limit, "no prefix-cache counters")
    hits, _, source = found
    share = hits / implied
    said = (
        f"the prefix cache served {number_text(hits)} prompt tokens ({source}), "
        f"{share:.2f} of the {implied} the trace implies"
    )
    if share < limit:
        return Flag("trace_reuse", FAILED, share, limit, f"{said} (at least {limit:g})")
    return Flag("trace_reuse", PASSED, share, limit, said)


def _missing_limit(t: ValiditySection, window: Mapping[str, object]) -> float:
    """The most percent of the window's requests a point may miss: max_trace_missing_pct where
    the config sets it, else what the replay's min_kept allows (point.json trace.window.fit),
    else 5."""
    if t.max_trace_missing_pct is None:
        kept = block(window, "fit").get("min_kept")
        if isinstance(kept, int | float) and not isinstance(kept, bool):
            return round(100 * (1 - kept), 9)
    return threshold_of(t, "max_trace_missing_pct")


def check_trace_requests(f: PointFacts, t: ValiditySection) -> Flag:
    window = block(f.trace, "window") if f.trace is not None else {}
    limit = _missing_limit(t, window)
    if f.trace is None:
        return Flag("trace_requests", NOT_CHECKED, None, limit, NOT_TRACE)
    expected = integer(window.get("in_window") or 0)
    sent = len(f.requests)
    if not expected:
        return Flag("trace_requests", NOT_CHECKED, None, limit, "the window's count is not known")
    missing = 100 * max(0, expected - sent) / expected
    rejected = {k: v for k, v in dict(block(window, "rejected")).items() if v}
    why = ", ".join(f"{v} {k}" for k, v in rejected.items())
    said = f"{sent} of the window's {expected} requests sent" + (
        f" (left out: {why})" if why else ""
    )
    if missing > limit:
        return Flag(
            "trace_requests", FAILED, missing, limit, f"{said}; at most {limit:g}% may miss"
        )
    return Flag("trace_requests", PASSED, missing, limit, said)
