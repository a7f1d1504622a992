"""The checks of a comparison: both sides analysed with the reference's options, then the
orderings (paired differences), the claims and the points (absolute values, judged only with
a tolerance), each row with its status and its verdict."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from servelab.analysis.claims import (
    NOT_COMPARABLE as CLAIM_NOT_COMPARABLE,
    Findings,
    evaluate_claims,
)
from servelab.analysis.dataset import Dataset
from servelab.analysis.diagnoses import diagnoses
from servelab.analysis.groups import PAIRED_METRICS, Groups, PairedRow, paired_table
from servelab.analysis.hostspeed import Gate, HostRatio, attribute
from servelab.analysis.knee import DominanceRow, dominance, knee
from servelab.analysis.pipeline import searches_of
from servelab.analysis.rounds import sequential_claims
from servelab.analysis.stats import benjamini_hochberg, describe, ratio_ci, two_sample
from servelab.design.level import LevelValue
from servelab.design.stopping import StoppingRule
from servelab.documents.declared import (
    ChainRow,
    ClaimCheck,
    ClaimVerdict,
    Diagnosis,
    Knee,
    PairCheck,
    PointCheck,
    SearchJson,
)
from servelab.errors import ServelabError
from servelab.experiment import AnalysisSection, ReproductionSection

REPRODUCED = "REPRODUCED"
NOT_REPRODUCED = "NOT REPRODUCED"
NOT_COMPARABLE = "NOT COMPARABLE"
POINT_METRICS = PAIRED_METRICS
FDR_Q = 0.05  # the false discovery rate over the point tests of one comparison


@dataclass
class Analysed:
    ds: Dataset
    g: Groups
    paired: list[PairedRow]
    knee: list[Knee]
    dominance: list[DominanceRow]
    diagnoses: list[Diagnosis]
    # each configuration's SLO capacity search (search.json), for slo_capacity claims
    searches: dict[str, SearchJson] = field(default_factory=dict)


def analyse(ds: Dataset, opts: AnalysisSection) -> Analysed:
    """One side's tables (paired differences, knee, dominance, diagnoses), claims apart."""
    g = Groups(ds)
    opts = replace(opts, claims=())
    kn = knee(g, opts)
    dom = dominance(g)
    searches = {sc: r.to_json() for sc, r in searches_of(ds).items()}
    diags = diagnoses(g, ds, kn, dom, opts)
    return Analysed(ds, g, paired_table(g, opts), kn, dom, diags, searches)


def _claim(a: Analysed, opts: AnalysisSection, claim: str) -> ClaimVerdict:
    """One claim on one side; on a side measured by a sequential sweep, judged with the
    stopping rule it was measured under (its run.json), look by look."""
    one = replace(opts, claims=(claim,))
    if a.ds.sequential is not None:
        rule = StoppingRule.from_json(a.ds.sequential["rule"])
        return sequential_claims(a.ds, one, rule, a.ds.sequential.get("stopped"))[0][0]
    found = Findings(a.knee, a.dominance, a.diagnoses, a.searches)
    res = evaluate_claims(a.g, one, found, a.ds.nodes)
    return res[0]


def align_configs(ref: Dataset, new: Dataset) -> str | None:
    """One configuration on each side under different names (vllm-bench trees are named after
    their folder): compare them as one. Returns a note when renamed."""
    rc, nc = ref.configs(), new.configs()
    if rc == nc or len(rc) != 1 or len(nc) != 1:
        return None
    for p in new.points:
        p.server_config = rc[0]
    new.capacity = {rc[0]: next(iter(new.capacity.values()))} if new.capacity else {}
    return f"fresh configuration {nc[0]!r} compared with reference configuration {rc[0]!r}"


def _pct_change(ref: float | None, new: float | None) -> float | None:
    if ref is None or new is None or ref == 0:
        return None
    return 100.0 * (new / ref - 1.0)


