"""The verdict for people: the lines `servelab compare` and the workflow print, and the
verdict texts the report shares with them."""

from __future__ import annotations

from typing import Any

from servelab.reproduce.checks import REPRODUCED


def verdict_text(r: dict[str, Any]) -> str:
    """The verdict with the host it was reached on (bare in results made before hosts were
    compared)."""
    return str(r.get("verdict_text") or r["verdict"])


def claim_verdict_text(c: dict[str, Any]) -> str:
    return str(c.get("host") or c["verdict"])


def signed_pct(x: Any) -> str:
    """A percentage change with its sign, "-" when there is none."""
    return "-" if x is None else f"{x:+.2f}%"


def verdict_lines(r: dict[str, Any]) -> list[str]:
    """What `servelab compare` and the workflow print: the verdict, then one line per check
    that did not reproduce and per claim."""
    c = r["counts"]
    lines = [
        f"reproduction: {verdict_text(r)} ({r['why']}; {c['reproduced']} reproduced, "
        f"{c['not_reproduced']} not reproduced, {c['not_comparable']} not comparable)"
    ]
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
                f"{p['status']} ({signed_pct(p['change_pct'])})"
            )
    for f in r["provenance"]["not_clean_room"]:
        lines.append(f"  provenance: {f}")
    return lines
