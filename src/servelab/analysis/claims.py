"""Claims (claims.json): statements a write-up makes, checked against the raw data - a paired
comparison of one metric at two points, or a knee, dominance, past-knee or serialized verdict.
The syntax (claims_syntax) is checked when the config is validated.

A comparison of two server configurations measured on different nodes carries `hosts`; where
the nodes differ in a performance-relevant host fact it is `not comparable`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict, cast, overload

from servelab.analysis.dataset import Point
from servelab.analysis.diagnosis_records import level_of
from servelab.analysis.groups import (
    SUMMARY_METRICS,
    Groups,
    hit_order,
    insufficient_text,
    invalid_text,
)
from servelab.analysis.knee import DOMINANCE, DominanceRow, knee_level
from servelab.analysis.stats import describe, one_sided_bounds, paired
from servelab.analysis.validity import Flag
from servelab.claims_syntax import (
    BOUND as _BOUND,
    CAPACITY as _CAPACITY,
    CMP as _CMP,
    FUNC as _FUNC,
    parse_claim,
)
from servelab.design.level import LevelValue
from servelab.design.stopping import (
    LookEvidence,
    StoppingRule,
    claim_verdict,
    look_evidence,
    sequential_test,
)
from servelab.documents.declared import ClaimVerdict, Diagnosis, Hosts, Knee, NodeFacts, SearchJson
from servelab.errors import ServelabError
from servelab.experiment import AnalysisSection
from servelab.hostfacts import compare_hosts, difference_names

NOT_COMPARABLE = "not comparable"
# every verdict a claim can get (claims.schema.json, docs/analysis.md)
VERDICTS = ("holds", "fails", "inconclusive", "invalid", NOT_COMPARABLE)

ALIASES = {"throughput": "output_throughput", "tput": "output_throughput"}
# what each kind of claim reads, besides the metric a comparison names


class Side(TypedDict):
    """One side of a comparison or a bound: the configuration, its level (`concurrency`, or
    `rate` for an open loop), the mean; a comparison's b side carries the claim's factor."""

    config: str
    concurrency: NotRequired[LevelValue | None]
    rate: NotRequired[LevelValue | None]
    mean: float | None
    factor: NotRequired[float]


class ComparisonEvidence(TypedDict):
    """A comparison's paired test (at a sequential look, the stopping rule's: `sequential`)."""

    a: Side
    b: Side
    n: int
    mean_rel_diff_pct: float | None
    agree: str
    p_value: float | None
    test_verdict: str
    sequential: NotRequired[LookEvidence]


class BoundEvidence(TypedDict):
    """A bound's one-sided confidence bounds of the mean at one point."""

    a: Side
    bound: float
    n: int
    confidence_bounds: list[float | None]
    alpha: float


class InvalidPoint(TypedDict, total=False):
    """A point a claim reads that a validity check left out (its level: `concurrency` or
    `rate`, as the point record holds it)."""

    server_config: str
    repeat: int
    concurrency: LevelValue
    rate: LevelValue
    check: str
    reason: str


class InvalidEvidence(TypedDict):
    invalid: list[InvalidPoint]


"""The hosts of a comparison of configurations measured on different nodes."""

# a claim's evidence, by kind: a comparison, a bound, the points that made it invalid, the
# configuration's knee, the SLO capacity search's answer (as search.json holds it), the
# diagnoses or dominated points that make a shape claim hold
ClaimEvidence = (
    ComparisonEvidence | BoundEvidence | InvalidEvidence | Knee | dict[str, Any] | Sequence[object]
)


def sequential_of(entry: ClaimVerdict) -> LookEvidence | None:
    """A comparison's test at the look that judged it (`evidence.sequential`); None for a
    claim judged otherwise."""
    ev = entry.get("evidence")
    return cast(ComparisonEvidence, ev).get("sequential") if isinstance(ev, dict) else None


def _side(axis: str, config: str, level: LevelValue | None, mean: float | None) -> Side:
    """A side at `level` on `axis` ("concurrency" or "rate")."""
    if axis == "rate":
        return {"config": config, "rate": level, "mean": mean}
    return {"config": config, "concurrency": level, "mean": mean}


CLAIM_READS = {
    "dominated": [m for m, _ in DOMINANCE],
    "past_knee": ["output_throughput", "p99_ttft_ms"],
    "knee": ["output_throughput", "p99_ttft_ms"],
    "serialized": ["output_throughput", "duration", "num_prompts"],
}


def _claim_left_out(
    g: Groups, keys: list[tuple[str, LevelValue]], metrics: list[str]
) -> list[tuple[Point, Flag]]:
    found: dict[tuple[str, LevelValue, int, str], tuple[Point, Flag]] = {}
    for sc, c in keys:
        for m in metrics:
            for p, f in g.left_out(sc, c, m):
                found.setdefault((sc, c, p.repeat, f.check), (p, f))
    return sorted(found.values(), key=hit_order)