def level_of(r: PointCheck) -> LevelValue:
    """A point row's level: its rate at request rates, else its concurrency."""
    return r["rate"] if "rate" in r else r["concurrency"]


def point_rows(ref: Analysed, new: Analysed, s: ReproductionSection) -> list[PointCheck]:
    """Each point's mean on both sides; judged against `tolerance_pct` only when one is set."""
    rows: list[PointCheck] = []
    for sc in ref.g.configs:
        for c in ref.g.levels(sc):
            for m in POINT_METRICS:
                rv = list(ref.g.values(sc, c, m).values())
                nv = list(new.g.values(sc, c, m).values())
                rd, nd = describe(rv), describe(nv)
                change = _pct_change(rd.mean, nd.mean)
                judged = s.tolerance_pct is not None and m in s.tolerance_metrics
                short = ref.g.insufficient(sc, c, m) or new.g.insufficient(sc, c, m)
                if short and not (rv and nv):
                    status = "insufficient"  # a percentile too few requests report
                elif not nv:
                    status = "missing"
                elif not judged:
                    status = "reported"
                elif change is not None and abs(change) <= float(s.tolerance_pct or 0):
                    status = "within tolerance"
                else:
                    status = "outside tolerance"
                row: PointCheck = {
                    "server_config": sc,
                    "metric": m,
                    "reference_mean": rd.mean,
                    "fresh_mean": nd.mean,
                    "change_pct": change,
                    "reference_cv_pct": rd.cv_pct,
                    "fresh_cv_pct": nd.cv_pct,
                    "reference_n": rd.n,
                    "fresh_n": nd.n,
                    "status": status,
                    "verdict": {
                        "missing": NOT_COMPARABLE if judged else None,
                        "insufficient": NOT_COMPARABLE if judged else None,
                        "within tolerance": REPRODUCED,
                        "outside tolerance": NOT_REPRODUCED,
                    }.get(status),
                }
                if ref.g.open_loop:
                    row["rate"] = c
                else:  # a concurrency is a whole number
                    row["concurrency"] = int(c)
                rows.append(row)
    return rows


def attribute_points(
    rows: list[PointCheck],
    ref: Analysed,
    new: Analysed,
    opts: AnalysisSection,
    host: HostRatio | None,
    gate: Gate | None = None,
) -> int:
    """Each point row (`point_rows`) tested (Welch's t on the logs of the two sides' repeats),
    the tests under Benjamini-Hochberg at FDR_Q, and a change (adjusted p at most FDR_Q, the
    change at least the practical threshold) attributed against the host-speed ratio `host`
    by the gate `gate` (analysis.hostspeed.attribute): sets `p_value`, `p_adjusted`,
    `host_attribution`, `direction`, `vs_host_pct` and `host_why` on each row; returns how
    many tests ran."""
    sides = []
    for r in rows:
        rv = list(ref.g.values(r["server_config"], level_of(r), r["metric"]).values())
        nv = list(new.g.values(r["server_config"], level_of(r), r["metric"]).values())
        p = two_sample(nv, rv, opts.threshold_pct, opts.alpha).p_value
        sides.append((ratio_ci(nv, rv), p))
    adjusted = benjamini_hochberg([p for _, p in sides], FDR_Q)
    for r, (ratio, p), q in zip(rows, sides, adjusted, strict=True):
        change = r["change_pct"]
        tested = q is not None and q <= FDR_Q
        changed = tested and change is not None and abs(change) >= opts.threshold_pct
        got = attribute(r["metric"], ratio, changed, host, gate)
        answer = got.answer if q is not None else None  # untested: nothing to attribute
        r["p_value"], r["p_adjusted"] = p, q
        r["host_attribution"], r["direction"] = answer, got.direction
        r["vs_host_pct"] = None if got.vs_host is None else 100.0 * (got.vs_host - 1.0)
        if got.why is not None and q is not None:
            r["host_why"] = got.why
    return sum(1 for q in adjusted if q is not None)


