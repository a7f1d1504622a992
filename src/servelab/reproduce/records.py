"""reproduction.json: the record a comparison writes (comparison.compare_sides), which the
report (markdown), the printed verdict (verdict) and the site's reproduction page read. Its
rows are typed beside their writers: the checks' in `checks`, the provenance diff's in
`provenance_diff`, a side's in `sides`."""

from __future__ import annotations

from servelab.analysis.hostspeed import Gate, HostRatio, gate_reason
from servelab.documents.declared import (
    HostSpeedRecord,
)


def host_speed_json(
    ratio: HostRatio | None, why: str | None, gate: Gate | None = None
) -> HostSpeedRecord:
    """A `host_speed` record (a comparison's, a history pair's): the ratio with its interval
    and parts as HostRatio.to_json writes them, the gate's margin, reason and rerun command
    (`gate`), or why there is none."""
    out: HostSpeedRecord = {"recorded": ratio is not None, "why_not": why}
    if ratio is not None:
        out["ratio"], out["low"], out["high"] = ratio.ratio, ratio.low, ratio.high
        out["compute"], out["bandwidth"] = ratio.compute, ratio.bandwidth
        out["moved"] = ratio.moved
        if ratio.parts != "cpu":
            out["parts"] = ratio.parts
        if ratio.drift:
            out["drift"] = ratio.drift
        if ratio.cpu is not None:
            out["cpu"] = list(ratio.cpu)
        if gate is not None:
            out["margin_pct"] = gate.margin_pct
            out["unknown_why"] = gate_reason(ratio, gate)
            out["rerun"] = gate.rerun
    return out