def _invalid_point(p: Point, f: Flag) -> InvalidPoint:
    out: InvalidPoint = {"server_config": p.server_config, "repeat": p.repeat}
    if p.level.axis == "rate":
        out["rate"] = p.level.value
    else:
        out["concurrency"] = p.level.value
    out["check"] = f.check
    out["reason"] = f.reason
    return out


def _invalid_claim(claim: str, hits: list[tuple[Point, Flag]]) -> ClaimVerdict:
    return {
        "claim": claim,
        "verdict": "invalid",
        "reason": invalid_text(hits),
        "evidence": {"invalid": [_invalid_point(p, f) for p, f in sorted(hits, key=hit_order)]},
    }


def _insufficient_claim(claim: str, short: list[str]) -> ClaimVerdict:
    """Inconclusive: a percentile the claim reads that a repeat's requests are too few to
    report (Groups.insufficient)."""
    return {
        "claim": claim,
        "verdict": "inconclusive",
        "reason": insufficient_text(short),
        "evidence": {"insufficient": short},
    }


def cross_node(nodes: Mapping[str, NodeFacts], sa: str, sb: str) -> tuple[Hosts, str | None] | None:
    """The hosts of a comparison of server configs `sa` and `sb` when they were measured on
    different nodes (a different hostname, or the same one with a performance-relevant host
    fact changed), and the reason it is not comparable when their host facts differ
    (hostfacts.compare_hosts: class `differs`); None on one node or where either records
    none. `differences`: the short names of the facts that differ (relevant ones first)."""
    if sa == sb or sa not in nodes or sb not in nodes:
        return None
    na, nb = nodes[sa], nodes[sb]
    cmp = compare_hosts({"host": na.get("host")}, {"host": nb.get("host")})
    ha, hb = str(na.get("hostname")), str(nb.get("hostname"))
    if ha == hb and cmp["class"] != "differs":
        return None
    rows = cmp["relevant_differences"] + cmp["other_differences"]
    hosts: Hosts = {
        "a": ha,
        "b": hb,
        "class": cmp["class"],
        "differences": [r["short"] for r in rows],
    }
    if cmp["class"] != "differs":
        return hosts, None
    names = f"{ha}, {hb}" if ha != hb else f"two named {ha}"
    why = difference_names(cmp["relevant_differences"])
    return hosts, f"{NOT_COMPARABLE}: measured on different hosts: {names}, which differ in: {why}"


@overload
def _selector(
    text: str, claim: str, g: Groups, need_c: Literal[True] = ...
) -> tuple[str, LevelValue]: ...


@overload
def _selector(text: str, claim: str, g: Groups, need_c: bool) -> tuple[str, LevelValue | None]: ...


def _selector(
    text: str, claim: str, g: Groups, need_c: bool = True
) -> tuple[str, LevelValue | None]:
    """A claim's point selector: its config and level; the level is None only where it is
    not needed (`need_c` false) and not given."""
    parts = dict(p.split("=", 1) for p in (x.strip() for x in text.split(",")) if "=" in p)
    level_key = "rate" if g.open_loop else "c"
    keys = set(parts) - {level_key, "config"}
    bad = [x.strip() for x in text.split(",") if x.strip() and "=" not in x]
    if keys or bad:
        sweep = "a sweep over request rates" if g.open_loop else "a sweep over concurrency"
        raise ServelabError(
            f"analysis.claims: {claim!r}: selectors of {sweep} are {level_key}=N and config=NAME"
        )
    sc = parts.get("config", "").strip()
    if not sc:
        if len(g.configs) != 1:
            raise ServelabError(
                f"analysis.claims: {claim!r}: name the config=..., there are several"
            )
        sc = g.configs[0]
    if sc not in g.configs:
        raise ServelabError(f"analysis.claims: {claim!r}: config {sc!r} was not measured")
    c = parts.get(level_key)
    if c is None:
        if need_c:
            example = "[rate=2]" if g.open_loop else "[c=8]"
            word = "request rate" if g.open_loop else "concurrency"
            raise ServelabError(f"analysis.claims: {claim!r}: give the {word}, e.g. {example}")
        return sc, None
    if g.open_loop:
        return sc, _rate_level(c, claim, g, sc)
    if not c.strip().isdigit() or int(c) not in g.levels(sc):
        raise ServelabError(
            f"analysis.claims: {claim!r}: concurrency {c} was not measured for {sc}"
        )
    return sc, int(c)