def _by_pair(paired: list[PairedRow]) -> dict[tuple[str, LevelValue, LevelValue, str], PairedRow]:
    """Rows of a paired table by (config, a, b, metric)."""
    return {(r["server_config"], r["a"], r["b"], r["metric"]): r for r in paired}


def _real_diff(pct: float | None) -> float:
    """The mean difference of a paired row the reference called real (paired: never None)."""
    assert pct is not None, "a real paired difference has its mean difference"
    return pct


def _real(verdict: str | None) -> bool:
    return verdict in ("a > b", "a < b")


def _invalid(verdict: str | None) -> bool:
    """A paired row or claim that the validity checks left without data (docs/analysis.md)."""
    return verdict is not None and (verdict == "invalid" or verdict.startswith("invalid:"))


def _insufficient(verdict: str | None) -> bool:
    """A paired row on a percentile that a side's requests are too few to report."""
    return verdict is not None and verdict.startswith("insufficient")


def judged(r: PairedRow, s: ReproductionSection) -> bool:
    """Whether a reproduction judges this ordering of the reference's paired table: the
    reference called it real, on a judged metric, by at least `min_effect_pct`."""
    rp = r["mean_rel_diff_pct"]
    return (
        _real(r["verdict"])
        and r["metric"] in s.metrics
        and rp is not None
        and abs(rp) >= s.min_effect_pct
    )


def ordering_claims(ref: Analysed, s: ReproductionSection) -> list[str]:
    """The orderings a reproduction against `ref` judges, each as the comparison claim that
    says it (`output_throughput[config=X,c=8] > output_throughput[config=X,c=4]`): the
    questions a sequential fresh run measures until it has decided them too."""
    out = []
    for r in ref.paired:
        if judged(r, s):
            op = ">" if r["verdict"] == "a > b" else "<"
            m, sc, key = r["metric"], r["server_config"], "rate" if ref.g.open_loop else "c"
            a, b = f"{key}={r['a']:g}", f"{key}={r['b']:g}"
            out.append(f"{m}[config={sc},{a}] {op} {m}[config={sc},{b}]")
    return out


def pair_rows(ref: Analysed, new: Analysed, s: ReproductionSection) -> list[PairCheck]:
    """Every paired difference of the reference beside the fresh one; judged (the orderings)
    where the reference called it real on a judged metric, by at least `min_effect_pct`."""
    fresh = _by_pair(new.paired)
    rows: list[PairCheck] = []
    for r in ref.paired:
        n = fresh.get((r["server_config"], r["a"], r["b"], r["metric"]))
        rp = r["mean_rel_diff_pct"]
        np_ = n["mean_rel_diff_pct"] if n is not None else None
        is_judged = judged(r, s)
        nv = n["verdict"] if n is not None else None
        if _invalid(r["verdict"]):
            status, verdict = "invalid in the reference", None
        elif _insufficient(r["verdict"]):
            status, verdict = "insufficient in the reference", None
        elif _insufficient(nv):
            status, verdict = "insufficient in the fresh run", NOT_COMPARABLE
        elif _invalid(nv):
            status, verdict = "invalid in the fresh run", NOT_COMPARABLE
        elif n is None or np_ is None:
            status, verdict = "missing", NOT_COMPARABLE
        elif not _real(r["verdict"]):
            status, verdict = "no difference in the reference", None
        elif nv == r["verdict"]:
            status, verdict = "preserved", REPRODUCED
        elif _real(nv):
            status, verdict = "reversed", NOT_REPRODUCED
        elif (np_ > 0) == (_real_diff(rp) > 0):
            status = "same sign, not significant"
            verdict = NOT_REPRODUCED if s.require_significance else REPRODUCED
        else:
            status, verdict = "opposite sign, not significant", NOT_REPRODUCED
        rows.append(
            {
                "server_config": r["server_config"],
                "a": r["a"],
                "b": r["b"],
                "metric": r["metric"],
                "reference_diff_pct": rp,
                "reference_agree": r["agree"],
                "reference_verdict": r["verdict"],
                "fresh_diff_pct": np_,
                "fresh_agree": n["agree"] if n is not None else None,
                "fresh_verdict": nv,
                "judged": is_judged,
                "status": status,
                "verdict": verdict if is_judged else None,
            }
        )
    return rows


