"""The looks of a sequential sweep (rounds.json): after each round from `min` on, every claim
re-evaluated on the rounds so far, its comparisons tested by the stopping rule
(design.stopping).

A comparison decided at a look keeps that look's verdict and evidence; one still open after
the last round is `inconclusive`, saying how many rounds were spent and why measuring stopped.
The other claims (serialized, knee, dominated, past_knee: judged on means, invalid, not
comparable) are never open: more rounds cannot turn an invalid point valid, and a shape claim
has no test to wait for; each look shows its verdict on the rounds so far.

A sweep with a `reference:` asks the orderings a reproduction against it will judge as well
(run.json `orderings`, each as the comparison claim that says it): the looks include them
(`kind: ordering`), claims.json does not.

The sweep (servelab.measure.sequential) runs the looks to decide whether to measure another
round; the analysis runs them again from the raw data, so rounds.json and claims.json are a pure
function of it, as every other table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import cast

from servelab.analysis.claims import Findings, evaluate_claims, sequential_of
from servelab.analysis.dataset import Dataset
from servelab.analysis.diagnoses import diagnoses
from servelab.analysis.groups import Groups
from servelab.analysis.knee import DominanceRow, dominance, knee
from servelab.design.stopping import StoppingRule, is_open, run_looks
from servelab.documents.declared import (
    ClaimVerdict,
    Diagnosis,
    Knee,
    LookRecord,
    Question,
    RoundsRecord,
    SequentialTestJson,
)
from servelab.experiment import AnalysisSection
from servelab.render import md_table

# why measuring stopped (run.json and rounds.json `stopped`)
STOPPED = {
    "decided": "every question decided",
    "maximum": "the plan's maximum of rounds",
    "budget": "the time budget",
}


def rounds_measured(ds: Dataset) -> int:
    """Complete rounds: the highest repeat every server config has a point of."""
    by: dict[str, set[int]] = {}
    for p in ds.points:
        by.setdefault(p.server_config, set()).add(p.repeat)
    return min((max(r) for r in by.values()), default=0)


def looks(
    ds: Dataset, analysis: AnalysisSection, rule: StoppingRule, rounds: int | None = None
) -> list[list[ClaimVerdict]]:
    """Every look from `rule.min_rounds` to the rounds measured (or `rounds`), each the claims'
    entries as claims.json has them (design.stopping.run_looks: a comparison decided earlier
    keeps its entry)."""
    last = rounds_measured(ds) if rounds is None else rounds
    return run_looks(rule, last, lambda k: claims_at(ds, analysis, rule, k))


def claims_at(
    ds: Dataset, analysis: AnalysisSection, rule: StoppingRule, k: int
) -> list[ClaimVerdict]:
    """The claims' entries on rounds 1..k, comparisons tested at the look after round k."""
    dk = dataclasses.replace(ds, points=[p for p in ds.points if p.repeat <= k])
    g = Groups(dk)
    kn, dom = knee(g, analysis), dominance(g)
    diags = diagnoses(g, dk, kn, dom, analysis)
    return evaluate_claims(g, analysis, Findings(kn, dom, diags), ds.nodes, look=(rule, k))


def asked_with(analysis: AnalysisSection, orderings: Sequence[str]) -> AnalysisSection:
    """The analysis section whose claims are every question a look asks: the claims, then the
    orderings a reproduction will judge (run.json `orderings`)."""
    extra = tuple(q for q in orderings if q not in analysis.claims)
    return dataclasses.replace(analysis, claims=(*analysis.claims, *extra))


def open_claims(row: list[ClaimVerdict]) -> list[str]:
    """The questions a look leaves open."""
    return [e["claim"] for e in row if is_open(e)]


def round_record(k: int, row: list[ClaimVerdict], orderings: Sequence[str] = ()) -> LookRecord:
    """One look as run.json and rounds.json record it: per question (`kind`: a claim, or an
    ordering a reproduction will judge) its state, verdict, the round that decided it, and the
    test's evidence at that round."""
    claims: list[Question] = []
    for e in row:
        seq = sequential_of(e)
        state = "open" if is_open(e) else "decided"
        claims.append(
            {
                "claim": e["claim"],
                "kind": "ordering" if e["claim"] in orderings else "claim",
                "state": state,
                "verdict": e["verdict"],
                "decided_round": None if state == "open" else (seq["round"] if seq else k),
                "test": (
                    cast(SequentialTestJson, {k2: v for k2, v in seq.items() if k2 != "round"})
                    if seq
                    else None
                ),
            }
        )
    return {
        "round": k,
        "decided": sum(1 for c in claims if c["state"] == "decided"),
        "open": sum(1 for c in claims if c["state"] == "open"),
        "claims": claims,
    }