def _rate_level(text: str, claim: str, g: Groups, sc: str) -> float:
    """The measured rate a claim's rate=R names (R as written in sweep.rate)."""
    try:
        rate = float(text)
    except ValueError:
        rate = math.nan
    if rate not in g.levels(sc):
        raise ServelabError(
            f"analysis.claims: {claim!r}: request rate {text.strip()} was not measured for {sc}"
        )
    return rate


@dataclass(frozen=True)
class Findings:
    """What the analysis found that the knee, dominated, past_knee and serialized claims are
    judged against: the knees (knee.json), the dominated points (dominance.csv) and the
    diagnoses (diagnoses.json)."""

    knees: list[Knee]
    dominated: list[DominanceRow]
    diagnoses: list[Diagnosis]
    # each configuration's SLO capacity search (search.json), where one ran
    searches: Mapping[str, SearchJson] = field(default_factory=dict)


def evaluate_claims(
    g: Groups,
    analysis: AnalysisSection,
    found: Findings,
    nodes: Mapping[str, NodeFacts] | None = None,
    look: tuple[StoppingRule, int] | None = None,
) -> list[ClaimVerdict]:
    """Every claim of `analysis.claims` with its verdict and evidence; `nodes`: the node each
    server config was measured on (Dataset.nodes), which a comparison across configs names.
    `look`: a sequential sweep's stopping rule and the round whose look this is: comparisons
    are then tested by the rule (design.stopping), and one it leaves open is inconclusive."""
    out: list[ClaimVerdict] = []
    for claim in analysis.claims:
        try:
            parse_claim(claim)
        except ServelabError as exc:
            raise ServelabError(f"analysis.claims: {exc}") from None
        m = _CMP.match(claim)
        b = _BOUND.match(claim)
        cap = _CAPACITY.match(claim)
        if cap:
            out.append(_capacity(claim, cap.groups(), g, found))
        elif m:
            out.append(_comparison(claim, m.groups(), g, analysis, nodes or {}, look))
        elif b:
            out.append(_bound(claim, b.groups(), g, analysis))
        else:
            out.append(_shape_claim(claim, g, found))
    return out


def _comparison(
    claim: str,
    parts: tuple[str, ...],
    g: Groups,
    analysis: AnalysisSection,
    nodes: Mapping[str, NodeFacts],
    look: tuple[StoppingRule, int] | None,
) -> ClaimVerdict:
    """A comparison claim (`parts`: claims_syntax.CMP's groups): the paired test of one metric
    at two points, or at a sequential look the stopping rule's, and the hosts of two configs
    measured on different nodes."""
    ma, sel_a, op, factor, mb, sel_b = parts
    metric_a = ALIASES.get(ma, ma)
    metric_b = ALIASES.get(mb, mb)
    if metric_a != metric_b or metric_a not in SUMMARY_METRICS:
        raise ServelabError(
            f"analysis.claims: {claim!r}: compare one metric of {', '.join(SUMMARY_METRICS)}"
        )
    sa, ca = _selector(sel_a, claim, g)
    sb, cb = _selector(sel_b, claim, g)
    lost = _claim_left_out(g, [(sa, ca), (sb, cb)], [metric_a])
    if lost:
        return _invalid_claim(claim, lost)
    short = g.insufficient(sa, ca, metric_a) + g.insufficient(sb, cb, metric_a)
    if short:
        return _insufficient_claim(claim, short)
    va, vb = g.pair(sa, ca, sb, cb, metric_a)
    k = float(factor) if factor else 1.0
    kb = [k * x for x in vb]
    threshold = 0.0 if factor else analysis.threshold_pct
    test = paired(va, kb, threshold, analysis.alpha)
    p_value, test_verdict, sequential = test.p_value, test.verdict, None
    if look is not None:  # the look's points are the rounds so far
        rule, k_round = look
        seq = sequential_test(va, kb, rule.look_alpha(k_round), threshold)
        p_value, test_verdict = seq.p_value, seq.verdict
        sequential = look_evidence(k_round, seq)
    evidence: ComparisonEvidence = {
        "a": _side(g.axis, sa, ca, describe(va).mean),
        "b": {**_side(g.axis, sb, cb, describe(vb).mean), "factor": k},
        "n": test.n,
        "mean_rel_diff_pct": test.mean_rel_diff_pct,
        "agree": test.agree,
        "p_value": p_value,
        "test_verdict": test_verdict,
    }
    if sequential is not None:
        evidence["sequential"] = sequential
    crossed = cross_node(nodes, sa, sb)
    out: ClaimVerdict
    if crossed is not None and crossed[1] is not None:
        out = {
            "claim": claim,
            "verdict": NOT_COMPARABLE,
            "reason": crossed[1],
            "evidence": evidence,
        }
    else:
        out = {"claim": claim, "verdict": claim_verdict(op, test_verdict), "evidence": evidence}
    if crossed is not None:
        out["hosts"] = crossed[0]
    return out