def level_label(axis: str) -> Callable[[float], str]:
    """How orderings name a level: C8 for a concurrency, R2.5 for a request rate."""
    return (lambda v: f"R{v:g}") if axis == "rate" else (lambda v: f"C{v}")


def _sym(v: str | None) -> str:
    return {"a > b": ">", "a < b": "<"}.get(v or "", "~")


def chain_rows(ref: Analysed, new: Analysed) -> list[ChainRow]:
    """Adjacent levels as one line per config and metric: 'C64 < C128 > C256', or at request
    rates 'R1 < R2 > R4'."""
    out: list[ChainRow] = []
    reference, fresh = _by_pair(ref.paired), _by_pair(new.paired)
    name = level_label(ref.g.axis)
    for sc in ref.g.configs:
        lv = ref.g.levels(sc)
        if len(lv) < 2:
            continue
        for m in PAIRED_METRICS:
            rs, ns = name(lv[0]), name(lv[0])
            for a, b in zip(lv, lv[1:], strict=False):
                rr, nr = reference.get((sc, a, b, m)), fresh.get((sc, a, b, m))
                rs += f" {_sym(rr['verdict'] if rr else None)} {name(b)}"
                ns += f" {_sym(nr['verdict']) if nr else '?'} {name(b)}"
            out.append(
                {"server_config": sc, "metric": m, "reference": rs, "fresh": ns, "same": rs == ns}
            )
    return out


def claim_rows(
    ref: Analysed, new: Analysed, opts: AnalysisSection, claims: list[str]
) -> list[ClaimCheck]:
    """Each claim evaluated on both sides: reproduced when the fresh run gives the reference's
    verdict; not comparable without fresh data, or when either side is invalid or not
    comparable (configs measured on differing hosts), or the reference inconclusive."""
    rows: list[ClaimCheck] = []
    for claim in claims:
        try:
            rc = _claim(ref, opts, claim)
        except ServelabError as exc:
            raise ServelabError(f"reference claim {claim!r}: {exc}") from None
        try:
            nc = _claim(new, opts, claim)
            fresh_verdict: str | None = nc["verdict"]
            evidence: object = nc["evidence"]
            reason = None
        except ServelabError as exc:
            fresh_verdict, evidence, reason = None, None, str(exc)
        if fresh_verdict is None:
            verdict = NOT_COMPARABLE
        elif rc["verdict"] == "inconclusive":
            verdict, reason = NOT_COMPARABLE, "inconclusive in the reference"
        elif CLAIM_NOT_COMPARABLE in (rc["verdict"], fresh_verdict):
            side, c = (
                ("reference", rc) if rc["verdict"] == CLAIM_NOT_COMPARABLE else ("fresh run", nc)
            )
            why = str(c["reason"]).removeprefix(f"{CLAIM_NOT_COMPARABLE}: ")
            verdict, reason = NOT_COMPARABLE, f"{CLAIM_NOT_COMPARABLE} in the {side}: {why}"
        elif _invalid(rc["verdict"]):
            verdict, reason = NOT_COMPARABLE, f"invalid in the reference: {rc.get('reason')}"
        elif _invalid(fresh_verdict):
            verdict, reason = NOT_COMPARABLE, f"invalid in the fresh run: {nc.get('reason')}"
        else:
            verdict = REPRODUCED if fresh_verdict == rc["verdict"] else NOT_REPRODUCED
        rows.append(
            {
                "claim": claim,
                "reference_verdict": rc["verdict"],
                "fresh_verdict": fresh_verdict,
                "reference_evidence": rc["evidence"],
                "fresh_evidence": evidence,
                "verdict": verdict,
                "reason": reason,
            }
        )
    return rows