def sequential_claims(
    ds: Dataset, analysis: AnalysisSection, rule: StoppingRule, stopped: str | None = None
) -> tuple[list[ClaimVerdict], RoundsRecord]:
    """claims.json (the last look, open comparisons inconclusive with the rounds spent) and
    rounds.json (the rule, every look, why measuring stopped: `stopped` as the sweep recorded
    it, else read off the looks)."""
    recorded = ds.sequential.get("orderings", []) if ds.sequential else []
    orderings = [str(q) for q in recorded]
    orderings = [q for q in orderings if q not in analysis.claims]
    rows = looks(ds, asked_with(analysis, orderings), rule)
    n = rounds_measured(ds)
    if not rows:  # fewer rounds than the plan's minimum: the claims of a fixed design
        final = evaluate_claims(Groups(ds), analysis, Findings(*_shapes(ds, analysis)), ds.nodes)
        return final, {
            "rule": rule.to_json(),
            "rounds": n,
            "stopped": stopped or "budget",
            "orderings": orderings,
            "looks": [],
        }
    final, still = rows[-1], open_claims(rows[-1])
    why = "decided" if not still else (stopped or ("maximum" if n >= rule.max_rounds else "budget"))
    claims: list[ClaimVerdict] = [
        {**e, "reason": f"inconclusive: open after {n} rounds ({STOPPED.get(why, why)})"}
        if e["claim"] in still
        else e
        for e in final
        if e["claim"] not in orderings  # claims.json: the claims alone
    ]
    record: RoundsRecord = {
        "rule": rule.to_json(),
        "rounds": n,
        "stopped": why,
        "orderings": orderings,
        "looks": [round_record(k, row, orderings) for k, row in enumerate(rows, rule.min_rounds)],
    }
    return claims, record


def _shapes(
    ds: Dataset, analysis: AnalysisSection
) -> tuple[list[Knee], list[DominanceRow], list[Diagnosis]]:
    g = Groups(ds)
    kn, dom = knee(g, analysis), dominance(g)
    return kn, dom, diagnoses(g, ds, kn, dom, analysis)


def _test_text(t: SequentialTestJson | None) -> str:
    if not t or t.get("t") is None:
        return "not testable yet"
    return f"t = {t['t']:.3g}, df {t['df']}, p = {t['p_value']:.3g} against {t['look_alpha']:.3g}"


def rounds_section(rec: RoundsRecord) -> list[str]:
    """The report's "Rounds" section: a sequential sweep's looks, per round the claims it
    decided (with the test) and the ones left open."""
    rule = rec["rule"]
    lines = [
        "## Rounds",
        "",
        f"Sequential sweep ({rule['method']}): rounds {rule['min_rounds']} to "
        f"{rule['max_rounds']}, alpha {rule['alpha']:g} spent over "
        f"{rule['max_rounds'] - rule['min_rounds'] + 1} looks ({rule['look_alpha']:.3g} each)"
        + (f", budget {rule['budget_s']:g} s" if rule.get("budget_s") else "")
        + f". Measured {rec['rounds']} rounds; stopped: {rec['stopped']}.",
        "",
    ]
    rows = []
    for look in rec["looks"]:
        new = [
            f"`{c['claim']}`: {c['verdict']} ({_test_text(c['test'])})"
            for c in look["claims"]
            if c["state"] == "decided" and c["decided_round"] == look["round"] and c["test"]
        ]
        still = [
            f"`{c['claim']}` ({_test_text(c['test'])})"
            for c in look["claims"]
            if c["state"] == "open"
        ]
        rows.append(
            [
                str(look["round"]),
                f"{look['decided']}/{look['decided'] + look['open']}",
                "<br>".join(new) or "-",
                "<br>".join(still) or "-",
            ]
        )
    lines += md_table(["After round", "Decided", "Decided at this look", "Open"], rows)
    return lines