def _capacity(claim: str, parts: tuple[str, ...], g: Groups, found: Findings) -> ClaimVerdict:
    """The SLO capacity search's answer against a rate: `> R` holds when a rate above R met
    the SLO and fails when one at or below R failed; `< R` the other way round; inconclusive
    when R lies inside the search's bracket. Only a rate the early-stop rule decided fails
    counts as failing here: an undecided one (the bracketing counts it as not meeting) shows
    nothing either way."""
    sel, op, number = parts
    sc, _ = _selector(sel, claim, g, need_c=False)
    if sc not in found.searches:
        raise ServelabError(
            f"analysis.claims: {claim!r}: no SLO capacity search of {sc}; set search.enabled "
            "(and search.server_configs to include it)"
        )
    answer = found.searches[sc]["answer"]
    path = found.searches[sc]["path"]
    failed = min((s["rate"] for s in path if s["decision"] == "fails"), default=None)
    met, rate = answer["met_rate"], float(number)
    above = met is not None and met > rate  # the capacity is above R
    below = failed is not None and failed <= rate  # the capacity is below R
    if op == "<":
        above, below = below, (met is not None and met >= rate)
    verdict = "holds" if above else "fails" if below else "inconclusive"
    return {"claim": claim, "verdict": verdict, "evidence": {"config": sc, **answer}}


def _bound(
    claim: str, parts: tuple[str, ...], g: Groups, analysis: AnalysisSection
) -> ClaimVerdict:
    """A metric at one point against a number (`parts`: claims_syntax.BOUND's groups): holds
    when the one-sided (1 - alpha) confidence bound of its mean over the repeats lies on the
    claimed side of the number, fails when the other bound lies beyond it, and is
    inconclusive in between (or on one repeat)."""
    name, sel, op, number = parts
    metric = ALIASES.get(name, name)
    if metric not in SUMMARY_METRICS:
        raise ServelabError(
            f"analysis.claims: {claim!r}: bound one metric of {', '.join(SUMMARY_METRICS)}"
        )
    sc, level = _selector(sel, claim, g)
    lost = _claim_left_out(g, [(sc, level)], [metric])
    if lost:
        return _invalid_claim(claim, lost)
    short = g.insufficient(sc, level, metric)
    if short:
        return _insufficient_claim(claim, short)
    values = list(g.values(sc, level, metric).values())
    lo, hi = one_sided_bounds(values, analysis.alpha)
    bound = float(number)
    if lo is None or hi is None:
        verdict = "inconclusive"
    elif (hi < bound) if op == "<" else (lo > bound):
        verdict = "holds"
    elif (lo > bound) if op == "<" else (hi < bound):
        verdict = "fails"
    else:
        verdict = "inconclusive"
    return {
        "claim": claim,
        "verdict": verdict,
        "evidence": {
            "a": _side(g.axis, sc, level, describe(values).mean),
            "bound": bound,
            "n": len(values),
            "confidence_bounds": [lo, hi],
            "alpha": analysis.alpha,
        },
    }


def _shape_claim(claim: str, g: Groups, found: Findings) -> ClaimVerdict:
    """A dominated, past_knee, serialized or knee claim: it holds where the analysis found
    that shape (`found`); invalid where a point it reads was left out."""
    f = _FUNC.match(claim)
    assert f is not None
    func, args, expect = f.groups()
    sc, c = _selector(args, claim, g, need_c=func in ("dominated", "past_knee"))
    # these read the means of every level of the config
    lost = _claim_left_out(g, [(sc, lv) for lv in g.levels(sc)], CLAIM_READS[func])
    if lost:
        return _invalid_claim(claim, lost)
    hits: Sequence[object]
    if func == "dominated":
        hits = [d for d in found.dominated if d["server_config"] == sc and d[g.axis] == c]
    elif func == "past_knee":
        hits = [
            d
            for d in found.diagnoses
            if d["kind"] == "past_knee"
            and d["server_config"] == sc
            and c in cast(list[LevelValue], level_of(d, g.axis))
        ]
    elif func == "serialized":
        hits = [
            d for d in found.diagnoses if d["kind"] == "serialized" and d["server_config"] == sc
        ]
    else:
        kn = next(x for x in found.knees if x["server_config"] == sc)
        at = knee_level(kn, g.axis)
        ok = at is not None and (expect is None or at == float(expect))
        return {"claim": claim, "verdict": "holds" if ok else "fails", "evidence": kn}
    return {"claim": claim, "verdict": "holds" if hits else "fails", "evidence": hits}
