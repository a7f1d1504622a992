"""The verdict for people: the lines `servelab compare` and the workflow print, and the
verdict texts the report shares with them."""

from __future__ import annotations

from servelab.analysis.hostspeed import (
    AS_HOST,
    BEYOND_HOST,
    HOST_NOT_RECORDED,
    UNCHANGED,
    UNKNOWN,
    no_speed_words,
)
from servelab.documents.declared import ClaimCheck, PointCheck, ReproductionRecord
from servelab.reproduce.checks import NOT_REPRODUCED, REPRODUCED
from servelab.reproduce.differences import differences_line


def verdict_text(r: ReproductionRecord) -> str:
    """The verdict with the host it was reached on (bare in results made before hosts were
    compared)."""
    return str(r.get("verdict_text") or r["verdict"])


def claim_verdict_text(c: ClaimCheck) -> str:
    """A claim's own verdict: the host it was reached on is said once, for the whole
    comparison (reproductions made before that also wrote it into each claim's `host`)."""
    return str(c["verdict"])


def signed_pct(x: float | None) -> str:
    """A percentage change with its sign, "-" when there is none."""
    return "-" if x is None else f"{x:+.2f}%"


def attribution_text(p: PointCheck) -> str:
    """A point row's change against the host's speed, in a few words ("" when untested)."""
    answer = p.get("host_attribution")
    if answer == BEYOND_HOST:
        vs = p.get("vs_host_pct")
        against = f", {vs:+.1f}% against the host" if vs is not None else ""
        return f"{p.get('direction')}, beyond what the host explains{against}"
    if answer == UNKNOWN:
        why = p.get("host_why")
        return "unknown: the canary cannot tell" + (f" ({why})" if why else "")
    return {
        AS_HOST: "as the host's speed, not attributed to the code",
        HOST_NOT_RECORDED: "changed, host speed not recorded",
        UNCHANGED: "no real change at the 5% false discovery rate",
    }.get(str(answer), "")


def host_speed_text(r: ReproductionRecord) -> str | None:
    """The fresh host's speed against the reference's, one line (None in results made before
    the host speed was compared)."""
    hs = r.get("host_speed")
    if not isinstance(hs, dict):
        return None
    if not hs.get("recorded"):
        return no_speed_words(hs.get("why_not"))
    moved = "moved" if hs.get("moved") else "did not move beyond its noise"
    gpu = hs.get("parts") == "gpu"  # the GPU canary's parts: a GPU server's speed is its GPU's
    compute, copy = ("GPU matmul", "device copy") if gpu else ("compute", "copy bandwidth")
    text = (
        f"the fresh host ran the {'GPU ' if gpu else ''}canary at x{hs['ratio']:.3g} the "
        f"reference's speed ({compute} x{hs['compute']:.3g}, {copy} x{hs['bandwidth']:.3g}; "
        f"95% interval {hs['low']:.3g} to {hs['high']:.3g}): it {moved}"
    )
    if hs.get("unknown_why"):
        text += (
            f"; the canary cannot tell the host's speed from the code's ({hs['unknown_why']}): "
            f"compare both on one host with `{hs.get('rerun')}`"
        )
    return text


def verdict_lines(r: ReproductionRecord) -> list[str]:
    """What `servelab compare` and the workflow print: the verdict, what differs (once), then
    one line per check
    that did not reproduce (a point's with its change against the host's speed) and per
    claim, the host's speed (when recorded, or when the verdict is NOT REPRODUCED) and what
    keeps the fresh run from being a clean room."""
    c = r["counts"]
    lines = [
        f"reproduction: {verdict_text(r)} ({r['why']}; {c['reproduced']} reproduced, "
        f"{c['not_reproduced']} not reproduced, {c['not_comparable']} not comparable)"
    ]
    differs = differences_line(r)
    if differs is not None:
        lines.append(f"  differs: {differs}")
    for cl in r["claims"]:
        lines.append(
            f"  claim {cl['claim']!r}: {claim_verdict_text(cl)} "
            f"(reference {cl['reference_verdict']}, fresh {cl['fresh_verdict'] or '-'})"
        )
    for o in r["orderings"]:
        if o["verdict"] != REPRODUCED:
            lines.append(
                f"  ordering {o['server_config']} C{o['a']} vs C{o['b']} {o['metric']}: "
                f"{o['status']} (reference {signed_pct(o['reference_diff_pct'])}, fresh "
                f"{signed_pct(o['fresh_diff_pct'])})"
            )
    for p in r["points"]:
        if p["verdict"] not in (None, REPRODUCED):
            lines.append(
                f"  point {p['server_config']} "
                + (f"rate={p['rate']:g}" if "rate" in p else f"c={p['concurrency']}")
                + f" {p['metric']}: "
                f"{p['status']} ({signed_pct(p['change_pct'])}"
                + (f"; {attribution_text(p)}" if attribution_text(p) else "")
                + ")"
            )
    speed = host_speed_text(r)
    if speed is not None and (r["verdict"] == NOT_REPRODUCED or r["host_speed"].get("recorded")):
        lines.append(f"  host speed: {speed}")
    for f in r["provenance"]["not_clean_room"]:
        lines.append(f"  provenance: {f}")
    return lines
